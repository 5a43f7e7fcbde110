"""The SAVE/LOAD runtime's CPU side, on the SAVE/SAVE2 pair captured with the hook on
the H200 (tests/fixtures/saveload-a and -b): definedness masks, philox cells,
topology keys, LOAD's refusals, the launcher and archive stripping."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from foundry.archive import Archive
from foundry.archive.outputs import DictValue, IntValue, SeqValue, TensorSpec, rebuild
from foundry.archive.schema import ModuleState
from foundry.archive.strip import strip
from foundry.errors import CaptureError, DriftError, FoundryError, HookError
from foundry.graphir.fingerprint import fingerprint, topology_key
from foundry.graphir.graph import Edge, EdgeData
from foundry.graphir.kernel import parameter_types
from foundry.graphir.operands import OperandSite
from foundry.graphir.passes.definedness import mark_host_words, mark_undefined
from foundry.graphir.regions import AddressRanges, Region, RegionKind
from foundry.runtime.graphs.rng import philox_cells
from foundry.runtime.host_maps import host_ranges
from foundry.runtime.launch import launcher
from foundry.runtime.launch.merge import merge_saves
from foundry.runtime.sessions.base import Session
from foundry.runtime.sessions.load import LoadSession
from foundry.runtime.sessions.open import load_options, open_session
from foundry.runtime.sessions.validate import check_environment, check_graph, check_modules, check_region

from .archive_tools import edit_json, write_archive
from .conftest import FIXTURES

SAVE_A, SAVE_B = FIXTURES / "saveload-a", FIXTURES / "saveload-b"


@pytest.fixture(scope="module")
def pair() -> tuple[Archive, Archive]:
    return Archive.open(SAVE_A), Archive.open(SAVE_B)


# -- what two SAVEs agree on ------------------------------------------------------------


def test_two_saves_made_the_same_allocations_and_graphs(pair):
    a, b = pair
    ra, rb = a.session(0).region, b.session(0).region
    assert (ra.base, ra.final_offset, ra.trace) == (rb.base, rb.final_offset, rb.trace)
    assert ra.warmup_allocations == 11 and ra.final_offset == 174_063_616
    for entry in a.entries(0):
        ga, gb = a.graph(0, entry), b.graph(0, entry.name)
        assert entry.topology == b.entry(0, entry.name).topology == topology_key(ga)
        assert [n.launch for n in ga.kernels()] == [n.launch for n in gb.kernels()]
        assert [(o.key, o.region, o.region_offset) for o in ga.operands] == [
            (o.key, o.region, o.region_offset) for o in gb.operands
        ]


def test_undefined_bytes_are_marked_and_left_out_of_the_fingerprint(pair):
    a, _ = pair
    ir = a.graph(0, "decode.bs1")
    marked = [n for n in ir.kernels() if n.undefined]
    assert marked, "the H200 SAVE marked no undefined bytes"
    node = marked[0]
    offset, _ = node.undefined[0]
    flipped = bytearray(node.params)
    flipped[offset] ^= 0xFF
    before = fingerprint(ir)
    ir.replace_node(msgspec.structs.replace(node, params=bytes(flipped)))
    assert fingerprint(ir) == before  # an undefined byte does not count
    defined = next(i for i in range(len(node.params)) if all(not o <= i < o + n for o, n in node.undefined))
    flipped[defined] ^= 0xFF
    ir.replace_node(msgspec.structs.replace(node, params=bytes(flipped)))
    assert fingerprint(ir) != before  # a defined one does


def test_mark_undefined_finds_differing_bytes_and_one_sided_pointers(pair):
    a, _ = pair
    kept, probe = a.graph(0, "sample.bs8"), a.graph(0, "sample.bs8")
    for ir in (kept, probe):  # start from no marks
        for n in ir.kernels():
            ir.replace_node(msgspec.structs.replace(n, undefined=()))
    node = kept.kernels()[0]
    changed = bytearray(node.params)
    words = {o.offset for o in probe.operands.of(node.id) if o.site is OperandSite.PARAM}
    scalar = next(i for i in range(len(changed)) if all(not w <= i < w + 8 for w in words))
    changed[scalar] ^= 0x5A
    probe.replace_node(msgspec.structs.replace(probe.node(node.id), params=bytes(changed)))
    pointer = next(iter(sorted(words)))  # the probe does not see this word as a pointer
    probe.set_operands(o for o in probe.operands if not (o.node == node.id and o.offset == pointer))
    raw = bytearray(changed)
    raw[pointer] ^= 0x10
    probe.replace_node(msgspec.structs.replace(probe.node(node.id), params=bytes(raw)))
    marked, count = mark_undefined(kept, probe)
    runs = marked.node(node.id).undefined
    marks = {i for o, n in runs for i in range(o, o + n)}
    word = scalar - scalar % 8  # a differing byte marks its whole aligned word
    assert set(range(word, word + 8)) <= marks and set(range(pointer, pointer + 8)) <= marks
    assert count == len(marks) and len(marks) == len({word, pointer}) * 8  # nothing else
    assert all(o.offset != pointer for o in marked.operands.of(node.id) if o.site is OperandSite.PARAM)


def test_a_byte_the_runs_agree_on_is_marked_with_its_word():
    """Two runs agreeing by chance on one byte of a leftover still mark all of it."""
    from foundry.graphir.passes.definedness import _whole_words

    differs = [False] * 20
    differs[9] = differs[11] = True  # bytes 9 and 11 of word 8..15 differ, byte 10 happened to agree
    assert _whole_words(differs) == [False] * 8 + [True] * 8 + [False] * 4
    tail = [False] * 18 + [True, False]  # a last, partial word
    assert _whole_words(tail) == [False] * 16 + [True] * 4


def test_mark_undefined_refuses_two_different_steps(pair):
    a, _ = pair
    with pytest.raises(CaptureError, match="node count"):
        mark_undefined(a.graph(0, "decode.bs1"), a.graph(0, "sample.bs8"))


def test_address_ranges_hold_their_starts_and_not_their_ends():
    ranges = AddressRanges([(0x3000, 0x4000), (0x1000, 0x2000)])  # given unsorted
    assert ranges.ranges == [(0x1000, 0x2000), (0x3000, 0x4000)]
    assert [a in ranges for a in (0xFFF, 0x1000, 0x1FFF, 0x2000, 0x3000, 0x3FFF, 0x4000)] == [
        False, True, True, False, True, True, False]  # fmt: skip
    assert 0x1000 not in AddressRanges()
    blocks = AddressRanges.of_blocks([(0x5000, 0x10), (0x100, 0x8)])
    assert blocks.ranges == [(0x100, 0x108), (0x5000, 0x5010)] and 0x107 in blocks and 0x108 not in blocks


def test_words_holding_host_addresses_are_undefined(pair):
    a, _ = pair
    ir = a.graph(0, "sample.bs8")
    node = ir.kernels()[0]
    operand_words = {o.offset for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
    free = next(w for w in range(0, len(node.params) - 7, 8) if w not in operand_words
                and all(not o <= w < o + n for o, n in node.undefined))  # fmt: skip
    raw = bytearray(node.params)
    raw[free : free + 8] = (0x7F00_0000_1234).to_bytes(8, "little")
    ir.replace_node(msgspec.structs.replace(node, params=bytes(raw)))
    ranges = host_ranges("7f0000000000-7f0000100000 r-xp 00000000 00:00 0 /lib/libexample.so\n")
    ir, words = mark_host_words(ir, ranges)
    assert words == 1 and any(o <= free and free + 8 <= o + n for o, n in ir.node(node.id).undefined)
    assert all(o.region == "vmm" for o in ir.operands.of(node.id))  # pointer words untouched


# -- RNG and templates ----------------------------------------------------------------------


def test_philox_cells_are_found_from_the_kernel_signature(pair):
    a, _ = pair
    entry = a.entry(0, "sample.bs8")
    region, seed, offset = philox_cells(a.graph(0, entry))
    assert region == "vmm" and (seed, offset) == (entry.rng.seed_offset, entry.rng.offset_offset)
    assert entry.rng.increment > 0
    assert philox_cells(a.graph(0, "decode.bs1")) is None


def test_parameter_types_read_from_a_real_torch_name():
    names = (FIXTURES / "kernel_names" / "torch.txt").read_text().split()
    from foundry.graphir.kernel import KernelIdentity

    mangled = next(n for n in names if "distribution_elementwise_grid_stride_kernel" in n)
    types = parameter_types(KernelIdentity(mangled).demangled)
    assert types is not None and "at::PhiloxCudaState" in types
    assert parameter_types('extern "C" kernel') is None and parameter_types("void f()") == []


def test_topology_keys_ignore_parameters_but_not_edges(pair):
    a, _ = pair
    ir = a.graph(0, "decode.bs1")
    key = topology_key(ir)
    node = ir.kernels()[3]
    ir.replace_node(msgspec.structs.replace(node, params=bytes(len(node.params))))
    assert topology_key(ir) == key
    ir.add_edges([Edge(0, len(ir) - 1, EdgeData())])
    assert topology_key(ir) != key


# -- LOAD's refusals ------------------------------------------------------------------------


def test_environment_drift_is_named_by_field(pair):
    a, _ = pair
    recorded = a.catalog.environment
    check_environment(recorded, recorded)
    for field, value in (("gpu_name", "NVIDIA B200"), ("driver_version", "590.1"), ("torch_version", "2.12.0"),
                         ("cuda_version", "13.1"), ("compute_capability", "10.0")):  # fmt: skip
        with pytest.raises(DriftError) as err:
            check_environment(recorded, msgspec.structs.replace(recorded, **{field: value}))
        assert err.value.field == f"environment.{field}" and err.value.found == value
    # another machine of the same kind (UUID is not recorded) and another Python are fine
    check_environment(recorded, msgspec.structs.replace(recorded, python_version="3.13.0"))


def test_a_stripped_archive_is_refused(pair):
    a, _ = pair
    assert a.catalog.modules.state is ModuleState.STRIPPED
    with pytest.raises(DriftError) as err:
        check_modules(a)
    assert err.value.field == "modules.state" and err.value.found == "stripped"


def _archive_with_module(root: Path, blob: bytes) -> Archive:
    return write_archive(root, [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=(blob,))


def test_missing_and_altered_module_images_are_refused(tmp_path):
    blob = b"\x7fELF" + bytes(60)
    archive = _archive_with_module(tmp_path / "a", blob)
    check_modules(archive)
    path = next((tmp_path / "a" / "modules").iterdir())
    path.write_bytes(blob[:-1] + b"\x01")
    with pytest.raises(DriftError, match="altered") as err:
        check_modules(Archive.open(tmp_path / "a"))
    assert err.value.field == f"modules/{path.name}"
    path.unlink()
    with pytest.raises(DriftError, match="missing"):
        check_modules(Archive.open(tmp_path / "a"))


def test_graphs_must_name_archived_images_and_point_only_into_the_region(pair):
    a, _ = pair
    ir = a.graph(0, "decode.bs8")
    check_graph(ir, a)
    legacy = Archive.open(FIXTURES / "tiny-qwen3")  # saved before the hook: no module images
    with pytest.raises(DriftError, match="module image is not in the archive"):
        check_graph(legacy.graph(0, "decode.bs1"), legacy)
    ir.regions["host.0"] = Region("host.0", RegionKind.HOST, 0x7F0000000000, 4096)
    first = next(iter(ir.operands))
    ir.set_operands(msgspec.structs.replace(o, region="host.0", region_offset=0) if o == first else o
                    for o in ir.operands)  # fmt: skip
    with pytest.raises(DriftError, match="outside the deterministic region") as err:
        check_graph(ir, a)
    assert err.value.node == first.node and err.value.found == "host.0+0x0"


def test_region_checks(pair):
    a, _ = pair
    record = a.session(0).region
    assert check_region(record, record.base, record.size) is record
    with pytest.raises(DriftError) as err:
        check_region(record, record.base + (16 << 30), record.size)
    assert err.value.field == "region.base"
    assert check_region(record, record.base + (16 << 30), record.size, relocate=True) is record
    with pytest.raises(DriftError, match="smaller"):
        check_region(record, record.base, record.final_offset - 1)
    with pytest.raises(DriftError, match="no region record"):
        check_region(None, record.base, record.size)


def test_restoring_warmup_bytes_needs_them_in_the_archive():
    with pytest.raises(DriftError) as err:
        LoadSession(SAVE_A, warmup="restore")
    assert err.value.field == "region.warmup_bytes"
    with pytest.raises(FoundryError, match="unknown warm-up mode"):
        LoadSession(SAVE_A, warmup="sometimes")


def test_a_load_session_takes_an_archive_its_caller_opened():
    """The SGLang plugin reads SAVE's verdict before the session starts, and hands the
    session the archive it opened rather than having it read the catalog again."""
    opened = Archive.open(SAVE_A)
    session = LoadSession(opened)
    assert session.archive is opened and session.record == opened.session(0)
    assert session.report["archive"] == LoadSession(SAVE_A).report["archive"] == str(opened.root)
    with pytest.raises(DriftError) as err:
        LoadSession(opened, warmup="restore")
    assert err.value.field == "region.warmup_bytes"


def test_save_keeps_warmup_bytes_up_to_the_first_capture_or_to_finish(tmp_path):
    from foundry.runtime.sessions.save import SaveSession

    assert SaveSession(tmp_path / "a", warmup_bytes_until="finish").warmup_bytes_until == "finish"
    with pytest.raises(FoundryError, match="first capture or to finish") as err:
        SaveSession(tmp_path / "a", warmup_bytes_until="never")
    assert err.value.field == "warmup_bytes_until"


def test_background_instantiation_is_asked_for_with_the_native_builder():
    with pytest.raises(FoundryError, match="unknown instantiation mode") as err:
        LoadSession(SAVE_A, builder="native", instantiate="later")
    assert err.value.field == "instantiate"
    with pytest.raises(FoundryError, match="needs the native builder") as err:
        LoadSession(SAVE_A, instantiate="background")
    assert err.value.field == "instantiate"
    assert LoadSession(SAVE_A, builder="native", instantiate="background").instantiate == "background"


def test_load_options_read_the_instantiation_mode(monkeypatch, with_hook):
    monkeypatch.delenv("FOUNDRY_INSTANTIATE", raising=False)
    assert load_options()["instantiate"] == "now"
    monkeypatch.setenv("FOUNDRY_INSTANTIATE", "background")
    assert load_options()["instantiate"] == "background"
    env = launcher.environment(launcher.RunConfig("load", SAVE_A, builder="native", instantiate="background"),
                               base_env={})  # fmt: skip
    assert env["FOUNDRY_INSTANTIATE"] == "background" and env["FOUNDRY_BUILDER"] == "native"


def test_open_session_reads_the_launcher_environment(monkeypatch):
    monkeypatch.delenv("FOUNDRY_MODE", raising=False)
    assert type(open_session()) is Session
    monkeypatch.setenv("FOUNDRY_MODE", "bogus")
    with pytest.raises(FoundryError, match="unknown mode"):
        open_session()
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    monkeypatch.delenv("FOUNDRY_ARCHIVE", raising=False)
    with pytest.raises(FoundryError, match="FOUNDRY_ARCHIVE"):
        open_session()


# -- the launcher ------------------------------------------------------------------------------


def test_load_takes_the_region_saved_or_relocates_when_asked(tmp_path, with_hook):
    record = Archive.open(SAVE_A).session(0).region
    env = launcher.environment(launcher.RunConfig("load", SAVE_A), base_env={"LD_PRELOAD": "/x/other.so"})
    assert env["FOUNDRY_REGION_BASE"] == hex(record.base) and env["FOUNDRY_REGION_SIZE"] == str(record.size)
    assert env["LD_PRELOAD"].split(":")[0].endswith("libfoundry_hook.so") and "/x/other.so" in env["LD_PRELOAD"]
    assert env["FOUNDRY_MODE"] == "load" and env["FOUNDRY_RELOCATE"] == "0" and "PYTHONHASHSEED" not in env
    assert env["FOUNDRY_HOOK_ECHO"] == "1" and env["FOUNDRY_REGION_THREADS"] == "owner"
    threads = launcher.RunConfig("load", SAVE_A, region_threads="any")
    assert launcher.environment(threads, base_env={})["FOUNDRY_REGION_THREADS"] == "any"
    shifted = record.base + (16 << 30)
    moved = launcher.environment(launcher.RunConfig("load", SAVE_A, region_base=shifted), base_env={})
    assert moved["FOUNDRY_REGION_BASE"] == hex(shifted) and moved["FOUNDRY_RELOCATE"] == "1"
    with pytest.raises(DriftError, match="needs --warmup replay") as err:
        launcher.environment(launcher.RunConfig("load", SAVE_A, region_base=shifted, warmup="restore"), base_env={})
    assert err.value.field == "region.base"
    with pytest.raises(DriftError, match="no region record"):
        launcher.environment(launcher.RunConfig("load", FIXTURES / "tiny-qwen3"), base_env={})


def test_save_gets_a_fixed_layout_unless_asked_not_to(tmp_path, with_hook):
    config = launcher.RunConfig("save", tmp_path / "a")
    assert launcher.environment(config, base_env={})["PYTHONHASHSEED"] == "0"
    assert launcher.preexec(config) is not None
    assert launcher.preexec(launcher.RunConfig("save", tmp_path / "a", fixed_layout=False)) is None
    assert launcher.preexec(launcher.RunConfig("load", SAVE_A)) is None


def test_the_second_save_run_moves_the_layout(tmp_path, with_hook):
    # A real program standing in for the application: it "saves" by copying a real
    # H200 SAVE to the archive path it is given and notes the padding it saw.
    seen = tmp_path / "pads.txt"
    code = (
        "import os, shutil, sys; shutil.copytree(sys.argv[1], os.environ['FOUNDRY_ARCHIVE']); "
        "open(sys.argv[2], 'a').write(str(len(os.environ.get('FOUNDRY_LAYOUT_PAD', ''))) + ' ' "
        "+ os.environ.get('FOUNDRY_SAVE_FIRST_RUN', '-') + ' ' + os.environ.get('MALLOC_PERTURB_', '-') + ' ')"
    )
    config = launcher.RunConfig("save", tmp_path / "a")
    code_ = launcher.run(config, [sys.executable, "-c", code, str(SAVE_A), str(seen)], save_runs=3, log=lambda _: None)
    first, first_ref, first_fill, *later = seen.read_text().split()
    assert code_ == 0 and int(first) == 0 and first_ref == "-" and first_fill == "-"
    pads, refs, fills = later[0::3], later[1::3], [int(f) for f in later[2::3]]
    assert all(int(pad) > 4096 and int(pad) % 16 for pad in pads) and pads[0] != pads[1]  # moves the stack > a page
    assert refs == [str((tmp_path / "a").resolve())] * 2  # later runs see the first's archive
    # each later run's heap is filled with its own bytes (the fill and its complement), never 0 or 0xff
    filled = [{fill, fill ^ 0xFF} for fill in fills]
    assert not filled[0] & filled[1] and not {0, 0xFF} & (filled[0] | filled[1])
    assert not list(tmp_path.glob(".a.run*"))  # the second run's archive is merged and removed


_MALLOC_TWICE = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = libc.free.argtypes = [ctypes.c_void_p]
fresh = ctypes.string_at(libc.malloc(4096), 4096)
small = libc.malloc(64)
ctypes.memset(small, 0x11, 64)  # a leftover, freed and allocated again
libc.free(small)
again = libc.malloc(64)
print(fresh.hex(), ctypes.string_at(again, 64).hex())
"""


