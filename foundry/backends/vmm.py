"""``vmm``: the deterministic VMM region of the native hook.

It claims no kernels; it owns the operands of region ``vmm``. Relocation
(rebasing when a LOAD's region lands at another base) comes with the
relocation work; until then a LOAD needs the region at SAVE's base.
"""

from __future__ import annotations

from foundry.backends.base import Backend, KernelMatch
from foundry.graphir.kernel import KernelIdentity


class VmmBackend(Backend):
    name = "vmm"
    description = "deterministic VMM region of the native hook"
    regions = ("vmm",)

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        return None
