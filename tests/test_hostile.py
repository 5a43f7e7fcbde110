"""Hostile archives through the real ``foundry`` command, one class of bad input at a time.

Each archive is a committed fixture or the bundled sample, tampered with and
re-sealed so every check before the one under test passes. A refusal must be
one line on stderr and exit status 2 (with ``--json``: one JSON object on stdout,
nothing else there), never a traceback, exit 70, a hang or a terminal's control
codes; a command that reads the archive must show its strings as text.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from foundry.archive.sample import sample_path
from foundry.archive.schema import CATALOG_FILE
from foundry.cli import main as foundry_main

from .archive_tools import edit_json, graph_file, reseal
from .conftest import FIXTURES
from .hostile import (
    CONTROL,
    HOSTILE,
    assert_clean_output,
    assert_refused,
    edit_document,
    first_kernel,
    hostile_names,
    saved_archive,
)

SAMPLE = sample_path()
RENAMED = "decode" + HOSTILE


def copy(tmp_path: Path, source: Path = SAMPLE, name: str = "archive") -> Path:
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


# -- 1, 2: markup and terminal escapes in archive strings ---------------------------------------


@pytest.fixture
def hostile(tmp_path) -> Path:
    return hostile_names(tmp_path / "hostile")


@pytest.mark.parametrize(
    ("command", "names_shown"),
    [
        (["archive", "inspect", "{a}"], True),
        (["graph", "show", "{a}", RENAMED], True),
        (["graph", "show", "{a}", "decode.bs2"], False),  # the kernel column is cut before the name's end
        (["archive", "diff", "{a}", "{sample}"], True),
        (["archive", "diff", "{sample}", "{a}"], True),
        (["graph", "lint", "{a}"], False),
        (["archive", "verify", "{a}"], False),
        (["graph", "export", "{a}", RENAMED, "--format", "dot"], True),
        (["graph", "export", "{a}", RENAMED, "--format", "graphml"], True),
    ],
    ids=lambda c: " ".join(c[:2] + c[-2:]) if isinstance(c, list) else "",
)
def test_markup_and_escapes_in_archive_strings_are_shown_as_text(cli, hostile, command, names_shown):
    outcome = cli.run(*(arg.format(a=hostile, sample=SAMPLE) for arg in command))
    assert_clean_output(outcome)  # exit 0 or 1, and not one control character on the terminal
    shown = outcome.stdout
    if names_shown:
        assert "[/][/bold]" in shown, shown[:3000]  # the markup, as text
        assert "\\x1b[2J" in shown and "\\x07" in shown and "\\u202e" in shown  # the escapes, escaped


def test_a_field_named_with_escapes_is_refused_in_one_line_without_them(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / CATALOG_FILE, lambda c: c.update({"\x1b[2J\x1b]0;all ok\x07" + "x": 1}))
    text = assert_refused(cli.run("archive", "inspect", path), match=r"unknown field")
    assert "\\x1b[2J" in text  # named, escaped
    as_json = cli.run("archive", "inspect", path, "--json")
    assert_refused(as_json, match="unknown field")
    assert "\x1b[2J" in json.loads(as_json.stdout)["error"]["message"]  # JSON keeps the text; it escapes it itself


def test_a_refusal_with_json_is_one_object_on_stdout_and_nothing_else(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / CATALOG_FILE, lambda c: c.update(world_size="one"))
    for command in (["archive", "inspect"], ["graph", "lint"], ["archive", "verify"]):
        outcome = cli.run(*command, path, "--json")
        assert_refused(outcome, match="Expected `int`, got `str`")
        assert json.loads(outcome.stdout)["error"]["field"] == "world_size"
    missing = cli.run("archive", "diff", tmp_path / "nowhere", SAMPLE, "--json")
    assert_refused(missing, match="no such archive")


def test_the_error_line_escapes_what_the_archive_wrote(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0].update(file=f"../{HOSTILE}"), root=path)
    line = assert_refused(cli.run("archive", "inspect", path), match="stay inside the archive")
    assert not CONTROL.search(line) and "[/][/bold]" in line


# -- 3: non-finite and out-of-range numbers ---------------------------------------------------------


def _window(base_ptr: object = 0x7F0000001000, hit_ratio: object = 0.5) -> list:
    return ["access_policy_window", {"base_ptr": base_ptr, "num_bytes": 4096, "hit_ratio": hit_ratio, "hit_prop": 1,
                                     "miss_prop": 0}]  # fmt: skip


def _with_window(window: list):
    """Node 0 gets an access policy window, and the operand manifest its pointer (as lowering records it)."""

    def edit(d: dict) -> None:
        first_kernel(d)["launch"]["attributes"].append(window)
        columns = d["operands"]
        for name, value in (("node", 0), ("site", "attr.access_policy_window"), ("param", -1), ("offset", 0),
                            ("value", 0x7F0000001000), ("region", -1), ("region_offset", 0)):  # fmt: skip
            columns[name].insert(0, value)

    return edit


def _memset_of_3_byte_elements(d: dict) -> None:
    d["nodes"][1] = {"type": "memset", "id": 1, "dst": 4096, "value": 0, "element_size": 3, "width": 8}


def _unknown_attribute(d: dict) -> None:
    first_kernel(d)["launch"]["attributes"].append(["launch_completion_event", 1])


NUMBERS = {
    "nan address": (_with_window(_window(base_ptr=float("nan"))), r"access_policy_window"),
    "infinite hit ratio": (_with_window(_window(hit_ratio=float("inf"))), r"access_policy_window"),
    "float address": (_with_window(_window(base_ptr=1.5e12)), r"access_policy_window"),
    "negative operand": (lambda d: d["operands"]["value"].__setitem__(0, -8), r"operands\.value"),
    "region past 2^63": (lambda d: d["regions"][0].update(base=1 << 63), r"regions\[0\]\.base"),
    "grid of 0": (lambda d: first_kernel(d)["launch"].update(grid=[0, 1, 1]), r"launch\.grid"),
    "memset of 3-byte elements": (_memset_of_3_byte_elements, r"element_size"),
    "edge port 300": (lambda d: d["edges"][0].__setitem__(2, [300, 0, 0]), r"edges\[0\]"),
    "unknown attribute": (_unknown_attribute, "unknown launch attribute"),
}
READERS = [
    ["archive", "inspect"],
    ["archive", "verify"],
    ["graph", "lint"],
    ["graph", "show", "{path}", "decode.bs1"],
    ["graph", "export", "{path}", "decode.bs1", "--format", "graphml"],
    ["archive", "diff", "{path}", str(SAMPLE)],
    ["archive", "diff", str(SAMPLE), "{path}"],
]


def _argv(command: list[str], path: Path) -> list[str]:
    return [a.format(path=path) for a in command] if "{path}" in command else [*command, str(path)]


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_non_finite_and_out_of_range_numbers_are_refused_by_field(cli, tmp_path, case):
    edit, field = NUMBERS[case]
    path = copy(tmp_path)
    edit_document(path, "decode.bs1", edit)
    for command in READERS:
        assert_refused(cli.run(*_argv(command, path)), match=field)
    assert_refused(cli.run("archive", "verify", path, "--json"), match=field)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda s: s["region"].update(base=-4096), "region.base"),
        (lambda s: s["region"].update(final_offset=1.5), "region.final_offset"),
        (lambda s: s["region"].update(size=1 << 70), "region.size"),
        (lambda s: s["region"]["trace"][0].__setitem__(4, "later"), r"region.trace\[0\]"),
        (lambda s: s["graphs"][0].update(shape_key=1 << 64), r"graphs\[0\].shape_key"),
        (lambda s: s["backends"].append({"backend": "vmm", "version": 1 << 40, "record": {}}), r"backends\[0\]"),
    ],
)  # fmt: skip
def test_out_of_range_session_numbers_are_refused_by_field(cli, tmp_path, edit, field):
    path = copy(tmp_path, FIXTURES / "saveload-a")
    edit_json(path / "rank0" / "session.json", edit, root=path)
    for command in (["archive", "inspect"], ["archive", "verify"], ["graph", "lint"]):
        assert_refused(cli.run(*command, path), match=field)


# -- 4, 12: undefined runs and structure LOAD could not honour ----------------------------------------


def _undefined(runs: list) -> Callable[[dict], None]:
    return lambda d: first_kernel(d).update(undefined=runs)


def _last_kernel(d: dict) -> dict:
    return next(n for n in reversed(d["nodes"]) if n["type"] == "kernel")


def _operands_reversed(d: dict) -> None:
    d["operands"] = {name: column[::-1] for name, column in d["operands"].items()}  # rows whole, order broken


def _first_memset_or_memcpy(d: dict, kind: str) -> dict:
    return next(n for n in d["nodes"] if n["type"] == kind)


def _cross_regions(d: dict) -> None:
    """Move a region so it starts inside another and ends beyond it (the sample nests weights in allocations)."""
    regions = sorted(d["regions"], key=lambda r: r["base"])
    a, b = regions[0], regions[1]
    b["base"] = a["base"] + a["size"] // 2
    b["size"] = a["size"]


STRUCTURE = {
    "negative undefined offset": (_undefined([[-5, 10]]), r"undefined"),
    "undefined run of 2^40 bytes": (_undefined([[0, 1 << 40]]), r"undefined"),
    "undefined run of 2^30 bytes": (_undefined([[0, 1 << 30]]), r"undefined bytes must be ordered runs inside"),
    "undefined run past the buffer": (_undefined([[660, 16]]), r"undefined bytes must be ordered runs inside"),
    "undefined runs out of order": (_undefined([[16, 4], [8, 4]]), r"undefined bytes must be ordered runs inside"),
    "empty undefined run": (_undefined([[8, 0]]), r"undefined bytes must be ordered runs inside"),
    "undefined run past a later kernel's buffer": (  # after kernels of the same layout passed
        lambda d: _last_kernel(d).update(undefined=[[0, 1 << 20]]),
        r"undefined bytes must be ordered runs inside",
    ),
    "edge of an unknown type": (lambda d: d["edges"][0].__setitem__(2, [0, 0, 2]), r"has unknown type 2"),
    "operands out of node order": (_operands_reversed, r"operands are not ordered by node"),
    "operand in a region past the list": (
        lambda d: d["operands"]["region"].__setitem__(-1, len(d["regions"])),
        r"operand region index out of range",
    ),
    "self-loop": (lambda d: d["edges"].append([5, 5, [0, 0, 0]]), r"depend on itself"),
    "cycle": (lambda d: d["edges"].append([3, 1, [0, 0, 0]]), r"form a cycle"),
    "region of size 0": (lambda d: d["regions"][0].update(size=0), r"regions\[0\]\.size"),
    "negative region": (lambda d: d["regions"][0].update(base=-4096), r"regions\[0\]\.base"),
    "crossing regions": (_cross_regions, r"overlaps region .* without nesting"),
    "params shorter than the layout": (
        lambda d: first_kernel(d).update(params=first_kernel(d)["params"][:-8]),
        "parameter bytes do not match the layout",
    ),
    "overlapping parameters": (
        lambda d: first_kernel(d)["layout"]["offsets"].__setitem__(1, 100),
        "overlaps parameter",
    ),
}
MEMSETS = {
    "memset of no elements": (lambda n: n.update(width=0), "at least one element"),
    "memset pitch shorter than a row": (lambda n: n.update(height=4, pitch=2), "pitch is shorter than a row"),
    "memset past the address space": (lambda n: n.update(dst=(1 << 63) - 8, height=1 << 62, pitch=64), "past the end"),
}
MEMCPYS = {
    "memcpy of no bytes": (lambda n: n.update(extent=[0, 1, 1]), "extent must be at least one byte"),
    "memcpy pitch shorter than a row": (
        lambda n: n.update(extent=[8192, 2, 1], src_pitch=16, dst_pitch=8192),
        "src pitch is shorter than a row",
    ),
    "memcpy slice taller than its height": (
        lambda n: n.update(extent=[64, 2, 2], src_pitch=64, dst_pitch=64, src_height=2, dst_height=1),
        "dst height is shorter than a slice",
    ),
}


@pytest.mark.parametrize("case", sorted(STRUCTURE))
def test_structure_load_could_not_honour_is_refused_by_every_reader(cli, tmp_path, case):
    edit, message = STRUCTURE[case]
    path = copy(tmp_path)
    edit_document(path, "decode.bs1", edit)
    for command in READERS:
        outcome = cli.run(*_argv(command, path))
        assert_refused(outcome, match=message)
        assert outcome.maxrss_kib < 300 << 10, f"{outcome.maxrss_kib} KiB to refuse it"
    assert_refused(cli.run("archive", "verify", path, "--json"), match=message)


@pytest.mark.parametrize("case", sorted(MEMSETS) + sorted(MEMCPYS))
def test_malformed_copies_and_sets_are_refused_by_every_reader(cli, tmp_path, case):
    edit, message = {**MEMSETS, **MEMCPYS}[case]
    source = FIXTURES / "symm-mem-ws1"  # a real graph with a memcpy; its memset made from the first kernel
    path = copy(tmp_path, source)
    name = "symm.allreduce"

    def tamper(d: dict) -> None:
        if case in MEMSETS:
            d["nodes"][0] = {"type": "memset", "id": 0, "dst": 1 << 40, "value": 0, "element_size": 4, "width": 16}
            d["operands"] = {k: [v for v, n in zip(col, d["operands"]["node"], strict=True) if n != 0]
                             for k, col in d["operands"].items()}  # fmt: skip
            edit(d["nodes"][0])
        else:
            edit(_first_memset_or_memcpy(d, "memcpy"))

    edit_document(path, name, tamper)
    for command in READERS:
        assert_refused(cli.run(*(a.replace("decode.bs1", name) for a in _argv(command, path))), match=message)


def test_an_operand_outside_its_region_is_named_with_both_values(cli, tmp_path):
    path = copy(tmp_path)

    def beyond(d: dict) -> None:
        columns, regions = d["operands"], d["regions"]
        i = next(i for i, r in enumerate(columns["region"]) if r >= 0)
        region = regions[columns["region"][i]]
        columns["region_offset"][i] = region["size"] + 0x200
        columns["value"][i] = region["base"] + region["size"] + 0x200
        node = d["nodes"][columns["node"][i]]
        offset = columns["offset"][i]
        node["params"] = (
            node["params"][:offset] + columns["value"][i].to_bytes(8, "little") + node["params"][offset + 8 :]
        )

    edit_document(path, "decode.bs1", beyond)
    text = assert_refused(cli.run("archive", "verify", path), match="outside its region")
    expected, found = re.search(r"expected '(.*?)', found '(.*?)'", text).groups()
    assert expected != found, text


# -- 5: verify packs launch plans only from checked values ------------------------------------------

PLANNED = FIXTURES / "sglang-decode"  # SGLang's decode graphs as SAVEd on the H200 test machine, with launch plans


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: first_kernel(d)["launch"].update(grid=[1 << 40, 1, 1]), r"launch\.grid"),
        (lambda d: first_kernel(d)["launch"].update(shared_mem=-1), r"launch\.shared_mem"),
        (lambda d: d["edges"][0].__setitem__(2, [300, 0, 0]), r"edges\[0\]"),
        (
            lambda d: first_kernel(d)["launch"]["attributes"].append(["programmatic_event", 1]),
            "unknown launch attribute",
        ),
        (lambda d: first_kernel(d)["func_attrs"].append(["bogus", 1]), r"func_attrs\[0\]"),
    ],
)
def test_verify_refuses_plan_inputs_out_of_range_before_packing(cli, tmp_path, edit, field):
    path = copy(tmp_path, PLANNED)
    edit_document(path, "decode.bs1", edit)
    assert_refused(cli.run("archive", "verify", path), match=field)
    assert_refused(cli.run("archive", "verify", path, "--json"), match=field)


def test_verify_refuses_an_unknown_function_attribute_in_a_plan_table(cli, tmp_path):
    path = copy(tmp_path, PLANNED)
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0]["plan"]["kernels"][0][2].append(["bogus", 1]),
              root=path)  # fmt: skip
    assert_refused(cli.run("archive", "verify", path), match=r"plan\.kernels\[0\]")


def test_verify_still_compares_plans(cli, tmp_path):
    path = copy(tmp_path, PLANNED)
    assert cli.run("archive", "verify", path).rc == 0
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0]["plan"]["kernels"].reverse(), root=path)
    outcome = cli.run("archive", "verify", path, "--json")
    assert outcome.rc == 1 and json.loads(outcome.stdout)["plan_mismatches"][0]["graph"] == "decode.bs8"


# -- 6: a declared size is compared with the file's before anything is read ---------------------------


def test_a_plan_declared_at_2_62_bytes_is_refused_unread(cli, tmp_path):
    path = copy(tmp_path, PLANNED)
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0]["plan"].update(size=1 << 62), root=path)
    outcome = cli.run("archive", "verify", path)
    assert_refused(outcome, match="launch plan is larger than the reader accepts")
    assert outcome.maxrss_kib < 300 << 10


def test_a_plan_file_larger_than_a_graph_may_be_is_refused_unread(cli, tmp_path):
    path = copy(tmp_path, PLANNED)
    plan = path / "rank0" / "plans" / "decode.bs8.fgb"
    with open(plan, "r+b") as f:
        f.truncate(3 << 30)  # sparse: 3 GiB claimed, its record updated to match
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0]["plan"].update(size=3 << 30), root=path)
    outcome = cli.run("archive", "verify", path)
    assert_refused(outcome, match="launch plan is larger than the reader accepts")
    assert outcome.maxrss_kib < 300 << 10


def test_a_graph_whose_entry_declares_another_size_is_refused_unread(cli, tmp_path):
    path = copy(tmp_path)
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0].update(size=1 << 40), root=path)
    for command in READERS:
        assert_refused(cli.run(*_argv(command, path)), match="(size differs|larger than the reader accepts)")
    path = copy(tmp_path, name="grown")
    with open(graph_file(path, "decode.bs1"), "r+b") as f:
        f.truncate(1536 << 20)  # sparse: 1.5 GiB under a session entry that records the real size
    outcome = cli.run("archive", "inspect", path)
    assert_refused(outcome, match="(size differs|larger than the reader accepts)")
    assert outcome.maxrss_kib < 300 << 10, f"{outcome.maxrss_kib} KiB: the file was read before its size was compared"


# -- 8: verify checks the warm-up bytes ---------------------------------------------------------------


def _warm(path: Path) -> Path:
    return path / "rank0" / "warmup.bin"


WARMUP_CASES = {
    "altered": (lambda p: _warm(p).write_bytes(b"\xff" + _warm(p).read_bytes()[1:]), "does not match its record"),
    "longer": (lambda p: _warm(p).write_bytes(_warm(p).read_bytes() + b"x"), "not the size its record says"),
    "missing": (lambda p: _warm(p).unlink(), "warm-up bytes is missing"),
    "a link": (lambda p: (_warm(p).unlink(), _warm(p).symlink_to("session.json")), "symbolic link"),
    "a link out": (lambda p: (_warm(p).unlink(), _warm(p).symlink_to("/etc/passwd")), "path leaves the archive"),
    "a directory": (lambda p: (_warm(p).unlink(), _warm(p).mkdir()), "not a regular file"),
}


def test_warm_up_bytes_declared_at_2_62_bytes_are_refused_unread(cli, tmp_path):
    path = saved_archive(tmp_path / "saved")
    edit_json(path / "rank0" / "session.json", lambda s: s["region"]["warmup_bytes"].update(size=1 << 62), root=path)
    outcome = cli.run("archive", "verify", path)
    assert_refused(outcome, match="warm-up bytes")
    assert outcome.maxrss_kib < 300 << 10


def test_the_saved_archive_verifies(cli, tmp_path):
    outcome = cli.run("archive", "verify", saved_archive(tmp_path / "saved"), "--json")
    assert outcome.rc == 0 and json.loads(outcome.stdout)["warmup_files"] == 1, str(outcome)


@pytest.mark.parametrize("case", sorted(WARMUP_CASES))
def test_verify_checks_the_warm_up_bytes(cli, tmp_path, case):
    tamper, message = WARMUP_CASES[case]
    path = saved_archive(tmp_path / "saved")
    tamper(path)
    assert_refused(cli.run("archive", "verify", path), match=message)
    assert_refused(cli.run("archive", "verify", path, "--json"), match=message)


@pytest.mark.parametrize("hostile_path", ["../../etc/passwd", "/etc/passwd", "../session.json"])
def test_a_warm_up_path_leaving_the_rank_is_refused_by_every_reader(cli, tmp_path, hostile_path):
    path = saved_archive(tmp_path / "saved")
    edit_json(path / "rank0" / "session.json", lambda s: s["region"]["warmup_bytes"].update(file=hostile_path),
              root=path)  # fmt: skip
    for command in (["archive", "inspect"], ["archive", "verify"], ["graph", "lint"]):
        assert_refused(cli.run(*command, path), match=r"region\.warmup_bytes\.file")


# -- 7: archive diff reads and checks what it compares -------------------------------------------------


def _fifo(path: Path) -> None:
    target = graph_file(path, "decode.bs2")
    target.unlink()
    os.mkfifo(target)


DIFF_CASES = {
    "missing graph": (lambda p: graph_file(p, "decode.bs2").unlink(), "graph 'decode.bs2' is missing"),
    "fifo": (_fifo, "not a regular file"),
    "garbage, re-sealed": (lambda p: (graph_file(p, "decode.bs2").write_bytes(b"\x93garbage"), reseal(p)),
                           "decode.bs2.msgpack"),
    "session unreadable": (lambda p: (p / "rank0" / "session.json").write_text("{}"), "session does not match"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
def test_diff_refuses_an_archive_it_cannot_read_naming_the_part(cli, tmp_path, case):
    damage, where = DIFF_CASES[case]
    path = copy(tmp_path)
    damage(path)
    for argv in (["archive", "diff", path, SAMPLE], ["archive", "diff", SAMPLE, path], ["archive", "diff", path, path]):
        assert_refused(cli.run(*argv), match=where)
        assert_refused(cli.run(*argv, "--json"), match=where)


def test_diff_sees_a_graph_changed_under_a_stale_fingerprint(cli, tmp_path):
    path = copy(tmp_path)

    def change(d: dict) -> None:
        first_kernel(d)["launch"]["grid"][0] += 1

    edit_document(path, "decode.bs2", change, seal=False)
    reseal(path, fingerprints=False)  # sizes and sha256s as a SAVE would write them; the old fingerprint kept
    outcome = cli.run("archive", "diff", SAMPLE, path, "--json")
    assert outcome.rc == 1, str(outcome)
    graphs = {g["graph"]: g for g in json.loads(outcome.stdout)["graphs"]}
    assert graphs["decode.bs2"]["status"] == "changed" and not json.loads(outcome.stdout)["identical"]
    assert [c["field"] for n in graphs["decode.bs2"]["nodes"] for c in n["changes"]] == ["grid"]
    assert cli.run("archive", "diff", SAMPLE, SAMPLE).rc == 0  # the same archive twice is still identical


# -- 14: no internal error from any command on bad input ----------------------------------------------


def _leaf_commands() -> dict[tuple[str, ...], click.Command]:
    """Every command of the ``foundry`` group, by its words: a new command is checked here too."""

    def walk(command: click.Command, words: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], click.Command]]:
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                yield from walk(sub, (*words, name))
        else:
            yield words, command

    return dict(walk(foundry_main, ()))


def _command_argv(words: tuple[str, ...], command: click.Command, archive: Path) -> list[str] | None:
    """``words`` with every required parameter filled, each archive one being ``archive``;
    None for a command that reads no archive."""
    argv, reads = list(words), False
    for param in command.params:
        if isinstance(param, click.Argument) and param.nargs == -1:  # foundry run's program
            continue
        if not param.required:
            continue
        if param.name in ("path", "a", "b", "archive", "archive_arg"):
            value, reads = str(archive), True
        elif param.name == "name":
            value = "decode.bs1"
        elif param.name == "mode":
            value = "load"  # a SAVE runs its program: not a reader of archives
        elif param.name == "root":  # archive jit-caches --into: where a good archive's caches would go
            value = str(archive.parent / "jit-caches-into")
        elif isinstance(param.type, click.Choice):
            value = str(param.type.choices[0])
        else:
            raise AssertionError(f"foundry {' '.join(words)}: no bad input known for {param.name!r}: add one here")
        argv += [param.opts[0], value] if isinstance(param, click.Option) else [value]
    if words == ("run",):
        argv += ["--", "true"]
    return argv if reads else None


def _fifo(path: Path) -> None:
    os.mkfifo(path)


BAD_ARCHIVES: dict[str, Callable[[Path], Path]] = {
    "no such path": lambda p: p / "missing",
    "a regular file": lambda p: (p / "file").write_text("not an archive\n") and p / "file",
    "an empty directory": lambda p: (p / "empty").mkdir() or p / "empty",
    "a catalog that is a FIFO": lambda p: _bad_catalog(p, _fifo),
    "a catalog that is a directory": lambda p: _bad_catalog(p, lambda c: c.mkdir()),
    "a catalog that is a link": lambda p: _bad_catalog(p, lambda c: c.symlink_to(SAMPLE / CATALOG_FILE)),
    "a catalog of binary garbage": lambda p: _bad_catalog(p, lambda c: c.write_bytes(b"\xff\xfe\x00\x1b[2J" * 64)),
    "a catalog that is JSON null": lambda p: _bad_catalog(p, lambda c: c.write_text("null")),
    "a catalog that is a JSON list": lambda p: _bad_catalog(p, lambda c: c.write_text("[1, 2]")),
    "a catalog cut short": lambda p: _bad_catalog(p, lambda c: c.write_bytes((SAMPLE / CATALOG_FILE).read_bytes()[:9])),
    "a session removed": lambda p: (copy(p) / "rank0" / "session.json").unlink() or p / "archive",
    "a graph file cut short": lambda p: _cut(copy(p)),
}  # fmt: skip


def _bad_catalog(tmp: Path, make: Callable[[Path], object]) -> Path:
    path = copy(tmp)
    (path / CATALOG_FILE).unlink()
    make(path / CATALOG_FILE)
    return path


def _cut(path: Path) -> Path:
    target = graph_file(path, "decode.bs1")
    target.write_bytes(target.read_bytes()[:1000])
    return path


def test_every_command_is_checked_for_bad_input():
    """The commands below are the group's: one that reads an archive and is not covered fails here."""
    readers = {words for words, command in _leaf_commands().items() if _command_argv(words, command, SAMPLE)}
    assert readers >= {("archive", "inspect"), ("archive", "diff"), ("archive", "verify"), ("archive", "strip"),
                       ("archive", "jit-caches"), ("graph", "lint"), ("graph", "show"), ("graph", "export"),
                       ("run",)}  # fmt: skip


