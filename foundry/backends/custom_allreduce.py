"""``custom-allreduce``: the IPC-buffer all-reduce of SGLang's kernel library.

``sglang::cross_device_reduce_1stage`` / ``_2stage`` (sglang-kernel 0.4.5; the
same kernels as vLLM's custom all-reduce). Its buffers are shared through CUDA
IPC, the peer memory the ``nccl-ipc`` backend makes deterministic. Layout from
``tests/fixtures/kernel_names/sglang_kernel.txt``: ``RankSignals`` is a
64-byte struct of peer signal pointers passed by value at offset 16.
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch, roles
from foundry.graphir.kernel import KernelIdentity

_CUSTOM_AR = re.compile(r"(?:^|::)cross_device_reduce_(?:1stage|2stage)$")
_ABI = roles(
    "rank_data",
    "peer_signals",
    "self_signal",
    "output",
    "rank",
    "world_size",
    pointers=("rank_data", "peer_signals", "self_signal", "output"),
)


class CustomAllReduceBackend(Backend):
    name = "custom-allreduce"
    description = "IPC-buffer custom all-reduce (sglang-kernel's cross_device_reduce)"
    kinds = frozenset({"custom-allreduce"})
    regions = ("ipc.peer*",)

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if "cross_device_reduce" not in kernel.name:
            return None
        if _CUSTOM_AR.search(kernel.short_name.removesuffix("<...>")) is None:
            return None
        return self.match("custom-allreduce", _ABI)