def test_a_later_runs_heap_fill_reaches_what_malloc_returns(tmp_path, with_hook):
    # fresh blocks and recycled small ones (glibc's per-thread cache would hand those back
    # unfilled) come with the complement of the run's fill, not with what was left in them
    later = launcher._later_run(launcher.RunConfig("save", tmp_path / "a"), 2)
    env = launcher.environment(later, base_env={"PATH": os.environ.get("PATH", ""), "GLIBC_TUNABLES": "a.b=1"})
    assert env["GLIBC_TUNABLES"] == "a.b=1:glibc.malloc.tcache_count=0"  # the user's tunables kept
    out = subprocess.run([sys.executable, "-c", _MALLOC_TWICE], env=env, capture_output=True, text=True, check=True)
    fresh, again = (bytes.fromhex(h) for h in out.stdout.split())
    fill = bytes([later.heap_fill ^ 0xFF])
    assert fresh == fill * 4096 and again == fill * 64
    first = launcher.environment(launcher.RunConfig("save", tmp_path / "a"), base_env={})
    assert "MALLOC_PERTURB_" not in first and "GLIBC_TUNABLES" not in first  # the kept run is left alone


def test_the_launcher_refuses_without_a_built_hook(monkeypatch, tmp_path):
    monkeypatch.setattr(launcher, "library_path", lambda: None)
    with pytest.raises(HookError, match="not built"):
        launcher.environment(launcher.RunConfig("save", tmp_path / "a"), base_env={})


