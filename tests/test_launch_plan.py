"""Launch plans on the CPU: real H200 graphs packed at "SAVE" with a function table,
parsed by the hook's C reader (building needs a GPU), stored and checked by the
archive, dropped when a graph is rewritten, and chosen by LOAD only when nothing
needs patching."""

from __future__ import annotations

import ctypes
import shutil
import struct
from types import SimpleNamespace

import msgspec
import pytest

from foundry.archive import Archive
from foundry.archive.rewrite import rewrite_graphs
from foundry.archive.schema import LaunchPlan
from foundry.errors import ArchiveError, HookError, IRError
from foundry.graphir.passes.definedness import mark_undefined
from foundry.runtime.graphs.launch_plan import check_plan, make_plan, plannable
from foundry.runtime.sessions.load import LoadSession

from .archive_tools import write_archive
from .conftest import FIXTURES

SAVE_A = FIXTURES / "saveload-a"


@pytest.fixture(scope="module")
def lib(hook_library) -> ctypes.CDLL:
    return ctypes.CDLL(str(hook_library))


def _plan_record(data: bytes, kernels) -> LaunchPlan:
    return LaunchPlan(file="plans/x.fgb", sha256="0" * 64, size=len(data), kernels=kernels)


@pytest.mark.parametrize("graph", ["decode.bs1", "decode.bs8", "sample.bs8"])
def test_real_graphs_plan_and_parse_with_their_function_table(lib, graph):
    ir = Archive.open(SAVE_A).graph(0, graph)
    planned = make_plan(ir)
    assert planned is not None
    data, kernels = planned
    assert check_plan(lib, data, _plan_record(data, kernels)) == (len(ir), ir.edge_count())
    distinct = {(n.kernel.image, n.kernel.name) for n in ir.kernels()}
    assert {(k.image, k.name) for k in kernels} == distinct and len(kernels) == len(distinct)


def test_a_function_index_beyond_the_table_is_refused(lib):
    ir = Archive.open(SAVE_A).graph(0, "decode.bs8")
    data, kernels = make_plan(ir)
    with pytest.raises(IRError, match=r"not in the .*function table"):
        check_plan(lib, data, _plan_record(data, kernels[:-1]))
    first_func = 16 + 4  # header, then the first node's kind
    assert struct.unpack_from("<I", data, 16)[0] == 1  # a kernel node
    hostile = bytearray(data)
    struct.pack_into("<Q", hostile, first_func, 1 << 40)
    with pytest.raises(IRError, match="function table"):
        check_plan(lib, bytes(hostile), _plan_record(data, kernels))


def test_graphs_pointing_outside_the_region_get_no_plan():
    ir = Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce")
    assert not plannable(ir) and make_plan(ir) is None


def _flip_first_param_byte(ir) -> None:
    first = ir.kernels()[0]
    ir.replace_node(msgspec.structs.replace(first, params=bytes([first.params[0] ^ 1]) + first.params[1:]))


def test_plans_are_stored_checked_and_dropped_by_rewrites(tmp_path):
    ir = Archive.open(SAVE_A).graph(0, "decode.bs8")
    archive = write_archive(tmp_path / "a", [ir], like=SAVE_A, plan_of=make_plan)
    plan = archive.entry(0, "decode.bs8").plan
    assert plan is not None and plan.file == "plans/decode.bs8.fgb"
    data = archive.rank_blob(0, plan.file, sha256=plan.sha256, size=plan.size, what="launch plan")
    assert data == make_plan(ir)[0]

    path = tmp_path / "a" / "rank0" / plan.file
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ArchiveError, match="launch plan does not match"):
        archive.rank_blob(0, plan.file, sha256=plan.sha256, size=plan.size, what="launch plan")
    path.write_bytes(data)

    rewrite_graphs(archive, lambda _, g: g, keep_plans=True)  # marks only: the plan stays
    assert Archive.open(tmp_path / "a").entry(0, "decode.bs8").plan == plan
    other = Archive.open(SAVE_A).graph(0, "decode.bs8")  # a merge marks a byte another run saw differently:
    _flip_first_param_byte(other)  # a new graph file, the same plan
    rewrite_graphs(Archive.open(tmp_path / "a"), lambda _, g: mark_undefined(g, other)[0], keep_plans=True)
    marked = Archive.open(tmp_path / "a").entry(0, "decode.bs8")
    assert marked.sha256 != archive.entry(0, "decode.bs8").sha256 and marked.plan.sha256 == plan.sha256
    assert marked.plan.graph_sha256 == marked.sha256  # rebound, so it still reads
    rewrite_graphs(Archive.open(tmp_path / "a"), lambda _, g: g)  # any other edit: LOAD builds from the IR
    assert Archive.open(tmp_path / "a").entry(0, "decode.bs8").plan is None


