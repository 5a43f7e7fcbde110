"""``nccl-ipc``: NCCL collectives over deterministic peer memory.

NCCL's device kernels are named ``ncclDevKernel_<Collective>_<Op>_<type>_<algo>_<proto>``
(plus ``ncclDevKernel_Generic*``, which serves several collectives). NCCL-owned
addresses cannot be rewritten; at LOAD this backend's job is to prove them
identical, which comes with the peer-memory work.
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch
from foundry.graphir.kernel import KernelIdentity

_NCCL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")

_KINDS = {
    "AllReduce": "nccl-allreduce",
    "AllGather": "nccl-allgather",
    "ReduceScatter": "nccl-reducescatter",
    "Broadcast": "nccl-broadcast",
    "Reduce": "nccl-reduce",
    "SendRecv": "nccl-sendrecv",
    "AllToAll": "nccl-alltoall",
}


class NcclIpcBackend(Backend):
    name = "nccl-ipc"
    description = "NCCL collectives; addresses proven identical through deterministic peer memory"
    kinds = frozenset({*_KINDS.values(), "nccl-collective"})
    regions = ("ipc.peer*", "nccl.*")

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        found = _NCCL.match(kernel.name)
        if found is None:
            return None
        return self.match(_KINDS.get(found.group(1), "nccl-collective"))
