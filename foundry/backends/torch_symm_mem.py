"""``torch-symm-mem``: torch symmetric memory collectives (torch 2.11).

Kernels live in ``CUDASymmetricMemoryOps.cu`` in an anonymous namespace, so
they are recognised by their unqualified names. The ABI follows the kernels'
signatures as compiled into torch 2.11 (checked against the captured graphs
in ``tests/fixtures/symm-mem-ws1`` and the names in
``tests/fixtures/kernel_names/torch.txt``).
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch, ParamRole, roles
from foundry.graphir.kernel import KernelIdentity

_ONE_SHOT = roles(
    "buffer_ptrs", "output", "input", "input_offset", "numel", "signal_pad_ptrs", "rank", "world_size",
    pointers=("buffer_ptrs", "output", "input", "signal_pad_ptrs"),
)  # fmt: skip
_TWO_SHOT_INPLACE = roles(
    "buffer_ptrs", "input_offset", "numel", "signal_pad_ptrs", "rank", "world_size",
    pointers=("buffer_ptrs", "signal_pad_ptrs"),
)  # fmt: skip

# (pattern on the unqualified kernel name, kind, ABI, required capability)
_KERNELS: tuple[tuple[re.Pattern[str], str, tuple[ParamRole, ...], str | None], ...] = (
    (re.compile(r"^multimem_all_gather"), "symm-allgather", (), "multimem"),
    (re.compile(r"^multimem_.*reduce_scatter"), "symm-reducescatter", (), "multimem"),
    (re.compile(r"^multimem_.*(all_reduce|one_shot_reduce)"), "symm-allreduce", (), "multimem"),
    (re.compile(r"^one_shot_all_reduce_kernel$"), "symm-allreduce", _ONE_SHOT, None),
    (re.compile(r"^two_shot_all_reduce_kernel_inplace$"), "symm-allreduce", _TWO_SHOT_INPLACE, None),
    (re.compile(r"^two_shot_all_reduce_kernel$"), "symm-allreduce", (), None),
    (re.compile(r"all_gather"), "symm-allgather", (), None),
    (re.compile(r"reduce_scatter"), "symm-reducescatter", (), None),
)

_FILE_MARKER = "CUDASymmetricMemoryOps"


def unqualified(kernel: KernelIdentity) -> str:
    """The kernel's own name: last ``::`` component, template arguments dropped."""
    short = kernel.short_name.removesuffix("<...>")
    return short.rsplit("::", 1)[-1]


class TorchSymmMemBackend(Backend):
    name = "torch-symm-mem"
    description = "torch symmetric memory: one-shot/two-shot all-reduce, all-gather, reduce-scatter"
    kinds = frozenset({"symm-allreduce", "symm-allgather", "symm-reducescatter"})
    regions = ("symm.*",)

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if _FILE_MARKER not in kernel.name and "symm" not in kernel.name.lower():
            return None
        name = unqualified(kernel)
        for pattern, kind, abi, requires in _KERNELS:
            if pattern.search(name):
                return self.match(kind, abi, requires)
        return None
