"""``torch-symm-mem``: torch symmetric memory kernels (torch 2.11).

The collective kernels live in ``CUDASymmetricMemoryOps.cu`` in an anonymous
namespace, so they are recognised by their unqualified names (and template
arguments: ``two_shot_all_reduce_kernel<T, align, world, reduce_scatter, split>``
also serves reduce-scatter). The signalling kernels live in
``c10d::symmetric_memory``, the NCCL- and NVSHMEM-backed ones in
``c10d::nccl_extension`` and ``c10d::nvshmem_extension``. Names and parameter
layouts are checked against ``tests/fixtures/kernel_names/torch.txt`` (read
from torch 2.11.0+cu130 with cuobjdump) and the captured graphs in
``tests/fixtures/symm-mem-ws1``.

State (version 1): the process group, world size, rank, dtype, buffer and
signal-pad sizes, whether NVLink multicast is there, and the addresses of the
four regions a rendezvous handle owns (:data:`REGIONS`). LOAD refuses another
group, world size, rank or dtype, a smaller buffer or signal pad, a multimem
kernel without multicast, and operands beyond the live regions; it relocates
every ``symm.*`` operand to the live handle's address plus its offset.
"""

from __future__ import annotations

from typing import Any

from foundry.archive.schema import BackendState
from foundry.backends.base import (
    Backend,
    KernelMatch,
    LiveState,
    ParamRole,
    SaveState,
    require_same,
    require_state_version,
    roles,
)
from foundry.errors import BackendError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity, template_args
from foundry.graphir.operands import Operand
from foundry.graphir.regions import Region, RegionKind

_PTRS = ("buffer_ptrs", "output", "input", "signal_pad_ptrs")

# unqualified kernel name -> (kind, ABI, required capability)
_OPS_KERNELS: dict[str, tuple[str, tuple[ParamRole, ...], str | None]] = {
    "one_shot_all_reduce_kernel": (
        "symm-allreduce",
        roles(
            "buffer_ptrs",
            "output",
            "input",
            "input_offset",
            "numel",
            "signal_pad_ptrs",
            "rank",
            "world_size",
            pointers=_PTRS,
        ),
        None,
    ),
    "two_shot_all_reduce_kernel_inplace": (
        "symm-allreduce",
        roles("buffer_ptrs", "input_offset", "numel", "signal_pad_ptrs", "rank", "world_size", pointers=_PTRS),
        None,
    ),
    "two_shot_all_reduce_kernel": (
        "symm-allreduce",
        roles(
            "buffer_ptrs",
            "output",
            "input_offset",
            "numel",
            "signal_pad_ptrs",
            "rank",
            "world_size",
            "split_size",
            pointers=_PTRS,
        ),
        None,
    ),
    "multimem_all_reduce_kernel": (
        "symm-allreduce",
        roles("multicast", "numel", "signal_pad_ptrs", "rank", "world_size", pointers=("multicast", "signal_pad_ptrs")),
        "multimem",
    ),
    "multimem_one_shot_reduce_kernel": (
        "symm-reduce",
        roles(
            "multicast",
            "output",
            "numel",
            "signal_pad_ptrs",
            "rank",
            "world_size",
            "root",
            pointers=("multicast", "output", "signal_pad_ptrs"),
        ),
        "multimem",
    ),
    "multimem_all_gather_kernel": (
        "symm-allgather",
        roles(
            "input",
            "multicast",
            "bytes_per_rank",
            "signal_pad_ptrs",
            "rank",
            "world_size",
            pointers=("input", "multicast", "signal_pad_ptrs"),
        ),
        "multimem",
    ),
}

# qualified prefix -> (kind, required capability)
_NAMESPACED: dict[str, tuple[str, str | None]] = {
    "c10d::symmetric_memory::barrier_kernel": ("symm-signal", None),
    "c10d::symmetric_memory::put_signal_kernel": ("symm-signal", None),
    "c10d::symmetric_memory::wait_signal_kernel": ("symm-signal", None),
    "c10d::symmetric_memory::build_ptr_dev": ("symm-internal", "nccl-symm"),
    "c10d::nccl_extension::lsa_put_signal_kernel": ("symm-signal", "nccl-symm"),
    "c10d::nccl_extension::nccl_wait_for_signal_kernel": ("symm-signal", "nccl-symm"),
    "c10d::nccl_extension::lsa_put_kernel": ("symm-copy", "nccl-symm"),
    "c10d::nccl_extension::lsa_get_kernel": ("symm-copy", "nccl-symm"),
    "c10d::nvshmem_extension::allToAllV": ("symm-alltoall", "nvshmem"),
    "c10d::nvshmem_extension::exchangeSplitAndOffset": ("symm-internal", "nvshmem"),
    "c10d::nvshmem_extension::tile_reduce_kernel": ("symm-reduce", "nvshmem"),
}

_OPS_FILE = "CUDASymmetricMemoryOps"


def unqualified(kernel: KernelIdentity) -> str:
    """The kernel's own name: last ``::`` component, template arguments dropped."""
    return kernel.short_name.removesuffix("<...>").rsplit("::", 1)[-1]


