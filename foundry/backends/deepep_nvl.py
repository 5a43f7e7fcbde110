"""``deepep-nvl``: DeepEP expert-parallel kernels over CUDA IPC (no fabric handles).

Recognised by their namespaces: ``deep_ep::internode_ll`` (low-latency
dispatch/combine), ``deep_ep::intranode`` and ``deep_ep::internode``.
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch
from foundry.graphir.kernel import KernelIdentity

# (pattern on the qualified short name, kind), first match wins
_KERNELS = (
    (re.compile(r"^deep_ep::.*::dispatch$"), "deepep-dispatch"),
    (re.compile(r"^deep_ep::.*::combine$"), "deepep-combine"),
    (re.compile(r"^deep_ep::.*notify"), "deepep-notify"),
    (re.compile(r"^deep_ep::.*clean"), "deepep-clean"),
    (re.compile(r"^deep_ep::.*barrier"), "deepep-barrier"),
    (re.compile(r"^deep_ep::"), "deepep-other"),
)


class DeepEPNvlBackend(Backend):
    name = "deepep-nvl"
    description = "DeepEP dispatch/combine over NVLink peer buffers (CUDA IPC, use_fabric=False)"
    kinds = frozenset(kind for _, kind in _KERNELS)
    regions = ("deepep.*", "nvshmem")

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if "deep_ep" not in kernel.name:
            return None
        name = kernel.short_name.removesuffix("<...>")
        for pattern, kind in _KERNELS:
            if pattern.search(name):
                return self.match(kind)
        return None