def test_load_uses_plans_only_when_nothing_needs_patching(tmp_path):
    shutil.copytree(SAVE_A, tmp_path / "a")
    session = LoadSession(tmp_path / "a", builder="native")
    record = session.record
    plan = LaunchPlan(file="plans/g.fgb", sha256="0" * 64, size=0, kernels=())
    session.record = msgspec.structs.replace(
        record, graphs=tuple(msgspec.structs.replace(e, plan=plan) for e in record.graphs)
    )
    session.live_base = record.region.base
    assert session._plans_apply()
    session.live_base = record.region.base + (16 << 30)  # relocated: pointers need patching
    assert not session._plans_apply()
    session.live_base = record.region.base
    session.builder = "python"
    assert not session._plans_apply()
    session.builder = "native"
    session.record = msgspec.structs.replace(session.record, graphs=(*session.record.graphs[:-1],
                                             msgspec.structs.replace(record.graphs[-1], plan=None)))  # fmt: skip
    assert not session._plans_apply()  # one graph without a plan: all build from the IR


def test_a_native_load_reads_its_plans_on_a_thread_from_its_start_and_the_restore_takes_them(tmp_path):
    from foundry.runtime.sessions.load_builders import read_plans

    ir = Archive.open(SAVE_A).graph(0, "decode.bs8")
    archive = write_archive(tmp_path / "a", [ir], like=SAVE_A, plan_of=make_plan)
    session = LoadSession(archive, builder="native")
    session._prefetch_plans()
    assert session._plans_read is not None
    [(name, data, plan)] = session._plans_read.result()
    assert name == "decode.bs8" and data == make_plan(ir)[0] and plan == archive.entry(0, name).plan
    python = LoadSession(archive, builder="python")
    python._prefetch_plans()
    assert python._plans_read is None  # the Python builder reads no plans
    path = tmp_path / "a" / "rank0" / plan.file
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # damaged on disk: the reader says so, when taken
    ahead = LoadSession(Archive.open(tmp_path / "a"), builder="native")
    ahead._prefetch_plans()
    with pytest.raises(ArchiveError, match="launch plan does not match"):
        ahead._plans_read.result()
    with pytest.raises(ArchiveError, match="launch plan does not match"):
        read_plans(Archive.open(tmp_path / "a"), 0, archive.session(0).graphs)