class TorchSymmMemBackend(Backend):
    name = "torch-symm-mem"
    description = "torch symmetric memory: one-shot/two-shot all-reduce, reduce-scatter, all-gather, signals"
    kinds = frozenset(
        {
            "symm-allreduce",
            "symm-reducescatter",
            "symm-allgather",
            "symm-reduce",
            "symm-alltoall",
            "symm-signal",
            "symm-copy",
            "symm-internal",
        }
    )
    regions = ("symm.*",)

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if _OPS_FILE in kernel.name:
            return self._ops_kernel(kernel)
        if "c10d" not in kernel.name:
            return None
        qualified = kernel.short_name.removesuffix("<...>")
        for prefix, (kind, requires) in _NAMESPACED.items():
            if qualified.startswith(prefix):
                return self.match(kind, (), requires)
        return None

    def record(self, save: SaveState) -> BackendState:
        return _record(self, save.backend_facts(self.name))

    def validate(self, state: BackendState, graphs: list[GraphIR], live: LiveState) -> None:
        _validate(self, state, graphs, live.backend_facts(self.name))

    def relocate(self, operand: Operand, live: LiveState) -> int:
        return _relocate(operand, live.backend_facts(self.name))

    def facts(self, *, handle: Any, group: str, dtype: str) -> dict[str, Any]:
        """Live facts from the program's rendezvous handle (see :func:`handle_facts`)."""
        return handle_facts(handle, group=group, dtype=dtype)

    def regions_for(self, facts: dict[str, Any]) -> list[Region]:
        return facts_regions(facts)

    def _ops_kernel(self, kernel: KernelIdentity) -> KernelMatch | None:
        entry = _OPS_KERNELS.get(unqualified(kernel))
        if entry is None:
            return None
        kind, abi, requires = entry
        if unqualified(kernel) == "two_shot_all_reduce_kernel":
            args = template_args(kernel.demangled)
            if len(args) >= 4 and args[3] == "true":  # the reduce_scatter template flag
                kind = "symm-reducescatter"
        return self.match(kind, abi, requires)


# The regions a rendezvous handle owns: its buffer and signal pad on this rank, and the
# device tables of every rank's buffer and signal-pad pointers the kernels index.
REGIONS = ("symm.buffer", "symm.signal_pad", "symm.buffer_ptrs", "symm.signal_pad_ptrs")
_EXACT = ("group", "world_size", "rank", "dtype")  # must match SAVE's
_CAPACITY = ("buffer_size", "signal_pad_size")  # LOAD's may be larger, never smaller


def handle_facts(handle: Any, *, group: str, dtype: str) -> dict[str, Any]:
    """What Foundry records of a ``torch.distributed._symmetric_memory`` rendezvous handle
    (multicast is there when the handle has a multicast address)."""
    multimem = bool(getattr(handle, "multicast_ptr", 0))
    return {
        "group": group,
        "world_size": int(handle.world_size),
        "rank": int(handle.rank),
        "dtype": dtype,
        "buffer_size": int(handle.buffer_size),
        "signal_pad_size": int(handle.signal_pad_size),
        "multimem": bool(multimem),
        "symm.buffer": int(handle.buffer_ptrs[handle.rank]),
        "symm.signal_pad": int(handle.signal_pad_ptrs[handle.rank]),
        "symm.buffer_ptrs": int(handle.buffer_ptrs_dev),
        "symm.signal_pad_ptrs": int(handle.signal_pad_ptrs_dev),
    }


def facts_regions(facts: dict[str, Any]) -> list[Region]:
    """The named regions the lowering resolves this backend's operands against."""
    sizes = {"symm.buffer": facts["buffer_size"], "symm.signal_pad": facts["signal_pad_size"],
             "symm.buffer_ptrs": 8 * facts["world_size"], "symm.signal_pad_ptrs": 8 * facts["world_size"]}  # fmt: skip
    return [Region(name, RegionKind.BACKEND, int(facts[name]), int(sizes[name])) for name in REGIONS]


def _validate(backend: TorchSymmMemBackend, state: BackendState, graphs: list[GraphIR], facts: dict[str, Any]) -> None:
    record = state.record
    require_state_version(backend, state)
    require_same(backend.name, "the live symmetric memory", _EXACT, record, facts)
    for key in _CAPACITY:
        if int(facts.get(key, 0)) < int(record.get(key, 0)):
            raise BackendError(
                f"the live symmetric memory is smaller than SAVE's ({key})",
                field=f"torch-symm-mem.{key}",
                expected=record.get(key),
                found=facts.get(key),
            )
    regions = {r.name: r for r in facts_regions(facts)}
    for ir in graphs:
        for node in ir.kernels():
            match = backend.recognise(node.kernel)
            if match is not None and match.requires == "multimem" and not facts.get("multimem"):
                raise BackendError("a multimem kernel needs NVLink multicast, which this process lacks",
                                   field="torch-symm-mem.multimem", node=node.id, kernel=node.kernel.name)  # fmt: skip
        for operand in ir.operands:
            if operand.region.startswith("symm.") and (
                operand.region not in regions or operand.region_offset >= regions[operand.region].size
            ):
                raise BackendError("a graph points outside the live symmetric memory",
                                   field=f"torch-symm-mem.{operand.region}", node=operand.node,
                                   found=operand.location())  # fmt: skip


def _record(backend: TorchSymmMemBackend, facts: dict[str, Any]) -> BackendState:
    missing = [k for k in (*_EXACT, *_CAPACITY, *REGIONS) if k not in facts]
    if missing:
        raise BackendError("the program did not describe its symmetric memory", field="torch-symm-mem",
                           expected=missing)  # fmt: skip
    kept = {k: facts[k] for k in (*_EXACT, *_CAPACITY, "multimem", *REGIONS) if k in facts}
    return BackendState(backend.name, backend.state_version, kept)


def _relocate(operand: Operand, facts: dict[str, Any]) -> int:
    if operand.region not in REGIONS or operand.region not in facts:
        raise BackendError(f"backend 'torch-symm-mem' does not own region {operand.region!r}",
                           found=operand.location())  # fmt: skip
    return int(facts[operand.region]) + operand.region_offset
