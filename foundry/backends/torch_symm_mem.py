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
"""

from __future__ import annotations

from foundry.backends.base import Backend, KernelMatch, ParamRole, roles
from foundry.graphir.kernel import KernelIdentity, template_args

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
