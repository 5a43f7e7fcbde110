"""The torch-symm-mem backend's record, validate and relocate steps, on the
symmetric-memory graph captured on the H200 (tests/fixtures/symm-mem-ws1: a
matmul, a one-shot and a two-shot all-reduce at world size 1)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from foundry.archive import Archive
from foundry.backends.torch_symm_mem import REGIONS, TorchSymmMemBackend, facts_regions
from foundry.errors import BackendError, FoundryError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity, LaunchConfig, ParamLayout, ParamSlot
from foundry.graphir.nodes import KernelNode

from .archive_tools import edit_json
from .conftest import FIXTURES


class Process:
    """A SAVE or LOAD process as backends see it: facts per backend."""

    rank, world_size = 0, 1

    def __init__(self, facts: dict) -> None:
        self.facts = facts

    def backend_facts(self, backend: str) -> dict:
        return self.facts


@pytest.fixture(scope="module")
def graph() -> GraphIR:
    return Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce")


@pytest.fixture
def saved(graph) -> dict:
    """SAVE's facts, read back from the regions the graph was lowered against."""
    regions = {name: graph.regions[name] for name in REGIONS}
    return {"group": "0", "world_size": 1, "rank": 0, "dtype": "bfloat16",
            "buffer_size": regions["symm.buffer"].size, "signal_pad_size": regions["symm.signal_pad"].size,
            "multimem": False, **{name: r.base for name, r in regions.items()}}  # fmt: skip


def test_record_then_validate_the_same_process(graph, saved):
    backend = TorchSymmMemBackend()
    state = backend.record(Process(saved))
    assert state.backend == "torch-symm-mem" and state.version == 1 and state.record["dtype"] == "bfloat16"
    backend.validate(state, [graph], Process(saved))
    assert [r.name for r in facts_regions(saved)] == list(REGIONS)
    assert set(backend.implements()) == {"recognise", "record", "validate", "relocate"}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("world_size", 2, "differs from SAVE's in world_size"),
    ("rank", 1, "differs from SAVE's in rank"),
    ("dtype", "float32", "differs from SAVE's in dtype"),
    ("group", "tp", "differs from SAVE's in group"),
])  # fmt: skip
def test_every_drift_is_refused_by_name(graph, saved, key, value, message):
    backend = TorchSymmMemBackend()
    state = backend.record(Process(saved))
    with pytest.raises(BackendError, match=message) as err:
        backend.validate(state, [graph], Process({**saved, key: value}))
    assert err.value.field == f"torch-symm-mem.{key}" and err.value.found == value


