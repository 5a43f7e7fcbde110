"""``nccl-ipc``: NCCL collectives over deterministic peer memory.

NCCL 2.32 names its kernels ``ncclDevKernel_<Collective>[_<type>_<algo>]``
(``ncclDevKernel_Generic`` serves several collectives),
``ncclSymkDevKernel_<Collective>_<variant>`` for its symmetric kernels (variants
with ``MC`` use NVLink multicast) and ``oneRankReduce`` for single-rank
reductions. Names are checked against ``tests/fixtures/kernel_names/nccl.txt``.
NCCL-owned addresses cannot be rewritten: NCCL keeps pointers inside its own
device structures, which a parameter patch cannot reach. At LOAD this backend
therefore proves them identical instead: NCCL must allocate through the
deterministic region (``NCCL_CUMEM_ENABLE=0``, no graph or local buffer
registration), the region must sit at SAVE's base, and the communicator must be
the same (world size, rank, NCCL version). Its operands then relocate to
themselves.

Peer memory opened through the hook's IPC path lies in the import zone at
``zone + peer rank x slot + offset`` (``native/src/ipc_driver.c``); given the zone
and the peers (``session.attach("nccl-ipc", ..., import_zone=hook.import_zone(),
peers=[...])``), the backend names one region ``ipc.peer<r>`` per peer so SAVE
resolves those pointers, and LOAD requires the zone where SAVE had it.
"""

from __future__ import annotations

import os
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
from foundry.errors import BackendError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.operands import Operand
from foundry.graphir.regions import Region, RegionKind

_COLLECTIVE = re.compile(r"^nccl(?:Symk)?DevKernel_([A-Za-z]+?)(V)?(?:_|$)")
_MULTICAST = re.compile(r"_[A-Za-z]*MC(?:_|$)")

_KINDS = {
    "AllReduce": "nccl-allreduce",
    "AllGather": "nccl-allgather",
    "ReduceScatter": "nccl-reducescatter",
    "Broadcast": "nccl-broadcast",
    "Reduce": "nccl-reduce",
    "SendRecv": "nccl-sendrecv",
    "Generic": "nccl-collective",
}

# Every NCCL device kernel takes one by-value argument block.
_ARGS = roles("args")

# The settings that make NCCL allocate its buffers through cudaMalloc (so through the
# deterministic region) and never register graph or user buffers behind Foundry's back.
PINNED_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_GRAPH_REGISTER": "0", "NCCL_LOCAL_REGISTER": "0"}
_EXACT = ("world_size", "rank", "nccl_version", "region_base", "import_zone", "peers")


class NcclIpcBackend(Backend):
    name = "nccl-ipc"
    description = "NCCL collectives; addresses proven identical through deterministic peer memory"
    kinds = frozenset({*_KINDS.values(), "nccl-onerank", "nccl-internal"})
    regions = ("ipc.peer*", "nccl.*")
    state_version = 2  # 2: the import zone and the peers

    def facts(
        self,
        *,
        world_size: int,
        rank: int,
        nccl_version: str,
        env: dict[str, str] | None = None,
        region_base: int | None = None,
        import_zone: tuple[int, int, int] | None = None,
        peers: list[int] | None = None,
    ) -> dict[str, Any]:
        """The communicator as the program sees it; ``env`` defaults to this process's.
        ``import_zone`` is the hook's ``(base, slot size, slots)``; ``peers`` the ranks
        whose memory this process opened there."""
        source = os.environ if env is None else env
        zone = None if import_zone is None else [int(v) for v in import_zone]
        if zone is not None and any(not 0 <= int(p) < zone[2] for p in peers or ()):
            raise BackendError("a peer rank has no slot in the import zone", field="nccl-ipc.peers", found=peers)
        return {
            "world_size": int(world_size),
            "rank": int(rank),
            "nccl_version": str(nccl_version),
            "region_base": region_base,
            "import_zone": zone,
            "peers": sorted(int(p) for p in peers or ()),
            "env": {k: source.get(k) for k in PINNED_ENV},
        }

    def regions_for(self, facts: dict[str, Any]) -> list[Region]:
        zone = facts.get("import_zone")
        if not zone:
            return []
        base, slot, _ = zone
        return [Region(f"ipc.peer{p}", RegionKind.BACKEND, base + p * slot, slot) for p in facts.get("peers", ())]

    def record(self, save: SaveState) -> BackendState:
        facts = save.backend_facts(self.name)
        for key, want in PINNED_ENV.items():
            if facts.get("env", {}).get(key) != want:
                raise BackendError(
                    f"NCCL must run with {key}={want} so its buffers land in the region",
                    field=f"nccl-ipc.env.{key}",
                    expected=want,
                    found=facts.get("env", {}).get(key),
                )
        facts = {**facts, "region_base": save.backend_facts(RegionKind.VMM).get("base", facts.get("region_base"))}
        if facts["region_base"] is None:
            raise BackendError("the session did not tell the backend where the region is", field="nccl-ipc.region_base")
        record = {k: facts[k] for k in _EXACT}
        record.update({f"env.{k}": v for k, v in facts["env"].items()})
        return BackendState(self.name, self.state_version, record)

    def validate(self, state: BackendState, graphs: list[GraphIR], live: LiveState) -> None:
        require_state_version(self, state)
        facts = dict(live.backend_facts(self.name))
        facts["region_base"] = live.backend_facts(RegionKind.VMM).get("base", facts.get("region_base"))
        require_same(self.name, "the live NCCL communicator", _EXACT, state.record, facts)
        for key in PINNED_ENV:
            if facts.get("env", {}).get(key) != state.record.get(f"env.{key}"):
                raise BackendError(
                    f"NCCL runs with another {key} than at SAVE",
                    field=f"nccl-ipc.env.{key}",
                    expected=state.record.get(f"env.{key}"),
                    found=facts.get("env", {}).get(key),
                )

    def relocate(self, operand: Operand, live: LiveState) -> int:
        # validate() proved the region and the communicator identical: NCCL's addresses stay
        return operand.value

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if "ncc" not in kernel.name and "oneRankReduce" not in kernel.name and "diagP2p" not in kernel.name:
            return None
        name = kernel.short_name.removesuffix("<...>")
        found = _COLLECTIVE.match(name)
        if found:
            kind = _KINDS.get(found.group(1))
            if kind is None:
                return self.match("nccl-internal")
            requires = "multimem" if _MULTICAST.search(name) else None
            return self.match(kind, _ARGS, requires)
        if name.endswith("::oneRankReduce") or name == "oneRankReduce":
            return self.match("nccl-onerank")
        if name.startswith(("ncclProgressCounter", "diagP2p")):
            return self.match("nccl-internal")
        return None
