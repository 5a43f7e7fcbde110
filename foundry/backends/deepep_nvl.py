"""``deepep-nvl``: DeepEP expert-parallel kernels over CUDA IPC (no fabric handles).

sgl-deep-ep 0.1.2 puts its kernels in ``deep_ep::legacy::{internode_ll,
internode, intranode, layout}`` (``tests/fixtures/kernel_names/deepep.txt``);
older DeepEP builds lack the ``legacy`` level, so both are accepted. Each kernel's
parameters and where its pointers point are in :mod:`foundry.backends.deepep_abi`;
the kernels that take DeepEP's RDMA buffer (low-latency and internode) require
``nvshmem``, which makes them unrelocatable for lint and refused at LOAD where
the live buffer has no RDMA part. NVSHMEM maps its heap, and the RDMA buffer in
it, outside the deterministic region: SAVE names the buffer ``deepep.rdma`` so
that its pointers are the backend's, and LOAD accepts them only where the live
buffer is at SAVE's address.

State (version 2): NVL and RDMA buffer sizes, ``use_fabric`` (a SAVE with
fabric handles is refused: they cannot be restored), rank, world size, experts
per rank, the addresses of the buffers and the NVSHMEM settings (compared when
there is an RDMA buffer). DeepEP keeps peer pointers inside
its own device state, so, as for NCCL, LOAD proves the buffers identical
(same addresses, through the region and the peer import zone) rather than
patching them; any drift is refused by name.
"""

from __future__ import annotations

import os
import re
from typing import Any

from foundry.archive.schema import BackendState
from foundry.backends.base import Backend, KernelMatch, LiveState, SaveState, require_same, require_state_version
from foundry.backends.deepep_abi import abi, needs_nvshmem
from foundry.errors import BackendError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.operands import Operand
from foundry.graphir.regions import Region, RegionKind

_EXACT = ("num_nvl_bytes", "num_rdma_bytes", "rank", "world_size", "experts_per_rank")
# The NVSHMEM settings that shape DeepEP's RDMA buffer and its peers' mappings: the ones
# deep_ep.Buffer sets itself (sgl-deep-ep 0.1.2, checked by tests/test_deepep_contract.py)
# and the heap size. Read from the environment once the Buffer is built.
NVSHMEM_SETTINGS = (
    "NVSHMEM_CUMEM_GRANULARITY", "NVSHMEM_DISABLE_MNNVL", "NVSHMEM_DISABLE_NVLS", "NVSHMEM_DISABLE_P2P",
    "NVSHMEM_IBGDA_NUM_RC_PER_PE", "NVSHMEM_IB_ENABLE_IBGDA", "NVSHMEM_MAX_TEAMS", "NVSHMEM_QP_DEPTH",
    "NVSHMEM_SYMMETRIC_SIZE",
)  # fmt: skip

_QUALIFIED = re.compile(r"^deep_ep::(?:legacy::)?(internode_ll|internode|intranode|layout)::(\w+)$")

# kernel name -> kind; first matching prefix wins
_KINDS = (
    ("dispatch", "deepep-dispatch"),
    ("combine", "deepep-combine"),  # also combine_overlappable
    ("notify_dispatch", "deepep-notify"),
    ("cached_notify", "deepep-notify"),
    ("clean_", "deepep-clean"),
    ("barrier", "deepep-barrier"),
    ("get_dispatch_layout", "deepep-layout"),
    ("query_mask_buffer", "deepep-mask"),
    ("update_mask_buffer", "deepep-mask"),
)