def test_a_graph_changed_after_save_without_its_plan_is_refused_on_reading(tmp_path):
    """A LOAD from plans never decodes the graph, so a plan bound to another graph file than
    the entry's is refused by every reader, before any GPU work (it replayed the old bytes)."""
    import subprocess
    import sys

    from foundry.archive.files import sha256_hex
    from foundry.graphir.codec import encode_graph

    from .archive_tools import edit_json, reseal

    ir = Archive.open(SAVE_A).graph(0, "decode.bs8")
    archive = write_archive(tmp_path / "a", [ir], like=SAVE_A, plan_of=make_plan)
    entry = archive.entry(0, "decode.bs8")
    assert entry.plan.graph_sha256 == entry.sha256 == sha256_hex(archive.graph_bytes(0, entry))
    assert archive.session(0).format_version == 4  # an older Foundry refuses it by version, not by field

    _flip_first_param_byte(ir)  # a parameter byte changed and the archive re-sealed, the plan kept
    (tmp_path / "a" / "rank0" / entry.file).write_bytes(encode_graph(ir))
    reseal(tmp_path / "a")
    with pytest.raises(ArchiveError, match="packed from another graph file") as refused:
        Archive.open(tmp_path / "a").session(0)
    assert refused.value.field == "graphs[0].plan.graph_sha256"
    run = subprocess.run([sys.executable, "-m", "foundry", "archive", "inspect", str(tmp_path / "a")],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "" and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "plan.graph_sha256" in run.stderr and "Traceback" not in run.stderr

    def unbound(session: dict) -> None:  # a plan of session format 3: no binding
        del session["graphs"][0]["plan"]["graph_sha256"]
        session["format_version"] = 3

    edit_json(tmp_path / "a" / "rank0" / "session.json", unbound, root=tmp_path / "a")
    assert Archive.open(tmp_path / "a").entry(0, "decode.bs8").plan.graph_sha256 is None  # read; verify compares


def test_the_negative_control_edit_drops_the_plan_of_the_graph_it_alters(tmp_path):
    from .archive_tools import edit_graph

    source = Archive.open(SAVE_A)
    irs = [source.graph(0, "decode.bs1"), source.graph(0, "decode.bs8")]
    write_archive(tmp_path / "a", irs, like=SAVE_A, plan_of=make_plan)
    edit_graph(tmp_path / "a", "decode.bs1", lambda ir: None)
    archive = Archive.open(tmp_path / "a")
    kept = archive.entry(0, "decode.bs8")
    assert archive.entry(0, "decode.bs1").plan is None  # a LOAD builds every graph from its IR (test above)
    assert kept.plan is not None and kept.plan.graph_sha256 == kept.sha256


def test_verify_packs_each_graph_again_and_compares_its_plan(tmp_path):
    import json
    import subprocess
    import sys

    source = Archive.open(SAVE_A)
    bs1, bs8 = source.graph(0, "decode.bs1"), source.graph(0, "decode.bs8")
    for name, planned in (("good", bs8), ("stale", bs1)):  # stale: another graph's plan, validly sealed
        write_archive(tmp_path / name, [bs8], like=SAVE_A, plan_of=lambda _, planned=planned: make_plan(planned))
    run = [sys.executable, "-m", "foundry", "archive", "verify", "--json"]
    good = subprocess.run([*run, str(tmp_path / "good")], capture_output=True, text=True)
    assert good.returncode == 0 and json.loads(good.stdout)["ok"], good.stderr
    stale = subprocess.run([*run, str(tmp_path / "stale")], capture_output=True, text=True)
    assert stale.returncode == 1
    report = json.loads(stale.stdout)
    assert report["fingerprint_mismatches"] == [] and [m["graph"] for m in report["plan_mismatches"]] == ["decode.bs8"]


def _desc(*nodes: bytes) -> bytes:
    return b"FGB1" + struct.pack("<III", 1, len(nodes), 0) + b"".join(nodes)


def _memset(dst: int, width: int) -> bytes:
    return struct.pack("<IQIIQQQ", 3, dst, 0, 4, width, 1, 0)


def _memcpy(src_type: int, dst_type: int, src: int, dst: int, width: int) -> bytes:
    return struct.pack("<III", 2, src_type, dst_type) + struct.pack("<QQ3Q3QQQQQ3Q", src, dst, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                      0, 0, width, 1, 1)  # fmt: skip


def _kernel(attribute: int) -> bytes:
    return (struct.pack("<IQ3I3III", 1, 0, 1, 1, 1, 32, 1, 1, 0, 0) + struct.pack("<III", 1, 0, 4)
            + struct.pack("<I", 4) + bytes(4) + struct.pack("<III", 1, attribute, 0) + bytes(64))  # fmt: skip


def test_plans_copy_and_set_device_memory_inside_the_region_only(lib):
    region = (0x600000000000, 0x600000000000 + (1 << 20))
    plan = _plan_record(b"", ())  # no kernels in these descriptions
    inside = _desc(_memset(region[0] + 4096, 256), _memcpy(2, 2, region[0], region[0] + 8192, 512))
    assert check_plan(lib, inside, plan, region) == (2, 0)
    cases = {
        "memset past the end": _desc(_memset(region[1] - 512, 256)),
        "memset below": _desc(_memset(region[0] - 4096, 16)),
        "copy out of the region": _desc(_memcpy(2, 2, region[0], region[1], 512)),
        "copy from host memory": _desc(_memcpy(1, 2, 0x7FFF0000, region[0], 64)),
        "wrapping length": _desc(_memset(region[0], (1 << 62))),
    }
    for name, desc in cases.items():
        with pytest.raises(IRError, match="outside the region"):
            check_plan(lib, desc, plan, region)
            pytest.fail(f"accepted: {name}")


def test_plans_carry_only_the_launch_attributes_foundry_records(lib):
    from foundry.archive.schema import PlanKernel

    plan = _plan_record(b"", (PlanKernel("0" * 64, "k"),))
    assert check_plan(lib, _desc(_kernel(4)), plan) == (1, 0)  # cluster dimension
    assert check_plan(lib, _desc(_kernel(11)), plan) == (1, 0)  # preferred (substitute) cluster dimension
    assert check_plan(lib, _desc(_kernel(16)), plan) == (1, 0)  # NVLink-centric scheduling
    for attribute in (6, 7, 12):  # programmatic launch and events: valid for launches, not graph nodes
        with pytest.raises(IRError, match=f"launch attribute {attribute} is not one a plan may carry"):
            check_plan(lib, _desc(_kernel(attribute)), plan)


def test_verify_without_cuda_bindings_says_the_plans_were_not_compared(tmp_path):
    import subprocess
    import sys

    write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "decode.bs8")], like=SAVE_A, plan_of=make_plan)
    code = ("import sys; sys.modules['cuda'] = None; from foundry.cli import main; "
            f"main(['archive', 'verify', {str(tmp_path / 'a')!r}])")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "1 launch plan(s) not compared: packing needs cuda-bindings" in proc.stdout


