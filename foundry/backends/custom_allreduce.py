"""``custom-allreduce``: SGLang's custom all-reduce over CUDA IPC and symmetric memory.

Two generations share the kind ``custom-allreduce``:

- **V2**, SGLang 0.5.17's default on CUDA: kernels SGLang builds from its own source
  (:mod:`foundry.backends.custom_allreduce_abi`). Their one parameter holds every
  rank's symmetric-memory workspace, which this backend relocates (``car.ws<r>``,
  one region per rank's slab), and, in graph mode, a row of SGLang's device pointer
  table ``graph_params``: after capture, SGLang writes there, per captured all-reduce,
  the address of its input on every rank, opened through CUDA IPC. Those rows are data,
  not graph parameters, so no patch reaches them: a LOAD must have the program register
  its graph inputs again (through the hook's IPC path, which puts peer memory at SAVE's
  addresses) and this backend proves the live rows equal to SAVE's, row by row.
- **legacy** ``sglang::cross_device_reduce_{1,2}stage`` (sglang-kernel 0.4.5; names in
  ``tests/fixtures/kernel_names/sglang_kernel.txt``): its peer pointers sit in
  ``rank_data``, which only a capture fills, so it is recognised for lint and refused
  at LOAD by name.

State (version 1): world size, rank, the workspace layout (slab, push and pull bytes,
block counts), whether multicast is there, the table's address and its registered rows.
LOAD refuses any difference by field, a graph kernel of another world size or rank,
a workspace word outside its rank's slab or at another place in it, a table row
beyond those registered, a multicast kernel without multicast, and any kernel given a
multicast workspace (``pull_mc_workspace``: multicast memory is not relocated).
"""

from __future__ import annotations

import re
from typing import Any

from foundry.archive.schema import BackendState
from foundry.backends.base import (
    Backend,
    KernelMatch,
    LiveState,
    SaveState,
    require_same,
    require_state_version,
    roles,
)
from foundry.backends.custom_allreduce_abi import fields, jit_kernel, params_size, word, workspace_offsets
from foundry.errors import BackendError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.nodes import KernelNode
from foundry.graphir.operands import Operand, OperandSite
from foundry.graphir.regions import Region, RegionKind

_LEGACY = re.compile(r"(?:^|::)cross_device_reduce_(?:1stage|2stage)$")
# Layout from tests/fixtures/kernel_names/sglang_kernel.txt: RankSignals, a 64-byte
# struct of peer signal pointers, passed by value at offset 16.
_LEGACY_ABI = roles(
    "rank_data",
    "peer_signals",
    "self_signal",
    "output",
    "rank",
    "world_size",
    pointers=("rank_data", "peer_signals", "self_signal", "output"),
)
_V2_ABI = roles("params", pointers=("params",))
_EXACT = ("world_size", "rank", "workspace_bytes", "push_bytes", "pull_bytes", "num_pull_blocks",
          "num_push_blocks", "multicast", "graph_params")  # fmt: skip
_REGION = "car.ws"


