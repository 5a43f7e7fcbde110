"""``custom-allreduce``: the IPC-buffer all-reduce of SGLang's kernel library.

Recognised by its kernel names (``cross_device_reduce_1stage`` /
``cross_device_reduce_2stage``); its buffers are shared through CUDA IPC, the
same peer memory the ``nccl-ipc`` backend makes deterministic.
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch
from foundry.graphir.kernel import KernelIdentity

_CUSTOM_AR = re.compile(r"cross_device_reduce_(1stage|2stage)")


class CustomAllReduceBackend(Backend):
    name = "custom-allreduce"
    description = "IPC-buffer custom all-reduce (sglang-kernel's cross_device_reduce)"
    kinds = frozenset({"custom-allreduce"})
    regions = ("ipc.peer*",)

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if _CUSTOM_AR.search(kernel.name) is None:
            return None
        return self.match("custom-allreduce")