@pytest.mark.parametrize("bad", sorted(BAD_ARCHIVES))
def test_no_command_answers_bad_input_with_an_internal_error(cli, tmp_path, bad):
    """Every command that reads an archive, given one that cannot be read, refuses it in one line
    (one JSON object with ``--json``) and exit 2: never exit 70, a traceback or a hang."""
    for words, command in _leaf_commands().items():
        for flags in ([], ["--json"]) if any(p.name == "as_json" for p in command.params) else ([],):
            where = tmp_path / "-".join(words) / ("json" if flags else "text")
            where.mkdir(parents=True)
            argv = _command_argv(words, command, BAD_ARCHIVES[bad](where))
            if argv is None:
                continue
            head, tail = (argv[: argv.index("--")], argv[argv.index("--") :]) if "--" in argv else (argv, [])
            outcome = cli.run(*head, *flags, *tail, timeout=60)
            if (words, bad) in UNREAD:
                assert_clean_output(outcome)
            else:
                assert_refused(outcome)


#: What a command does not read, so that it may succeed on it: strip rewrites the catalog and
#: sessions and removes module images, never reading a graph.
UNREAD = {(("archive", "strip"), "a graph file cut short")}


def _wrong_flags(command: click.Command, how: str) -> list[str] | None:
    """Flags ``command`` must refuse, or None where it has none of the kind (``foundry run`` hands
    options it does not know to its program)."""
    integers = [p for p in command.params if isinstance(p, click.Option) and isinstance(p.type, click.IntRange)]
    if how == "an unknown option":
        return None if command.context_settings.get("ignore_unknown_options") else ["--no-such-flag"]
    if how == "an unknown option with --json":
        return ["--json", "--no-such-flag"] if any(p.name == "as_json" for p in command.params) else None
    if not integers:
        return None
    value = "one" if how == "an integer that is not one" else str(integers[0].type.min - 1)
    return [f"{integers[0].opts[0]}={value}"]


@pytest.mark.parametrize("how", ["an unknown option", "an unknown option with --json", "an integer out of range",
                                 "an integer that is not one"])  # fmt: skip
def test_no_command_answers_wrong_flags_with_more_than_one_line(cli, how):
    """A usage error is a refusal like any other: one line on stderr (one JSON object on stdout with
    ``--json``), exit 2; click's own form of it is four lines."""
    checked = 0
    for words, command in _leaf_commands().items():
        flags = _wrong_flags(command, how)
        if flags is None:
            continue
        argv = _command_argv(words, command, SAMPLE) or list(words)
        head, tail = (argv[: argv.index("--")], argv[argv.index("--") :]) if "--" in argv else (argv, [])
        outcome = cli.run(*head, *flags, *tail)
        text = assert_refused(outcome)
        assert "Usage:" not in outcome.stderr + outcome.stdout and "--help" in text, str(outcome)
        checked += 1
    assert checked >= 5
