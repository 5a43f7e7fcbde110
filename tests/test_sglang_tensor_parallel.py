"""The SGLang plugin at --tp-size 2: its custom all-reduce noted, registered and described.

SGLang's ``CustomAllReduceV2`` exists only on two or more GPUs with torch's CUDA build,
neither of which this machine has: it is stood in for by an object with the attributes
the plugin reads (the contract test in test_sglang_contract.py holds them to SGLang
0.5.17's source); its table is a list of rows. What is not stood in for: the plugin's
hooks, the notes, the facts and the ``custom-allreduce`` backend that checks them."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from foundry.backends.base import ProcessFacts
from foundry.backends.custom_allreduce import CustomAllReduceBackend
from foundry.errors import FoundryError
from foundry.integrations.sglang import tensor_parallel
from foundry.integrations.sglang.tensor_parallel import CustomAllReduceNotes

SLAB = 80 * (1 << 20) + 8192
PEERS = [0x7F0000000000, 0x7F0040000000]  # every rank's slab, as this process maps them
TABLE = 0x600000200000


class Table:
    """``graph_params``: rows of world-size addresses, as the device table holds them."""

    def __init__(self) -> None:
        self.rows: list[list[int]] = []

    def data_ptr(self) -> int:
        return TABLE

    def __getitem__(self, rows: slice) -> Table:
        part = Table()
        part.rows = self.rows[rows]
        return part

    def cpu(self) -> Table:
        return self

    def tolist(self) -> list[list[int]]:
        return [list(row) for row in self.rows]


class Slab:
    def numel(self) -> int:
        return SLAB


class StandInCustomAllReduce:
    """What ``CustomAllReduceV2`` holds once built, rank 0 of 2; its cudaIpc registration
    writes each input's row (this rank's address, the peer's opened in the import zone)."""

    def __init__(self, disabled: bool = False) -> None:
        self.disabled, self.rank, self.world_size = disabled, 0, 2
        self._symm_tensor, self.graph_params = Slab(), Table()
        self.max_push_size = self.max_pull_size = 16 << 20
        self.config = types.SimpleNamespace(num_pull_blocks=64, num_push_blocks=132, num_mc_blocks=None)
        self.mc_base_ptr = 0  # no NVLink multicast
        self._graph_inputs: list[tuple[int, int]] = []
        self._graph_counter = 0
        self.loop = 0  # which of SGLang's capture loops is ending
        self.ipc_calls: list[tuple[int, list[tuple[int, int]]]] = []

    def _register_graph_inputs_ipc(self) -> None:
        self.ipc_calls.append((self.loop, list(self._graph_inputs)))
        self.graph_params.rows += [[ptr, 0x620000000000 + (ptr - 0x600000000000)] for ptr, _ in self._graph_inputs]
        self._graph_counter += len(self._graph_inputs)
        self._graph_inputs.clear()


def built(notes: CustomAllReduceNotes, disabled: bool = False, multicast: int = 0) -> StandInCustomAllReduce:
    """A custom all-reduce built and noted as the plugin's hook notes it (SGLang catches its refusals)."""
    ca = StandInCustomAllReduce(disabled)
    ca.mc_base_ptr = multicast
    notes.handles[id(ca._symm_tensor)] = types.SimpleNamespace(buffer_ptrs=PEERS)
    with tensor_parallel.keeping_refusal(notes):
        tensor_parallel.note_communicator(notes, ca)
    return ca


def run(notes: CustomAllReduceNotes, ca: StandInCustomAllReduce, mode: str, captured: list[list]) -> None:
    """SGLang's capture loops, each ending its graph_capture context with a registration."""
    for ca.loop, inputs in enumerate(captured):
        ca._graph_inputs.extend(inputs)  # a capture's all-reduces, each taking a row
        tensor_parallel.register_inputs(notes, ca, mode)


CAPTURED = [[(0x600010000000, 8192), (0x600010002000, 8192)], [], [(0x600010004000, 4096)]]


def test_save_notes_each_registration_and_describes_the_table():
    notes = CustomAllReduceNotes()
    ca = built(notes)
    before = tensor_parallel.communicator_facts(notes, complete=False)
    assert before["workspaces"] == PEERS and before["workspace_bytes"] == SLAB and "rows" not in before
    run(notes, ca, "save", CAPTURED)
    assert ca.ipc_calls == [(0, CAPTURED[0]), (2, CAPTURED[2])]  # SGLang's cudaIpc path, never its VMM one
    facts = tensor_parallel.communicator_facts(notes, complete=True)
    assert facts["registrations"] == [2, 0, 1] and facts["inputs"] == [*CAPTURED[0], *CAPTURED[2]]
    assert facts["rows"][2] == [0x600010004000, 0x620000000000 + 0x10004000]
    state = CustomAllReduceBackend().record(ProcessFacts(0, 2, {"custom-allreduce": CustomAllReduceBackend().facts(
        **facts)}))  # fmt: skip
    assert state.record["registrations"] == [2, 0, 1]


def test_load_hands_sglang_saves_inputs_and_the_backend_finds_the_same_table():
    backend = CustomAllReduceBackend()
    saving = CustomAllReduceNotes()
    run(saving, built(saving), "save", CAPTURED)
    facts = tensor_parallel.communicator_facts(saving, complete=True)
    state = backend.record(ProcessFacts(0, 2, {"custom-allreduce": backend.facts(**facts)}))

    loading = CustomAllReduceNotes(recorded=state.record)
    ca = built(loading)
    run(loading, ca, "load", [[], [], []])  # nothing captured: three registrations of nothing
    assert ca.ipc_calls == [(0, CAPTURED[0]), (2, CAPTURED[2])]  # each in the loop that registered it at SAVE
    live = backend.facts(**tensor_parallel.communicator_facts(loading, complete=True))
    backend.validate(state, [], ProcessFacts(0, 2, {"custom-allreduce": live}))