def test_archived_images_are_checked_before_the_driver_loads_any(tmp_path, hook_library):
    """One of two images corrupted: prefetch refuses it by its sha256. This machine has
    no driver, so any driver call would fail otherwise: every image is read and checked
    before the first load (the loading itself runs in every LOAD on the GPU:
    bench/cold_start.py loads 111 images ahead)."""
    from foundry.runtime.code.binding import ArchiveFunctions
    from foundry.runtime.native.hook import Hook

    blobs = (b"\x7fELF" + bytes(300), b"\x7fELF" + bytes(500))
    archive = write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=blobs)
    shas = {b.sha256 for b in archive.catalog.modules.blobs}
    victim = sorted(shas)[1]
    (tmp_path / "a" / "modules" / f"{victim}.bin").write_bytes(b"\x7fELF" + bytes(299) + b"!")
    with pytest.raises(ArchiveError):
        ArchiveFunctions(Hook.open_library(hook_library), Archive.open(tmp_path / "a"), None).prefetch(shas)


def test_images_loaded_ahead_are_bound_once_and_released_on_failure(tmp_path, hook_library, monkeypatch):
    """The driver cannot exist on this machine: its four calls are stood in for, so that
    what prefetch loads, binding takes without a second load, and release() unloads."""
    import itertools

    from foundry.runtime.code import binding as functions_module
    from foundry.runtime.code.binding import ArchiveFunctions
    from foundry.runtime.native.hook import Hook

    handles, calls = itertools.count(0x1000), []

    def driver_call(name, *args):
        calls.append(name)
        return next(handles) if name == "cuLibraryLoadData" else "context" if name == "cuCtxGetCurrent" else None

    monkeypatch.setattr(functions_module, "cu", driver_call)
    monkeypatch.setattr(functions_module, "driver", lambda: SimpleNamespace(CUlibrary=lambda h: h))
    blobs = (b"\x7fELF" + bytes(300), b"\x7fELF" + bytes(500))
    archive = write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=blobs)
    shas = sorted(b.sha256 for b in archive.catalog.modules.blobs)
    functions = ArchiveFunctions(Hook.open_library(hook_library), archive, None)
    assert functions.prefetch(set(shas)) == 2 and calls.count("cuLibraryLoadData") == 2
    kind, library = functions._image(shas[0])
    assert kind == "library" and library >= 0x1000 and calls.count("cuLibraryLoadData") == 2  # no second load
    functions.release()
    assert calls.count("cuLibraryUnload") == 2 and not functions.loaded