def test_foundry_run_on_the_command_line(tmp_path, with_hook):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "foundry", "run", *args], capture_output=True, text=True)

    code = "import os; print(os.environ['FOUNDRY_MODE'], open('/proc/self/personality').read().strip())"
    wrote_nothing = run("--mode", "save", "--archive", str(tmp_path / "a"), "--", sys.executable, "-c", code)
    assert wrote_nothing.stdout.split() == ["save", "00040000"], wrote_nothing.stderr  # no randomisation
    assert wrote_nothing.returncode == 2 and "wrote no archive" in wrote_nothing.stderr
    failing = run("--mode", "save", "--archive", str(tmp_path / "a"), "--", sys.executable, "-c", "raise SystemExit(5)")
    assert failing.returncode == 5  # the program's own exit code
    missing = run("--mode", "load", "--archive", str(tmp_path / "nothing"), "--", "true")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such archive" in missing.stderr
    absent = run("--mode", "save", "--archive", str(tmp_path / "a"), "--", "no-such-program-here")
    assert absent.returncode == 2 and "command not found" in absent.stderr
    existing = tmp_path / "existing"
    shutil.copytree(SAVE_A, existing)
    kept = run("--mode", "save", "--archive", str(existing), "--", sys.executable, "-c", "print('ran')")
    assert kept.returncode == 2 and "already holds an archive" in kept.stderr and "ran" not in kept.stdout
    assert Archive.open(existing).entries(0) == Archive.open(SAVE_A).entries(0)  # nothing already saved is lost
    bad = run("--mode", "save", "--archive", str(tmp_path / "a"), "--region-base", "nowhere", "--", "true")
    assert bad.returncode == 2 and "not an address" in bad.stderr