def test_a_smaller_buffer_is_refused_and_a_larger_one_accepted(graph, saved):
    backend = TorchSymmMemBackend()
    state = backend.record(Process(saved))
    with pytest.raises(BackendError, match="smaller than SAVE's") as err:
        backend.validate(state, [graph], Process({**saved, "buffer_size": saved["buffer_size"] // 2}))
    assert err.value.field == "torch-symm-mem.buffer_size"
    backend.validate(state, [graph], Process({**saved, "buffer_size": 2 * saved["buffer_size"]}))


def test_relocation_goes_to_the_live_handle(graph, saved):
    backend = TorchSymmMemBackend()
    live = {**saved, **{name: saved[name] + 0x10_0000_0000 for name in REGIONS}}
    owned = [o for o in graph.operands if o.region.startswith("symm.")]
    assert {o.region for o in owned} >= {"symm.buffer_ptrs", "symm.signal_pad_ptrs"}
    for operand in owned:
        assert backend.relocate(operand, Process(live)) == live[operand.region] + operand.region_offset
    other = next(o for o in graph.operands if not o.region.startswith("symm."))
    with pytest.raises(BackendError, match="does not own region"):
        backend.relocate(other, Process(live))


def test_multimem_kernels_need_multicast(saved):
    names = (FIXTURES / "kernel_names" / "torch.txt").read_text().split()
    mangled = next(n for n in names if "multimem_all_reduce_kernel" in n)
    ir = GraphIR("multimem")
    ir.add_nodes([KernelNode(0, KernelIdentity(mangled), LaunchConfig((1, 1, 1), (32, 1, 1)),
                             ParamLayout.of([ParamSlot(0, 8)]), bytes(8))])  # fmt: skip
    backend = TorchSymmMemBackend()
    state = backend.record(Process(saved))
    with pytest.raises(BackendError, match="NVLink multicast") as err:
        backend.validate(state, [ir], Process(saved))
    assert err.value.field == "torch-symm-mem.multimem"
    backend.validate(state, [ir], Process({**saved, "multimem": True}))


def test_record_needs_the_programs_description(saved):
    with pytest.raises(BackendError, match="did not describe") as err:
        TorchSymmMemBackend().record(Process({"group": "0"}))
    assert "world_size" in err.value.expected


def test_a_state_record_of_another_version_is_refused(graph, saved):
    backend = TorchSymmMemBackend()
    state = msgspec.structs.replace(backend.record(Process(saved)), version=2)
    with pytest.raises(BackendError, match="another version"):
        backend.validate(state, [graph], Process(saved))


def started(session):
    """A LOAD session as start() leaves it, without the GPU start() needs: attach() only
    asks that it ran (the hook itself is not used before the graphs are built)."""
    session.hook = None
    return session


def live_handle(saved: dict, *, buffer: int | None = None, signal_pad: int | None = None) -> SimpleNamespace:
    """A world-size-1 rendezvous handle as the live process would attach it: SAVE's
    sizes and device tables, its buffer and signal pad where given."""
    return SimpleNamespace(world_size=1, rank=0, buffer_size=saved["buffer_size"],
                           signal_pad_size=saved["signal_pad_size"], buffer_ptrs=[buffer or saved["symm.buffer"]],
                           signal_pad_ptrs=[signal_pad or saved["symm.signal_pad"]],
                           buffer_ptrs_dev=saved["symm.buffer_ptrs"],
                           signal_pad_ptrs_dev=saved["symm.signal_pad_ptrs"])  # fmt: skip


@pytest.fixture
def recorded(saved, tmp_path) -> Path:
    """A copy of the symmetric-memory archive whose session holds torch-symm-mem state."""
    archive = tmp_path / "symm"
    shutil.copytree(FIXTURES / "symm-mem-ws1", archive)
    state = TorchSymmMemBackend().record(Process(saved))
    record = {"backend": state.backend, "version": state.version, "record": state.record}
    edit_json(archive / "rank0" / "session.json", lambda s: s.update(backends=[record]), root=archive)
    return archive


def test_load_requires_the_program_to_attach_what_the_archive_recorded(graph, saved, recorded):
    """LOAD's offline half: an archive with a torch-symm-mem state record is accepted
    (the backend validates and relocates), the program must attach its handle, and
    the recorded state is validated against the attached one."""
    from foundry.errors import DriftError
    from foundry.runtime.sessions.load import LoadSession

    session = started(LoadSession(recorded))
    with pytest.raises(DriftError, match="did not attach"):
        session._validate_backends([graph])
    with pytest.raises(DriftError, match="records no state for backend 'nccl-ipc'"):
        session.attach("nccl-ipc", comm=None)
    handle = live_handle(saved)
    session.attach("torch-symm-mem", handle=handle, group="0", dtype="bfloat16")
    session._validate_backends([graph])
    with pytest.raises(BackendError, match="in dtype"):  # refused when attached, before the warm-up
        session.attach("torch-symm-mem", handle=handle, group="0", dtype="float16")
    session._validate_backends([graph])  # the refused handle was not kept
    with pytest.raises(BackendError, match="in world_size"):
        session.attach("torch-symm-mem", handle=SimpleNamespace(**{**vars(handle), "world_size": 2}), group="0",
                       dtype="bfloat16")  # fmt: skip


def test_attach_refuses_objects_it_cannot_read(recorded):
    from foundry.runtime.sessions.load import LoadSession

    session = started(LoadSession(recorded))
    with pytest.raises(BackendError, match="cannot read the objects") as err:
        session.attach("torch-symm-mem", handle=object(), group="0", dtype="bfloat16")
    assert err.value.field == "torch-symm-mem"
    with pytest.raises(BackendError, match="cannot read the objects"):
        session.attach("torch-symm-mem", handle=object())  # dtype and group missing


def test_load_refuses_communicator_kernels_saved_without_their_backend(graph):
    from foundry.errors import DriftError
    from foundry.runtime.sessions.load import LoadSession

    session = LoadSession(FIXTURES / "symm-mem-ws1")  # captured before backends recorded state
    with pytest.raises(DriftError, match="recorded no 'torch-symm-mem' state") as err:
        session._check_claims([graph])
    assert err.value.node == 2


def test_the_load_report_counts_the_operands_each_backend_patched(graph, saved, recorded):
    """LOAD's relocation report: per region, its backend, the operands patched and how
    many of them now hold another value than at SAVE (the moved buffer's)."""
    from foundry.runtime.sessions.load import LoadSession

    moved = {name: saved[name] + 0x10_0000_0000 for name in ("symm.buffer", "symm.signal_pad")}
    handle = live_handle(saved, buffer=moved["symm.buffer"], signal_pad=moved["symm.signal_pad"])
    session = started(LoadSession(recorded))
    session.attach("torch-symm-mem", handle=handle, group="0", dtype="bfloat16")
    symm = Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce")  # a fresh copy of the graph
    symm.set_operands(o for o in graph.operands if o.region.startswith("symm."))  # it predates the vmm region
    report = session._relocation_report([symm])
    assert sum(r["operands"] for r in report.values()) == len(symm.operands)
    assert {r["backend"] for r in report.values()} == {"torch-symm-mem"}
    for region, tally in report.items():
        expect_moved = tally["operands"] if region in moved else 0  # the device tables stayed put
        assert tally["moved"] == expect_moved, region
    with pytest.raises(FoundryError, match="attach\\(\\) before start\\(\\)"):
        LoadSession(recorded).attach("torch-symm-mem", handle=handle, group="0", dtype="bfloat16")


@pytest.mark.parametrize(("key", "value"), [("world_size", 2), ("rank", 1)])
def test_an_archive_edited_to_another_world_size_or_rank_is_refused_at_attach(saved, recorded, key, value):
    """One GPU cannot host two NCCL ranks: the archive's state record is edited (and
    re-sealed) instead, and the live world-size-1 handle of rank 0 no longer matches."""
    from foundry.runtime.sessions.load import LoadSession

    def edit(session: dict) -> None:
        session["backends"][0]["record"][key] = value

    edit_json(recorded / "rank0" / "session.json", edit, root=recorded)
    handle = live_handle(saved)
    session = started(LoadSession(recorded))
    with pytest.raises(BackendError, match=f"differs from SAVE's in {key}") as err:
        session.attach("torch-symm-mem", handle=handle, group="0", dtype="bfloat16")
    assert err.value.field == f"torch-symm-mem.{key}" and err.value.expected == value