def test_a_load_that_captured_an_all_reduce_is_refused():
    loading = CustomAllReduceNotes(recorded={"registrations": [1], "inputs": [0x600010000000, 8192]})
    ca = built(loading)
    with pytest.raises(FoundryError, match="a graph was captured") as err:
        run(loading, ca, "load", [[(0x600020000000, 8192)]])
    assert err.value.field == "sglang.custom_all_reduce"


def test_one_custom_all_reduce_a_scheduler_and_disabled_ones_are_ignored():
    notes = CustomAllReduceNotes()
    built(notes, disabled=True)
    assert notes.communicator is None
    ca = built(notes)
    with pytest.raises(FoundryError, match="second custom all-reduce"):
        built(notes)
    # SGLang catches it (and goes on without that group's custom all-reduce): said again at the graph phase
    with pytest.raises(FoundryError, match="second custom all-reduce") as err:
        tensor_parallel.raise_refusal(notes)
    assert err.value.field == "sglang.custom_all_reduce"
    tensor_parallel.raise_refusal(CustomAllReduceNotes())  # nothing refused: nothing raised
    other = StandInCustomAllReduce()
    with pytest.raises(FoundryError, match="did not note"):
        tensor_parallel.register_inputs(notes, other, "save")
    assert notes.communicator is ca


def test_multicast_memory_is_refused_when_sglang_makes_it_and_said_again_later():
    built(CustomAllReduceNotes())  # no multicast: nothing
    notes = CustomAllReduceNotes()
    with pytest.raises(FoundryError, match="TORCH_SYMM_MEM_DISABLE_MULTICAST=1") as err:
        built(notes, multicast=0x7D0000000000)
    assert err.value.field == "sglang.custom_all_reduce.multicast"
    with pytest.raises(FoundryError, match="multicast memory"):
        tensor_parallel.raise_refusal(notes)


def test_facts_need_the_workspace_the_plugin_noted():
    notes = CustomAllReduceNotes()
    built(notes)
    notes.handles.clear()
    with pytest.raises(FoundryError, match="workspace was not made where the plugin notes it"):
        tensor_parallel.communicator_facts(notes, complete=False)


def test_a_tensor_parallel_save_needs_a_save_id_and_pins_nccl(monkeypatch):
    from foundry.backends.nccl_ipc import PINNED_ENV
    from foundry.integrations.sglang import plugin
    from foundry.integrations.sglang.config import PluginConfig

    for name in (*PINNED_ENV, "FOUNDRY_SAVE_ID"):
        monkeypatch.setenv(name, "")  # so that what the plugin sets is undone after the test
        monkeypatch.delenv(name)
    config = PluginConfig(mode="save", archive="/tmp/unused")
    with pytest.raises(FoundryError, match="FOUNDRY_SAVE_ID") as err:
        plugin._prepare_tensor_parallel(config)
    assert err.value.field == "FOUNDRY_SAVE_ID"
    monkeypatch.setattr(plugin.patching, "install", lambda points, handlers, engine: installed.append(points))
    installed: list = []
    monkeypatch.setenv("FOUNDRY_SAVE_ID", "tp2-save")
    plugin._prepare_tensor_parallel(config)
    assert installed == [plugin.TP_HOOK_POINTS]
    assert all(os.environ[k] == v for k, v in PINNED_ENV.items())
    monkeypatch.setenv("FOUNDRY_SAVE_FIRST_RUN", "/srv/a")  # a launcher's later run: not merged across ranks yet
    with pytest.raises(FoundryError, match="--save-runs 1") as err:
        plugin._prepare_tensor_parallel(config)
    assert err.value.field == "FOUNDRY_SAVE_FIRST_RUN"
    plugin._prepare_tensor_parallel(PluginConfig(mode="load", archive="/tmp/unused"))  # a LOAD needs neither


def test_the_swapped_ranks_control_is_refused_as_another_ranks_part_not_as_damage(tmp_path):
    """recipes/sglang/swap_ranks.py on a real two-rank archive (each rank a graph captured on
    the H200): every hash matches after the swap, and reading a rank names field ``rank``."""
    from foundry.archive import Archive, ArchiveWriter
    from foundry.errors import ArchiveError

    from .conftest import FIXTURES, load_script

    source = Archive.open(FIXTURES / "compiled-triton")
    writer = ArchiveWriter(tmp_path / "tp2", environment=source.catalog.environment, world_size=2)
    for rank in (0, 1):
        writer.rank(rank).add_graph(source.graph(0, "compiled.fused"))
        writer.rank(rank).seal()
    writer.commit()
    script = load_script(Path(__file__).resolve().parent.parent / "recipes" / "sglang" / "swap_ranks.py", "swap_ranks")
    script.swap(tmp_path / "tp2")
    swapped = Archive.open(tmp_path / "tp2")
    for rank in (0, 1):
        with pytest.raises(ArchiveError, match="another rank") as err:
            swapped.session(rank)
        assert (err.value.field, err.value.expected, err.value.found) == ("rank", rank, 1 - rank)
    script.swap(tmp_path / "tp2")  # swapped back, each rank reads its own part again
    assert [Archive.open(tmp_path / "tp2").session(r).rank for r in (0, 1)] == [0, 1]