# -- stripping and outputs ------------------------------------------------------------------------


def test_strip_removes_images_and_warmup_bytes_and_says_so(tmp_path):
    root = tmp_path / "a"
    archive = _archive_with_module(root, b"\x7fELF" + bytes(200))
    removed = strip(archive)
    assert removed == {"files": 1, "bytes": 204}
    reopened = Archive.open(root)
    assert reopened.catalog.modules.state is ModuleState.STRIPPED and reopened.catalog.modules.blobs
    assert reopened.graph(0, "sample.bs8") is not None  # still inspects
    with pytest.raises(DriftError):
        check_modules(reopened)
    out = subprocess.run([sys.executable, "-m", "foundry", "archive", "strip", str(root), "--json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and json.loads(out.stdout)["files"] == 0


def test_output_descriptions_rebuild_the_same_structure():
    logits = TensorSpec("float32", (2, 3), (3, 1), 0, "vmm", 4096)
    spec = DictValue(
        {"logits": logits, "rest": SeqValue("tuple", (IntValue(7), TensorSpec("int64", (2,), (1,), 0, "vmm", 0)))}
    )
    made = rebuild(spec, lambda t: ("tensor", t.dtype, t.region_offset))
    assert made == {"logits": ("tensor", "float32", 4096), "rest": (7, ("tensor", "int64", 0))}


def test_edits_that_break_the_region_record_are_caught(tmp_path, with_hook):
    root = tmp_path / "a"
    shutil.copytree(SAVE_A, root)
    edit_json(root / "rank0" / "session.json", lambda s: s["region"].update(base=0x500000000000), root=root)
    record = Archive.open(root).session(0).region
    with pytest.raises(DriftError) as err:
        check_region(record, 0x600000000000, 64 << 30)
    assert err.value.expected == "0x500000000000"
    env_before = dict(os.environ)
    assert launcher.environment(launcher.RunConfig("load", root))["FOUNDRY_REGION_BASE"] == "0x500000000000"
    assert dict(os.environ) == env_before  # the launcher never changes its own environment


def test_two_save_runs_merge_into_identical_fingerprints(tmp_path):
    """SAVE and SAVE2 from the H200 disagree on leftover bytes; merging each with the
    other marks exactly those, and then both fingerprint the same."""
    from foundry.runtime.launch.merge import merge_saves

    a, b, a2 = tmp_path / "a", tmp_path / "b", tmp_path / "a2"
    for src, dst in ((SAVE_A, a), (SAVE_B, b), (SAVE_A, a2)):
        shutil.copytree(src, dst)
    before = [e.fingerprint for e in Archive.open(a).entries(0)]
    assert before != [e.fingerprint for e in Archive.open(b).entries(0)]
    stats = merge_saves(a, b)
    merge_saves(b, a2)
    assert stats["graphs"] == 3 and stats["undefined_bytes"] > 0
    merged_a, merged_b = Archive.open(a), Archive.open(b)
    assert [e.fingerprint for e in merged_a.entries(0)] == [e.fingerprint for e in merged_b.entries(0)]
    verify = subprocess.run([sys.executable, "-m", "foundry", "archive", "verify", str(a)], capture_output=True,
                            text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    diff = subprocess.run([sys.executable, "-m", "foundry", "archive", "diff", str(a), str(b)], capture_output=True,
                          text=True)  # fmt: skip
    assert diff.returncode == 0, diff.stdout


def test_merging_refuses_runs_that_allocated_differently(tmp_path):
    from foundry.runtime.launch.merge import merge_saves

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(SAVE_A, a)
    shutil.copytree(SAVE_B, b)
    edit_json(b / "rank0" / "session.json", lambda s: s["region"].update(final_offset=1 << 30), root=b)
    with pytest.raises(CaptureError, match="allocated differently"):
        merge_saves(a, b)
    assert [e.fingerprint for e in Archive.open(a).entries(0)] == [
        e.fingerprint for e in Archive.open(SAVE_A).entries(0)
    ]


def test_a_relocating_load_refuses_restored_globals_that_point_into_the_old_region():
    from foundry.archive.schema import GlobalRecord, ImageRecord
    from foundry.runtime.code.module_globals import restore_fresh

    base = 0x600000000000
    pointer = GlobalRecord("table", 16, True, "0" * 64, (base + 0x1000).to_bytes(8, "little") + bytes(8))
    record = ImageRecord("ab" * 32, globals_known=True, globals=(pointer,))
    with pytest.raises(DriftError, match="moved") as err:
        restore_fresh(record, record.sha256, 0, moved_from=(base, base + (1 << 30)))
    assert err.value.field == "table"
    with pytest.raises(DriftError, match="unknown"):
        restore_fresh(ImageRecord("cd" * 32, globals_known=False), "cd" * 32, 0)
    assert restore_fresh(ImageRecord("ef" * 32, globals_known=True), "ef" * 32, 0) == []
    with pytest.raises(DriftError, match="relocating needs"):
        LoadSession(FIXTURES / "saveload-a", relocate=True, warmup="restore")


def test_inspect_reports_what_a_load_relies_on():
    out = subprocess.run([sys.executable, "-m", "foundry", "archive", "inspect", str(SAVE_A), "--json"],
                         capture_output=True, text=True)  # fmt: skip
    data = json.loads(out.stdout)
    (facts,) = data["restore"]
    assert facts["region"]["base"] == "0x600000000000" and facts["region"]["warmup_allocations"] == 11
    assert facts["region"]["late_allocations"] == 0 and facts["images"] == 27 and facts["globals_unknown"] == []
    assert [g["graph"] for g in data["graphs"] if g["rng"]] == ["sample.bs8"]
    assert all(g["undefined_bytes"] > 0 for g in data["graphs"])
    assert facts["globals_per_process"] == []


def test_inspect_names_globals_that_hold_the_processs_host_addresses(archive_copy):
    # the H200 SAVE with one written global given host words, as NVSHMEM's device state gets them
    path = archive_copy("saveload-a")
    session = path / "rank0" / "session.json"

    def give_host_words(s: dict) -> None:
        s["format_version"] = 3
        wide = next(g for image in s["images"] for g in image["globals"] if g["size"] >= 16)
        wide["host_words"] = [8]

    edit_json(session, give_host_words, root=path)
    out = subprocess.run([sys.executable, "-m", "foundry", "archive", "inspect", str(path)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    wide = next(g for i in Archive.open(path).session(0).images for g in i.globals if g.host_words)
    assert f"LOAD needs the application's own loaded copy): {wide.name}" in out.stdout


def test_a_save_stopped_after_writing_says_the_second_run_was_not_made(tmp_path, with_hook):
    code = "import os, shutil, sys; shutil.copytree(sys.argv[1], os.environ['FOUNDRY_ARCHIVE']); sys.exit(143)"
    lines: list[str] = []
    config = launcher.RunConfig("save", tmp_path / "a")
    assert launcher.run(config, [sys.executable, "-c", code, str(SAVE_A)], log=lines.append) == 143
    assert len(lines) == 1 and "exited with 143 after writing" in lines[0] and "--save-runs 1" in lines[0]


def test_a_save_of_several_ranks_needs_a_fresh_save_id_before_it_starts(tmp_path, with_hook, monkeypatch):
    monkeypatch.delenv("FOUNDRY_SAVE_ID", raising=False)
    config = launcher.RunConfig("save", tmp_path / "a", rank=1, world_size=2)
    with pytest.raises(FoundryError, match="SAVE id is 1-64"):
        launcher.run(config, [sys.executable, "-c", "raise SystemExit('must not run')"])


# A rank's program standing in for the application: it writes its rank of a world-size-2
# SAVE from a real H200 SAVE, the first run from saveload-a, later runs from saveload-b.
RANK_SAVE = """
import os, sys, time
from foundry.archive import Archive
from foundry.archive.writer import ArchiveWriter
rank = int(os.environ["FOUNDRY_RANK"])
source = Archive.open(sys.argv[2] if os.environ.get("FOUNDRY_SAVE_FIRST_RUN") else sys.argv[1])
writer = ArchiveWriter(os.environ["FOUNDRY_ARCHIVE"], environment=source.catalog.environment, world_size=2,
                       save_id=os.environ["FOUNDRY_SAVE_ID"], overwrite=os.environ["FOUNDRY_OVERWRITE"] == "1")
part = writer.rank(rank)
part.set_region(source.session(0).region)
for entry in source.entries(0):
    part.add_graph(source.graph(0, entry.name))
part.seal()
writer.commit()
if os.environ.get("FOUNDRY_SAVE_FIRST_RUN") and os.environ.get("FAIL_RANK"):
    if rank == int(os.environ["FAIL_RANK"]):
        sys.exit(3)
    time.sleep(120)  # as a rank whose peer is gone: it would wait for it
"""


def test_a_save_of_two_ranks_runs_both_again_and_marks_them_once(tmp_path, with_hook, monkeypatch):
    """Two ranks' launchers (threads here, a process each in use) run their ranks twice;
    the second runs write one shared archive, and exactly one launcher merges it."""
    root = tmp_path / "a"
    codes, logs = two_launchers(root, monkeypatch, "two-ranks")
    assert codes == {0: 0, 1: 0}, logs
    merged = [line for r in (0, 1) for line in logs[r] if "merged run 2 of every rank" in line]
    found_done = [line for r in (0, 1) for line in logs[r] if "merged by another rank" in line]
    assert len(merged) == 1 and len(found_done) == 1, logs
    archive = Archive.open(root)
    assert archive.ranks == [0, 1] and not list(tmp_path.glob(".a.run*"))
    single = tmp_path / "single"  # the same pair merged in one process marks the same bytes
    shutil.copytree(SAVE_A, single)
    merge_saves(single, SAVE_B)
    expected = [e.fingerprint for e in Archive.open(single).entries(0)]
    assert expected != [e.fingerprint for e in Archive.open(SAVE_A).entries(0)]
    for r in (0, 1):
        assert [e.fingerprint for e in archive.entries(r)] == expected


def two_launchers(root, monkeypatch, save_id: str) -> tuple[dict[int, int], dict[int, list[str]]]:
    import threading

    monkeypatch.setenv("FOUNDRY_SAVE_ID", save_id)
    logs, codes = {0: [], 1: []}, {}

    def rank(r: int) -> None:
        config = launcher.RunConfig("save", root, rank=r, world_size=2)
        try:
            codes[r] = launcher.run(config, [sys.executable, "-c", RANK_SAVE, str(SAVE_A), str(SAVE_B)],
                                    log=logs[r].append)  # fmt: skip
        except FoundryError as err:
            codes[r], logs[r] = -1, [*logs[r], str(err)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return codes, logs


def test_a_rank_failing_its_second_run_stops_the_other_and_leaves_the_first_archive(tmp_path, with_hook,
                                                                                     monkeypatch):  # fmt: skip
    import time

    monkeypatch.setenv("FAIL_RANK", "1")
    started = time.monotonic()
    codes, logs = two_launchers(tmp_path / "a", monkeypatch, "fails")
    assert codes[1] == 3 and codes[0] != 0, logs
    assert time.monotonic() - started < 100  # rank 0's program (sleeping 120 s) was stopped
    assert (tmp_path / "a" / ".failed.fails").exists() and not list(tmp_path.glob(".a.run*"))
    first = Archive.open(tmp_path / "a")  # the first run's archive, unmarked
    assert [e.fingerprint for e in first.entries(1)] == [e.fingerprint for e in Archive.open(SAVE_A).entries(0)]
    config = launcher.RunConfig("save", tmp_path / "a", rank=0, world_size=2, overwrite=True)
    with pytest.raises(FoundryError, match="give the new SAVE a new FOUNDRY_SAVE_ID"):  # the id is spent
        launcher.run(config, [sys.executable, "-c", "raise SystemExit('must not run')"])


def test_an_id_too_long_for_the_later_runs_is_refused_before_anything_runs(tmp_path, with_hook, monkeypatch):
    monkeypatch.setenv("FOUNDRY_SAVE_ID", "x" * 62)
    config = launcher.RunConfig("save", tmp_path / "a", rank=0, world_size=2)
    with pytest.raises(FoundryError, match="1-64"):
        launcher.run(config, [sys.executable, "-c", "raise SystemExit('must not run')"])
    assert not (tmp_path / "a").exists()


def test_pooled_marks_give_two_independent_saves_the_same_fingerprints():
    """tests/fixtures/merged-saves: decode.bs1, decode.bs8 and sample.bs8 of two
    independent two-run SAVEs of recipes/torch/run.py on the H200 (the same command
    line, each run pair merged with per-node marks). Per node, a slot that only
    sometimes holds a leftover was marked in one SAVE and not the other; pooled over
    each kernel's launches, the marks and so the fingerprints agree."""
    from foundry.graphir.fingerprint import fingerprint
    from foundry.graphir.passes.definedness import _pointer_words, mark_alike

    a, b = (Archive.open(FIXTURES / "merged-saves" / side) for side in "ab")
    saves = [[archive.graph(0, e) for e in archive.entries(0)] for archive in (a, b)]
    before = [fingerprint(x) == fingerprint(y) for x, y in zip(*saves, strict=True)]
    assert not all(before)  # per-node marks: the fingerprints differ
    added = [mark_alike(irs) for irs in saves]
    assert all(n > 0 for n in added)
    assert [fingerprint(x) for x in saves[0]] == [fingerprint(y) for y in saves[1]]
    for irs in saves:  # every launch of a kernel carries its kernel's marks, except on its own pointer words
        pooled: dict = {}
        for node in (n for ir in irs for n in ir.kernels()):
            pooled.setdefault((node.kernel.name, node.layout), set()).update(node.undefined_offsets())
        for ir in irs:
            for node in ir.kernels():
                pointers = _pointer_words(ir, node)
                expected = {i for i in pooled[(node.kernel.name, node.layout)] if i - i % 8 not in pointers}
                assert expected <= node.undefined_offsets()
                operands = {o.offset for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
                assert not any(i - i % 8 in operands for i in node.undefined_offsets())  # no operand hidden


def test_pooling_leaves_a_launchs_own_pointers_defined():
    """A slot one launch of a kernel leaves undefined is marked in its other launches,
    except where a launch holds an address inside a region there: that may be a pointer
    the manifest missed, which archive diff --relocations must still see."""
    from foundry.graphir.passes.definedness import mark_alike

    ir = Archive.open(FIXTURES / "merged-saves" / "a").graph(0, "decode.bs1")
    for node in ir.kernels():  # start from no marks
        ir.replace_node(msgspec.structs.replace(node, undefined=()))
    by_kernel: dict = {}
    for node in ir.kernels():
        by_kernel.setdefault((node.kernel.name, node.layout), []).append(node)
    first, second, *_ = next(nodes for nodes in by_kernel.values() if len(nodes) >= 3)
    operands = {o.offset for o in ir.operands.of(second.id) if o.site is OperandSite.PARAM}
    word = next(w for w in range(0, len(second.params) - 7, 8) if w not in operands)
    region = ir.regions["vmm"]
    params = bytearray(second.params)
    params[word : word + 8] = (region.base + 0x100).to_bytes(8, "little")  # a region address, not in the manifest
    ir.replace_node(msgspec.structs.replace(second, params=bytes(params)))
    ir.replace_node(msgspec.structs.replace(first, undefined=((word, 8),)))
    assert mark_alike([ir]) >= 8
    assert not set(range(word, word + 8)) & ir.node(second.id).undefined_offsets()
    others = by_kernel[(first.kernel.name, first.layout)][2:]
    assert others and all(set(range(word, word + 8)) <= ir.node(n.id).undefined_offsets() for n in others)
