"""``deepep-nvl``: DeepEP expert-parallel kernels over CUDA IPC (no fabric handles).

sgl-deep-ep 0.1.2 puts its kernels in ``deep_ep::legacy::{internode_ll,
internode, intranode, layout}`` (``tests/fixtures/kernel_names/deepep.txt``);
older DeepEP builds lack the ``legacy`` level, so both are accepted.
"""

from __future__ import annotations

import re

from foundry.backends.base import Backend, KernelMatch
from foundry.graphir.kernel import KernelIdentity

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

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        if "deep_ep" not in kernel.name:
            return None
        found = _QUALIFIED.match(kernel.short_name.removesuffix("<...>"))
        if found is None:
            return self.match("deepep-other")
        name = found.group(2)
        for prefix, kind in _KINDS:
            if name.startswith(prefix):
                return self.match(kind)
        return self.match("deepep-other")
