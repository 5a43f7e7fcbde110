"""``vmm``: the deterministic VMM region of the native hook.

It claims no kernels; it owns the operands of region ``vmm``. When a LOAD's
region lands at another base than SAVE's, every ``vmm`` operand (kernel
parameter words, memcpy and memset addresses) moves by the same delta: the
live value is the live base plus the operand's offset in the region.
"""

from __future__ import annotations

from foundry.backends.base import Backend, KernelMatch, LiveState
from foundry.errors import BackendError
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.operands import Operand
from foundry.graphir.regions import RegionKind


class VmmBackend(Backend):
    name = RegionKind.VMM.value
    description = "deterministic VMM region of the native hook"
    regions = (RegionKind.VMM.value,)
    needs_state = False  # it claims no kernels; the region's base is all it needs

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        return None

    def relocate(self, operand: Operand, live: LiveState) -> int:
        if operand.region != RegionKind.VMM:
            raise BackendError(f"backend {self.name!r} does not own region {operand.region!r}",
                               found=operand.location())  # fmt: skip
        return int(live.backend_facts(self.name)["base"]) + operand.region_offset