def test_images_the_module_check_read_are_loaded_from_its_bytes_not_read_again(tmp_path, hook_library, monkeypatch):
    """A LOAD from launch plans keeps the bytes its module check read and hashed; the
    prefetch loads from them (their files are gone from disk here), reads from the
    archive only an image it was not given, and drops what it was given but does not
    load. The driver is stood in for, as above."""
    import itertools

    from foundry.runtime.code import binding as functions_module
    from foundry.runtime.code.binding import ArchiveFunctions
    from foundry.runtime.native.hook import Hook
    from foundry.runtime.sessions.validate import start_module_check

    handles, loaded = itertools.count(0x1000), []

    def driver_call(name, *args):
        if name == "cuLibraryLoadData":
            loaded.append(ctypes.string_at(args[0], 5)[4])  # which image: its fifth byte
        return next(handles) if name == "cuLibraryLoadData" else "context" if name == "cuCtxGetCurrent" else None

    monkeypatch.setattr(functions_module, "cu", driver_call)
    monkeypatch.setattr(functions_module, "driver", lambda: SimpleNamespace(CUlibrary=lambda h: h))
    blobs = tuple(b"\x7fELF" + bytes([i + 1]) * 300 for i in range(4))
    archive = write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=blobs)
    shas = sorted(b.sha256 for b in archive.catalog.modules.blobs)
    checked = start_module_check(archive, keep=frozenset(shas)).result().data
    given = {sha256: checked[sha256] for sha256 in (shas[0], shas[1], shas[3])}
    for sha256 in given:  # read again, these would be refused
        (tmp_path / "a" / "modules" / f"{sha256}.bin").unlink()
    functions = ArchiveFunctions(Hook.open_library(hook_library), archive, None, checked=given)
    assert functions.prefetch(set(shas[:3])) == 3
    assert sorted(loaded) == sorted(checked[sha256][4] for sha256 in shas[:3])  # the right bytes, each once
    assert functions.from_check == 2 and given == {}  # the third read from disk; the unloaded fourth dropped
    unchecked = ArchiveFunctions(Hook.open_library(hook_library), Archive.open(tmp_path / "a"), None)
    with pytest.raises(ArchiveError):  # without the check's bytes, the missing files are missed
        unchecked.prefetch(set(shas[:3]))


def test_a_load_from_plans_keeps_the_plans_images_until_its_restore_or_finish(tmp_path, hook_library):
    from foundry.archive.schema import PlanKernel
    from foundry.runtime.native.hook import Hook
    from foundry.runtime.sessions.validate import start_module_check

    blobs = (b"\x7fELF" + bytes(60), b"\x7fELF" + bytes(90))
    archive = write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=blobs)
    shas = sorted(b.sha256 for b in archive.catalog.modules.blobs)
    plan = LaunchPlan(file="plans/g.fgb", sha256="0" * 64, size=0, kernels=(PlanKernel(shas[1], "k"),))

    def session_with_plans(builder: str = "native") -> LoadSession:
        session = LoadSession(archive, builder=builder)
        graphs = tuple(msgspec.structs.replace(e, plan=plan) for e in session.record.graphs)
        session.record = msgspec.structs.replace(session.record, graphs=graphs)
        return session

    session = session_with_plans()
    assert session._plan_images() == {shas[1]}  # the plans' images only
    assert session_with_plans("python")._plan_images() == frozenset()
    with_backend = session_with_plans()
    with_backend.backends = [object()]  # backend state: the IR path, no plan read or image kept ahead
    with_backend._prefetch_plans()
    assert with_backend._plan_images() == frozenset() and with_backend._plans_read is None

    def opened() -> LoadSession:
        opened = session_with_plans()
        opened.module_check = start_module_check(archive, keep=opened._plan_images())  # what start() leaves running
        opened._wait_for_module_check()
        assert list(opened.checked_images) == [shas[1]] and opened.report["module_check_s"] >= 0
        assert opened.report["images_kept_bytes"] == len(archive.module(shas[1]))
        return opened

    restored = opened()
    restored._plans_apply = lambda: False
    restored._restore_from_ir = lambda: {}  # the GPU's part of a restore, which this machine cannot run
    assert restored._restore() == {} and restored.checked_images == {}  # freed once the graphs are built
    failed = opened()
    failed._plans_apply = lambda: False

    def refused() -> dict:
        raise ArchiveError("stands in for a refused restore")

    failed._restore_from_ir = refused
    with pytest.raises(ArchiveError):
        failed._restore()
    assert failed.checked_images == {}  # freed by a refused restore too
    unused = opened()  # a LOAD whose program never asked for a graph
    unused.hook = Hook.open_library(hook_library)  # not started: no CUDA here
    unused.finish()
    assert unused.checked_images == {}