class CustomAllReduceBackend(Backend):
    name = "custom-allreduce"
    description = "SGLang's custom all-reduce: V2 (JIT, symmetric memory) relocated; legacy sgl-kernel recognised"
    kinds = frozenset({"custom-allreduce"})
    regions = (f"{_REGION}*",)
    # SGLang registers the graphs' inputs and fills the table after its capture loop
    after_graphs = ("rows", "inputs", "registrations")

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        found = jit_kernel(kernel)
        if found is not None:
            return self.match("custom-allreduce", _V2_ABI, "multimem" if found.mode == "multicast" else None)
        if "cross_device_reduce" in kernel.name and _LEGACY.search(kernel.short_name.removesuffix("<...>")):
            # its peer pointers live in rank_data, which only a capture fills: never relocatable
            return KernelMatch(self.name, "custom-allreduce", _LEGACY_ABI)
        return None

    def facts(
        self,
        *,
        rank: int,
        world_size: int,
        workspaces: list[int],
        workspace_bytes: int,
        push_bytes: int,
        pull_bytes: int,
        num_pull_blocks: int,
        num_push_blocks: int,
        multicast: bool,
        graph_params: int,
        rows: list[list[int]] | None = None,
        inputs: list[tuple[int, int]] | None = None,
        registrations: list[int] | None = None,
    ) -> dict[str, Any]:
        """A ``CustomAllReduceV2`` as the program built it: every rank's workspace slab
        (``workspaces[r]``, ``workspace_bytes`` each), the sizes its kernels were given,
        and the graph pointer table's address; once the graphs exist (``session.complete``),
        the table's rows, the graph inputs registered (address, bytes), and how many each
        registration took, in order."""
        if len(workspaces) != int(world_size) or any(len(row) != int(world_size) for row in rows or ()):
            raise BackendError("the workspaces and every table row must name one address per rank",
                               field="custom-allreduce.world_size", expected=world_size,
                               found=[len(workspaces), *{len(row) for row in rows or ()}])  # fmt: skip
        return {
            "rank": int(rank),
            "world_size": int(world_size),
            "workspaces": [int(w) for w in workspaces],
            "workspace_bytes": int(workspace_bytes),
            "push_bytes": int(push_bytes),
            "pull_bytes": int(pull_bytes),
            "num_pull_blocks": int(num_pull_blocks),
            "num_push_blocks": int(num_push_blocks),
            "multicast": bool(multicast),
            "graph_params": int(graph_params),
            "rows": None if rows is None else [[int(p) for p in row] for row in rows],
            "inputs": None if inputs is None else [[int(ptr), int(size)] for ptr, size in inputs],
            "registrations": None if registrations is None else [int(n) for n in registrations],
        }

    def regions_for(self, facts: dict[str, Any]) -> list[Region]:
        size = int(facts.get("workspace_bytes", 0))
        return [Region(f"{_REGION}{r}", RegionKind.BACKEND, int(base), size)
                for r, base in enumerate(facts.get("workspaces", ()))] if size else []  # fmt: skip

    def record(self, save: SaveState) -> BackendState:
        facts = save.backend_facts(self.name)
        missing = [k for k in (*_EXACT, "workspaces", *self.after_graphs) if facts.get(k) is None]
        if missing:
            raise BackendError("the program did not describe its custom all-reduce (what it registers after the "
                               "graphs: session.complete)", field="custom-allreduce", expected=missing)  # fmt: skip
        record: dict[str, Any] = {k: facts[k] for k in _EXACT}
        # a state record holds flat lists only
        record.update(rows=_flat(facts["rows"]), inputs=_flat(facts["inputs"]), registrations=facts["registrations"])
        return BackendState(self.name, self.state_version, record)

    def validate(self, state: BackendState, graphs: list[GraphIR], live: LiveState) -> None:
        require_state_version(self, state)
        facts = live.backend_facts(self.name)
        require_same(self.name, "the live custom all-reduce", _EXACT, state.record, facts)
        if facts.get("rows") is not None:  # given after the graphs (session.complete)
            _require_same_registrations(state.record, facts)
            _require_same_rows(state.record["rows"], _flat(facts["rows"]), state.record["world_size"])
        for ir in graphs:
            for node in ir.kernels():
                if self.recognise(node.kernel) is not None:
                    _check_node(ir, node, state.record)

    def relocate(self, operand: Operand, live: LiveState) -> int:
        facts = live.backend_facts(self.name)
        rank = operand.region.removeprefix(_REGION)
        owned = operand.region.startswith(_REGION) and rank.isdigit()
        if not owned or int(rank) >= len(facts.get("workspaces", ())):
            raise BackendError(f"backend 'custom-allreduce' does not own region {operand.region!r}",
                               found=operand.location())  # fmt: skip
        return facts["workspaces"][int(rank)] + operand.region_offset


def _flat(rows: list[list[int]]) -> list[int]:
    return [int(pointer) for row in rows for pointer in row]


