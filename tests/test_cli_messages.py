"""What the ``foundry`` command tells a newcomer: usage errors in one line (or one JSON
object), refusals that name what does exist, help texts that match the code, and output
that keeps every cell. Every command runs in a real child process (:mod:`tests.hostile`)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

from foundry.archive import Archive
from foundry.archive.sample import sample_path
from foundry.cli import main as foundry_group
from foundry.inspect.lint import RULES
from foundry.inspect.render import node_rows

from .conftest import FIXTURES
from .hostile import assert_refused

SAMPLE_GRAPHS = ("decode.bs1", "decode.bs2", "decode.bs4")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# -- the error channel ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (("inspect", "@sample"), r"no command 'inspect'; did you mean `foundry archive inspect`\?"),
        (("lint", "@sample"), r"did you mean `foundry graph lint`\?"),
        (("archive", "inspct", "@sample"), r"foundry archive: no such command 'inspct'.*'inspect'"),
        (("graph", "lint", "@sample", "--bogus"), r"foundry graph lint: no such option '--bogus' \(see `foundry graph"),
        (("graph", "show", "@sample"), r"missing argument 'GRAPH'"),
        (("archive", "inspect", "@sample", "--top", "0"), r"--top"),
        (("run", "--mode", "fast", "--archive", "a", "--", "true"), r"'fast' is not one of 'save', 'load'"),
    ],
)
def test_usage_errors_are_one_line_on_stderr_and_exit_2(cli, argv, match):
    assert_refused(cli.run(*argv), match)


@pytest.mark.parametrize(
    "argv",
    [
        ("archive", "inspct", "@sample", "--json"),
        ("graph", "lint", "@sample", "--bogus", "--json"),
        ("inspect", "@sample", "--json"),
        ("graph", "lint", "@sample", "--expect", "kernel", "--json"),
    ],
)
def test_usage_errors_with_json_are_one_object_on_stdout(cli, argv):
    text = assert_refused(cli.run(*argv))  # one JSON object, nothing on stderr, exit 2
    assert text


def test_a_group_without_its_command_shows_its_help(cli):
    for argv in ((), ("archive",), ("graph",)):
        shown = cli.run(*argv)
        assert shown.rc == 0 and shown.stdout.startswith("Usage: foundry") and shown.stderr == "", shown


# -- refusals that name what exists -------------------------------------------------------------


def test_an_unknown_graph_is_refused_with_the_graphs_there_are(cli):
    text = assert_refused(cli.run("graph", "show", "@sample", "nosuch"), "rank 0 has no graph 'nosuch'")
    assert all(name in text for name in SAMPLE_GRAPHS)
    near = assert_refused(cli.run("graph", "export", "@sample", "decode.bs3", "--format", "dot"))
    assert "did you mean 'decode.bs" in near
    rank = assert_refused(cli.run("graph", "show", "@sample", "decode.bs1", "--rank", "3"), "no rank 3")
    assert "ranks: 0" in rank


def test_a_glob_that_matches_nothing_lists_the_graphs(cli):
    text = assert_refused(cli.run("graph", "lint", "@sample", "--graph", "nomatch*"))
    assert "no graph matches --graph 'nomatch*'" in text and all(name in text for name in SAMPLE_GRAPHS)
    assert "{" not in text  # no Python dict echoed back
    data = json.loads(cli.run("graph", "lint", "@sample", "--graph", "nomatch*", "--json").stdout)
    assert data["error"]["field"] == "--graph" and data["error"]["found"] == "nomatch*"


def test_a_misspelt_kind_or_rule_gets_the_intended_one(cli):
    kind = assert_refused(cli.run("graph", "lint", "@sample", "--expect", "kernal=155"))
    assert "did you mean 'kernel'?" in kind and len(kind) < 300 and "symm-reducescatter" not in kind
    rule = assert_refused(cli.run("graph", "lint", "@sample", "--disable", "unresolved-pointers"))
    assert "did you mean 'unresolved-pointer'?" in rule


def test_a_directory_without_a_catalog_is_not_an_archive(cli, tmp_path):
    empty = tmp_path / "emptydir"
    empty.mkdir()
    for argv in (("archive", "inspect", empty), ("graph", "lint", empty), ("archive", "verify", empty),
                 ("archive", "strip", empty), ("archive", "diff", empty, "@sample")):  # fmt: skip
        assert_refused(cli.run(*argv), r"not a Foundry archive: no foundry-archive\.json in it")


def test_the_sample_works_wherever_an_archive_is_read(cli):
    for argv in (("archive", "inspect", "@sample"), ("archive", "verify", "@sample"), ("graph", "lint", "@sample"),
                 ("graph", "show", "@sample", "decode.bs1"), ("archive", "diff", "@sample", "@sample"),
                 ("graph", "export", "@sample", "decode.bs1", "--format", "dot")):  # fmt: skip
        outcome = cli.run(*argv)
        assert outcome.rc == 0 and "no such archive" not in outcome.stderr, outcome
    # a LOAD reads it, and refuses it for what it is (captured without the hook), not as missing
    load = assert_refused(cli.run("run", "--mode", "load", "--archive", "@sample", "--", sys.executable, "-c", "1"))
    assert "no such archive" not in load and "saved with the hook" in load


def test_commands_that_change_an_archive_refuse_the_sample(cli):
    before = sorted(p.name for p in sample_path().rglob("*"))
    strip = assert_refused(cli.run("archive", "strip", "@sample"), "would change the sample shipped in the package")
    assert "copy it first" in strip
    assert_refused(cli.run("run", "--mode", "save", "--archive", "@sample", "--", "true"), "would change the sample")
    assert sorted(p.name for p in sample_path().rglob("*")) == before


def test_output_into_a_missing_directory_is_refused(cli, tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "g.dot"
    assert_refused(cli.run("graph", "export", "@sample", "decode.bs1", "--format", "dot", "-o", target),
                   "directory to write into does not exist")  # fmt: skip
    assert not (tmp_path / "no").exists()
    written = cli.run("graph", "export", "@sample", "decode.bs1", "--format", "dot", "-o", tmp_path / "g.dot")
    assert written.rc == 0 and (tmp_path / "g.dot").read_text().startswith("digraph")


# -- help texts match the code ---------------------------------------------------------------------


def test_every_group_help_names_its_commands(cli):
    for name, group in foundry_group.commands.items():
        subcommands = getattr(group, "commands", {})
        if subcommands:
            shown = cli.run(name, "--help")
            listed = shown.stdout.split("Commands:")[0]  # the group's own sentence
            assert all(sub in listed for sub in subcommands), (name, sorted(subcommands), listed)


def test_lint_help_names_every_rule_and_verify_its_exit_codes(cli):
    lint = " ".join(cli.run("graph", "lint", "--help").stdout.split())
    assert all(f"{name}:" in lint for name in RULES), lint
    verify = " ".join(cli.run("archive", "verify", "--help").stdout.split())
    assert "Exits 0" in verify and "1 when a fingerprint or launch plan differs" in verify and "2 when" in verify
    assert "exit 2" in " ".join(cli.run("--help").stdout.split())


# -- lint --strict and --quiet ---------------------------------------------------------------------


def test_strict_says_the_warnings_failed_the_run(cli):
    plain = cli.run("graph", "lint", "@sample")
    assert plain.rc == 0 and plain.stdout.strip().endswith("— clean")
    strict = cli.run("graph", "lint", "@sample", "--strict")
    assert strict.rc == 1 and strict.stdout.strip().splitlines()[-1].endswith(
        "— FAILED (--strict: the warnings fail the run)"
    )


def test_quiet_prints_only_what_fails_and_the_summary(cli, archive_copy):
    noisy = cli.run("graph", "lint", "@sample", "--expect", "kernel=155", "--expect", "memset=0")
    quiet = cli.run("graph", "lint", "@sample", "--expect", "kernel=155", "--expect", "memset=0", "--quiet")
    assert quiet.rc == noisy.rc == 0
    assert len(noisy.stdout.splitlines()) > 1 and quiet.stdout.splitlines() == noisy.stdout.splitlines()[-1:]
    failing = cli.run("graph", "lint", "@sample", "--expect", "kernel=155", "--expect", "kernel=1", "-q")
    lines = failing.stdout.splitlines()
    assert failing.rc == 1 and len(lines) == 4 and all(line.startswith("FAIL kernel=1") for line in lines[:3])
    strict = cli.run("graph", "lint", "@sample", "--strict", "--quiet").stdout.splitlines()
    assert len(strict) == 4 and all(line.startswith("warning missing-module-image") for line in strict[:3])


# -- graph show keeps every cell ----------------------------------------------------------------------


def _expected_cells(archive: Path, name: str) -> list[tuple[str, str]]:
    rows = node_rows(Archive.open(archive).graph(0, name))
    return [(str(r.get("kernel", "")), ", ".join(r["operands"])) for r in rows]


def test_graph_show_piped_prints_every_column_in_full(cli):
    shown = cli.run("graph", "show", FIXTURES / "tiny-qwen3", "decode.bs1")
    assert shown.rc == 0 and "…" not in shown.stdout
    lines = [line for line in shown.stdout.splitlines() if line.startswith("│")]
    expected = _expected_cells(FIXTURES / "tiny-qwen3", "decode.bs1")
    assert len(lines) == len(expected)  # one line per node: nothing folded
    for line, (kernel, operands) in zip(lines, expected, strict=True):
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[2] == (kernel or "-") and cells[7] == (operands or "-")


def _terminal(argv: list[str], columns: int) -> str:
    """``foundry ARGV`` in a pseudo-terminal of ``columns`` columns; what it printed."""
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "foundry", *argv], env=env, dimensions=(50, columns),
                          encoding="utf-8", timeout=60)  # fmt: skip
    text = child.read()
    child.close()
    assert child.exitstatus == 0, text
    return ANSI.sub("", text).replace("\r", "")


@pytest.mark.parametrize("columns", [60, 130])
def test_graph_show_in_a_terminal_wraps_and_drops_nothing(columns):
    text = _terminal(["graph", "show", str(FIXTURES / "symm-mem-ws1"), "symm.allreduce"], columns)
    assert "…" not in text and all(len(line) <= columns for line in text.splitlines())
    expected = _expected_cells(FIXTURES / "symm-mem-ws1", "symm.allreduce")
    if columns >= 120:  # a table: each node's cells, folded over its lines, read back column by column
        rows: list[list[str]] = []
        for line in text.splitlines():
            if line.startswith("│"):
                cells = [c.strip() for c in line.strip("│").split("│")]
                if cells[0]:
                    rows.append([cells[2], cells[7]])
                else:
                    rows[-1] = [rows[-1][0] + cells[2], rows[-1][1] + " " + cells[7]]
        found = [(k, " ".join(o.split())) for k, o in rows]
        assert found == [(k or "-", o or "-") for k, o in expected]
    else:  # too narrow for the table: one block per node, wrapped, every character kept
        flat = "".join(text.split())
        for kernel, operands in expected:
            assert "".join(kernel.split()) in flat and "".join(operands.split()) in flat


def test_version_says_whether_the_hook_is_built(cli):
    shown = cli.run("--version")
    said = r"native hook: (/\S+/libfoundry_hook\.so|not built; run `make -C /\S+/native` .*)"
    assert shown.rc == 0 and re.fullmatch(rf"foundry, version \S+; {said}\n", shown.stdout), shown


def test_a_file_given_as_an_archive_is_refused_in_one_line(cli, tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert_refused(cli.run("archive", "inspect", afile), "an archive is a directory")


# A Python without msgspec cannot be made in this environment (it is installed): a finder put
# first on the child's import path refuses it, as a Python that lacks it would.
WITHOUT_MSGSPEC = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "msgspec":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Absent())
sys.argv = ["foundry", *sys.argv[1:]]
from foundry.cli import main
main()
"""


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_a_missing_dependency_is_named_not_reported_as_a_bug(json_flag):
    import subprocess

    from .hostile import Outcome

    argv = ("archive", "inspect", "@sample", *json_flag)
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MSGSPEC, *argv], capture_output=True, text=True, timeout=60)
    text = assert_refused(Outcome(argv, proc.returncode, proc.stdout, proc.stderr))
    assert "msgspec" in text and "please report" not in text
    if not json_flag:
        assert "has no module msgspec, which this command needs" in text and sys.executable in text
