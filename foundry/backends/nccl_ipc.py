"""``nccl-ipc``: NCCL collectives over deterministic peer memory.

NCCL 2.32 names its kernels ``ncclDevKernel_<Collective>[_<type>_<algo>]``
(``ncclDevKernel_Generic`` serves several collectives),
``ncclSymkDevKernel_<Collective>_<variant>`` for its symmetric kernels (variants
with ``MC`` use NVLink multicast) and ``oneRankReduce`` for single-rank
reductions. Names are checked against ``tests/fixtures/kernel_names/nccl.txt``.
NCCL-owned addresses cannot be rewritten; at LOAD this backend's job is to
prove them identical, which comes with the peer-memory work.
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch, roles
from foundry.graphir.kernel import KernelIdentity

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


class NcclIpcBackend(Backend):
    name = "nccl-ipc"
    description = "NCCL collectives; addresses proven identical through deterministic peer memory"
    kinds = frozenset({*_KINDS.values(), "nccl-onerank", "nccl-internal"})
    regions = ("ipc.peer*", "nccl.*")

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