def _require_same_registrations(record: dict[str, Any], facts: dict[str, Any]) -> None:
    """The program registered the graph inputs SAVE's did, in the same calls."""
    if facts.get("registrations") != record["registrations"]:
        raise BackendError("the live custom all-reduce registered its graph inputs in other calls than SAVE's",
                           field="custom-allreduce.registrations", expected=record["registrations"],
                           found=facts.get("registrations"))  # fmt: skip
    live = _flat(facts.get("inputs") or [])
    for at, (want, got) in enumerate(zip(record["inputs"], live, strict=False)):
        if want != got:
            index, part = divmod(at, 2)
            raise BackendError(f"graph input {index} registered with another {('address', 'size')[part]} than SAVE's",
                               field=f"custom-allreduce.inputs[{index}]", expected=want, found=got)  # fmt: skip
    if len(live) != len(record["inputs"]):
        raise BackendError("the live custom all-reduce registered another number of graph inputs than SAVE's",
                           field="custom-allreduce.inputs", expected=len(record["inputs"]) // 2,
                           found=len(live) // 2)  # fmt: skip


def _require_same_rows(recorded: list[int], live: list[int], world_size: int) -> None:
    """The graph pointer table as the live program registered it again, against SAVE's
    (both flat: ``world_size`` addresses a row)."""
    if len(live) != len(recorded):
        raise BackendError("the live custom all-reduce registered another number of graph inputs than SAVE's",
                           field="custom-allreduce.rows", expected=len(recorded) // world_size,
                           found=len(live) // world_size)  # fmt: skip
    for at, (want, got) in enumerate(zip(recorded, live, strict=True)):
        if want != got:
            index, rank = divmod(at, world_size)
            raise BackendError(f"row {index} of the graph pointer table holds another address for rank {rank}'s "
                               "input than at SAVE; peer memory must be opened where SAVE opened it",
                               field=f"custom-allreduce.rows[{index}][{rank}]", expected=hex(want),
                               found=hex(got))  # fmt: skip


def _check_node(ir: GraphIR, node: KernelNode, record: dict[str, Any]) -> None:
    found = jit_kernel(node.kernel)
    if found is None:
        raise BackendError("SGLang's legacy custom all-reduce keeps its peer pointers in rank_data, which only a "
                           "capture fills: SAVE with SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=1 (SGLang's default)",
                           field="custom-allreduce.kernel", node=node.id, kernel=node.kernel.name)  # fmt: skip
    world, rank = record["world_size"], record["rank"]
    if found.world_size != world:
        raise BackendError("a graph's custom all-reduce kernel was built for another world size",
                           field="custom-allreduce.world_size", node=node.id, expected=world,
                           found=found.world_size)  # fmt: skip
    if found.mode == "multicast" and not record["multicast"]:
        raise BackendError("a multicast custom all-reduce kernel needs NVLink multicast, which this process lacks",
                           field="custom-allreduce.multicast", node=node.id, kernel=node.kernel.name)  # fmt: skip
    layout = {f.name: f for f in fields(world)}
    if len(node.params) != params_size(world):
        raise BackendError("a custom all-reduce kernel's parameter is not AllReduceParams",
                           field="custom-allreduce.params", node=node.id, expected=params_size(world),
                           found=len(node.params))  # fmt: skip
    if word(node.params, layout["rank"]) != rank:
        raise BackendError("a graph's custom all-reduce runs as another rank (this rank was given another's part)",
                           field="custom-allreduce.rank", node=node.id, expected=rank,
                           found=word(node.params, layout["rank"]))  # fmt: skip
    multicast = word(node.params, layout["pull_mc_workspace"])
    if multicast:  # multicast memory is bound to its multicast object, which no relocation can recreate
        raise BackendError("a custom all-reduce kernel was given a multicast workspace, which Foundry does not "
                           "relocate: SAVE with TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                           field="custom-allreduce.pull_mc_workspace", node=node.id, expected=0,
                           found=hex(multicast))  # fmt: skip
    _check_workspaces(ir, node, record)
    if found.mode == "graph":
        _check_row(node, word(node.params, layout["graph_params"]), record)


def _check_workspaces(ir: GraphIR, node: KernelNode, record: dict[str, Any]) -> None:
    """Every workspace word points into its own rank's slab, where SGLang's layout puts it."""
    at = {o.offset: o for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
    places = workspace_offsets(record["world_size"], record["push_bytes"], record["pull_bytes"])
    for field in fields(record["world_size"]):  # in the struct's order, so the first wrong word is named
        if field.name not in places:
            continue
        rank, offset = places[field.name]
        operand = at.get(field.offset)
        if operand is None or operand.region != f"{_REGION}{rank}" or operand.region_offset != offset:
            raise BackendError(f"a custom all-reduce kernel's {field.name} is not rank {rank}'s workspace",
                               field=f"custom-allreduce.{field.name}", node=node.id,
                               expected=f"{_REGION}{rank}+{hex(offset)}",
                               found=operand.location() if operand else "no pointer")  # fmt: skip


def _check_row(node: KernelNode, pointer: int, record: dict[str, Any]) -> None:
    """A graph-mode kernel reads one registered row of the pointer table."""
    stride = 8 * record["world_size"]
    index, rest = divmod(pointer - record["graph_params"], stride)
    rows = len(record["rows"]) // record["world_size"]
    if rest or not 0 <= index < rows:
        raise BackendError("a custom all-reduce kernel reads a row of the graph pointer table that SGLang had not "
                           "registered", field="custom-allreduce.graph_params", node=node.id,
                           expected=f"one of {rows} rows at {hex(record['graph_params'])}",
                           found=hex(pointer))  # fmt: skip