def test_images_loaded_ahead_on_a_thread_use_the_callers_context(tmp_path, hook_library, monkeypatch):
    """LOAD starts loading the archived images while it reads the plans and maps the
    region: every load runs off the calling thread, in the context the caller had
    current; a corrupted image is refused through the future, and a thread with no
    context current at once. The driver is stood in for, as above."""
    import itertools
    import threading

    from foundry.runtime.code import binding as functions_module
    from foundry.runtime.code.binding import ArchiveFunctions
    from foundry.runtime.native.hook import Hook

    handles, calls = itertools.count(0x1000), []
    current = threading.local()

    def driver_call(name, *args):
        calls.append((name, threading.get_ident(), args))
        if name == "cuCtxSetCurrent":
            current.context = args[0]
        if name == "cuCtxGetCurrent":
            return getattr(current, "context", caller_context if threading.get_ident() == main else 0)
        return next(handles) if name == "cuLibraryLoadData" else None

    main, caller_context = threading.get_ident(), 0xC0
    monkeypatch.setattr(functions_module, "cu", driver_call)
    monkeypatch.setattr(functions_module, "driver", lambda: SimpleNamespace(CUlibrary=lambda h: h))
    blobs = (b"\x7fELF" + bytes(300), b"\x7fELF" + bytes(500))
    archive = write_archive(tmp_path / "a", [Archive.open(SAVE_A).graph(0, "sample.bs8")], like=SAVE_A, modules=blobs)
    shas = {b.sha256 for b in archive.catalog.modules.blobs}
    loaded, seconds = ArchiveFunctions(Hook.open_library(hook_library), archive, None).prefetch_ahead(shas).result()
    assert loaded == 2 and seconds >= 0
    loads = [thread for name, thread, _ in calls if name == "cuLibraryLoadData"]
    assert len(loads) == 2 and main not in loads
    assert {args[0] for name, _, args in calls if name == "cuCtxSetCurrent"} == {0xC0}

    victim = sorted(shas)[1]
    (tmp_path / "a" / "modules" / f"{victim}.bin").write_bytes(b"\x7fELF" + bytes(499) + b"!")
    calls.clear()
    with pytest.raises(ArchiveError):
        ArchiveFunctions(Hook.open_library(hook_library), Archive.open(tmp_path / "a"), None).prefetch_ahead(
            shas
        ).result()
    assert not [name for name, _, _ in calls if name == "cuLibraryLoadData"]

    caller_context = 0  # no context current on the restoring thread: refused there, nothing loaded
    with pytest.raises(HookError, match="no CUDA context is current"):
        ArchiveFunctions(Hook.open_library(hook_library), archive, None).prefetch_ahead(shas)


def test_inspect_says_which_graphs_have_launch_plans(tmp_path):
    import json
    import subprocess
    import sys

    source = Archive.open(SAVE_A)
    graphs = [source.graph(0, "decode.bs8"), source.graph(0, "sample.bs8")]
    write_archive(
        tmp_path / "a", graphs, like=SAVE_A, plan_of=lambda ir: make_plan(ir) if ir.name == "decode.bs8" else None
    )
    run = [sys.executable, "-m", "foundry", "archive", "inspect", str(tmp_path / "a")]
    data = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True).stdout)
    assert {g["graph"]: g["plan"] for g in data["graphs"]} == {"decode.bs8": True, "sample.bs8": False}
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "launch plans (LOAD --builder native without decoding the IR): 1 of 2 graphs" in text
