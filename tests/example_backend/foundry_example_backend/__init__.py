"""A third-party backend as small as one can be: it claims cuBLAS ``nvjet`` kernels
as kind ``example-gemm`` and implements only the recognise step, so an archive that
records state for it is refused at LOAD until it can validate."""

from __future__ import annotations

from foundry.backends.base import Backend, KernelMatch
from foundry.graphir.kernel import KernelIdentity


class ExampleGemmBackend(Backend):
    name = "example-gemm"
    kinds = frozenset({"example-gemm"})
    description = "example third-party backend (tests)"

    def recognise(self, kernel: KernelIdentity) -> KernelMatch | None:
        return self.match("example-gemm") if kernel.name.startswith("nvjet_") else None