class DeepEPNvlBackend(Backend):
    name = "deepep-nvl"
    description = "DeepEP dispatch/combine over NVLink peer buffers (CUDA IPC, use_fabric=False)"
    kinds = frozenset({kind for _, kind in _KINDS} | {"deepep-other"})
    regions = ("deepep.*", "nvshmem")
    state_version = 2  # 2: NVSHMEM settings

    def facts(
        self,
        *,
        num_nvl_bytes: int,
        num_rdma_bytes: int,
        use_fabric: bool,
        rank: int,
        world_size: int,
        experts_per_rank: int,
        buffers: dict[str, int],
        nvshmem: dict[str, str | None] | None = None,
    ) -> dict[str, Any]:
        """The ``deep_ep.Buffer`` as the program built it; ``buffers`` maps region names to
        addresses, ``nvshmem`` the NVSHMEM settings (default: this process's environment)."""
        settings = {k: os.environ.get(k) for k in NVSHMEM_SETTINGS} if nvshmem is None else dict(nvshmem)
        return {
            "nvshmem": {k: settings.get(k) for k in NVSHMEM_SETTINGS},
            "num_nvl_bytes": int(num_nvl_bytes),
            "num_rdma_bytes": int(num_rdma_bytes),
            "use_fabric": bool(use_fabric),
            "rank": int(rank),
            "world_size": int(world_size),
            "experts_per_rank": int(experts_per_rank),
            "buffers": {k: int(v) for k, v in buffers.items()},
        }

    def regions_for(self, facts: dict[str, Any]) -> list[Region]:
        """DeepEP's RDMA buffer, which NVSHMEM's heap holds (the NVL buffer is the region's)."""
        rdma, size = facts.get("buffers", {}).get("deepep.rdma"), facts.get("num_rdma_bytes")
        return [Region("deepep.rdma", RegionKind.BACKEND, int(rdma), int(size))] if rdma and size else []

    def record(self, save: SaveState) -> BackendState:
        facts = save.backend_facts(self.name)
        if facts.get("use_fabric"):
            raise BackendError(
                "fabric handles cannot be restored: build deep_ep.Buffer with use_fabric=False",
                field="deepep-nvl.use_fabric",
                expected=False,
                found=True,
            )
        record: dict[str, Any] = {k: facts[k] for k in _EXACT}
        record.update({f"buffers.{name}": address for name, address in sorted(facts["buffers"].items())})
        record.update({f"nvshmem.{k}": v for k, v in facts.get("nvshmem", {}).items()})
        return BackendState(self.name, self.state_version, record)

    def validate(self, state: BackendState, graphs: list[GraphIR], live: LiveState) -> None:
        facts = live.backend_facts(self.name)
        require_state_version(self, state)
        require_same(self.name, "the live DeepEP buffer", _EXACT, state.record, facts)
        if state.record.get("num_rdma_bytes"):  # NVSHMEM holds the RDMA buffer: its settings must not move
            live_settings = {f"nvshmem.{k}": v for k, v in facts.get("nvshmem", {}).items()}
            keys = [f"nvshmem.{k}" for k in NVSHMEM_SETTINGS]
            require_same(self.name, "the live NVSHMEM", keys, state.record, live_settings)
        if not facts.get("buffers", {}).get("deepep.rdma"):  # with one, no kernel is refused for lacking it
            for ir in graphs:
                for node in ir.kernels():
                    match = self.recognise(node.kernel)
                    if match is not None and match.requires == "nvshmem":
                        raise BackendError("a DeepEP kernel on the RDMA buffer (NVSHMEM) runs in a process whose "
                                           "Buffer has none", field="deepep-nvl.buffers.deepep.rdma", node=node.id,
                                           kernel=node.kernel.name)  # fmt: skip
        for key, address in state.record.items():
            if key.startswith("buffers.") and facts.get("buffers", {}).get(key.removeprefix("buffers.")) != address:
                raise BackendError(
                    "a DeepEP buffer is not where SAVE saw it; DeepEP keeps peer pointers in its own "
                    "device state, so it cannot be relocated",
                    field=f"deepep-nvl.{key}",
                    expected=hex(address),
                )

    def relocate(self, operand: Operand, live: LiveState) -> int:
        # validate() proved every buffer at SAVE's address: DeepEP's pointers stay
        return operand.value

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if "deep_ep" not in kernel.name:
            return None
        found = _QUALIFIED.match(kernel.short_name.removesuffix("<...>"))
        if found is None:
            return self.match("deepep-other")
        family, name = f"{found.group(1)}::{found.group(2)}", found.group(2)
        kind = next((kind for prefix, kind in _KINDS if name.startswith(prefix)), "deepep-other")
        # kernels on DeepEP's RDMA buffer need NVSHMEM's heap where SAVE had it
        return self.match(kind, abi(family) or (), "nvshmem" if needs_nvshmem(family) else None)
