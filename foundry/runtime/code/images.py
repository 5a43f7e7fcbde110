"""Which module image holds a kernel, and the cache preference its program set on
it: the hook's records, asked through the driver.

A kernel node names its code by ``CUkernel`` (cudart's library-managed kernels)
or ``CUfunction`` (modules loaded directly, as Triton does). The driver says
which library or module that is; the registry says which image it came from.
"""

from __future__ import annotations

from foundry.graphir.cuda import cu, driver, handle_value
from foundry.runtime.native.hook import Hook, Image


class HookImages:
    """Resolve kernels to the sha256 of their image, caching per handle."""

    def __init__(self, hook: Hook) -> None:
        self.hook = hook
        self.used: dict[str, Image] = {}
        self._cache: dict[tuple[int, int], str | None] = {}
        #: kernels whose image the registry lacks, by handle: what the driver named instead
        self.misses: dict[tuple[int, int], str] = {}

    def image_of(self, func: int, kern: int) -> str | None:
        key = (func, kern)
        if key not in self._cache:
            self._cache[key] = self._lookup(func, kern)
        return self._cache[key]

    def _lookup(self, func: int, kern: int) -> str | None:
        drv = driver()
        if kern:
            library = handle_value(cu("cuKernelGetLibrary", drv.CUkernel(kern)))
            image = self.hook.find_image(library, "library")
        else:
            module = handle_value(cu("cuFuncGetModule", drv.CUfunction(func)))
            image = self.hook.find_image(module, "module")
        if image is None or image.sha256 is None:
            owner = f"library 0x{library:x}" if kern else f"module 0x{module:x}"
            self.misses[(func, kern)] = f"{owner} {'unknown to the registry' if image is None else 'without a sha256'}"
            return None
        self.used[image.sha256] = image
        return image.sha256

    def cache_config_of(self, func: int, kern: int) -> int:
        """The ``CUfunc_cache`` set on the kernel (on its function or its library kernel, the
        function's winning; a node naming only the kernel: on the kernel's function in this
        context too), 0 when none was."""
        if kern and not func:
            func = handle_value(cu("cuKernelGetFunction", driver().CUkernel(kern)))
        return (func and self.hook.cache_config(func)) or (kern and self.hook.cache_config(kern)) or 0
