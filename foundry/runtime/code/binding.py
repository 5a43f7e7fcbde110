"""Binding archived kernels to functions in a LOAD process.

A kernel names its code as ``(image sha256, entry name)``. When the live
process loaded that same image itself (the hook's registry has it), the kernel
binds to the live copy: its module globals are the ones the application set
up. Otherwise the archived image is loaded once and the kernel binds to it.
Either way the image's device globals are checked or restored first
(:mod:`foundry.runtime.code.module_globals`).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Set
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from foundry.archive.reader import Archive
from foundry.archive.schema import ImageRecord
from foundry.errors import DriftError, HookError
from foundry.graphir.cuda import cu, driver, handle_value
from foundry.graphir.kernel import KernelIdentity
from foundry.runtime.code.module_globals import check_live, restore_fresh
from foundry.runtime.native.hook import Hook, Image
from foundry.runtime.threads import on_thread


class ArchiveFunctions:
    """A :class:`foundry.graphir.build.FunctionResolver` over live and archived images."""

    def __init__(self, hook: Hook, archive: Archive, records: dict[str, ImageRecord] | None = None, *,
                 moved_from: tuple[int, int] | None = None,
                 checked: dict[str, bytes] | None = None) -> None:  # fmt: skip
        self.hook = hook
        self.archive = archive
        # images' bytes already read and hashed (the session's module check), by sha256: taken, not read again
        self._checked = checked if checked is not None else {}
        self.from_check = 0  # images loaded from those bytes
        self.records = records  # None: an archive without image records; globals are not checked
        self.moved_from = moved_from  # SAVE's region range when LOAD relocates: restored globals must not point there
        self._images: dict[str, tuple[str, int]] = {}  # sha256 -> (kind, CUmodule/CUlibrary)
        self._loaded_ahead: dict[str, int] = {}  # sha256 -> CUlibrary, archived images loaded by prefetch
        self._live: dict[str, Image | None] = {}  # sha256 -> the live copy, or None
        self._by_size: dict[int, list[Image]] | None = None
        self._blob_records = {b.sha256: b for b in archive.catalog.modules.blobs}
        self._functions: dict[tuple[str, str], int] = {}
        self.bound_live: set[str] = set()
        self.loaded: set[str] = set()
        self.restored_globals: list[str] = []
        self.seconds = {"find_live": 0.0, "load": 0.0, "globals": 0.0}  # where binding's time goes
        self._lock = threading.Lock()  # the prefetch threads add to "load" and to from_check

    def function(self, kernel: KernelIdentity) -> int:
        if kernel.image is None:
            raise HookError("kernel has no module image identity; the archive cannot be loaded", kernel=kernel.name)
        key = (kernel.image, kernel.name)
        if key not in self._functions:
            kind, handle = self._image(kernel.image)
            self._functions[key] = self._lookup(kind, handle, kernel)
        return self._functions[key]

    def prefetch_ahead(self, images: Set[str]) -> Future[tuple[int, float]]:
        """:meth:`prefetch` on a thread of its own, in the calling thread's context, while
        that thread goes on; the future gives how many images were loaded, and the seconds
        it took. Wait for it before anything binds or :meth:`release` runs."""
        context = cu("cuCtxGetCurrent")
        if not handle_value(context):  # the loads would go nowhere, on threads that cannot say so
            raise HookError("no CUDA context is current on the thread that restores the graphs")

        def run() -> tuple[int, float]:
            begun = time.perf_counter()
            return self.prefetch(images, context=context), time.perf_counter() - begun

        return on_thread("foundry-images", run)

    def prefetch(self, images: Set[str], *, threads: int = 8, context: Any = None) -> int:
        """Read and check (or take the module check's bytes), then load, the archived
        images that have no live copy, several at a time: reading and hashing release the
        interpreter lock, and the driver loads libraries on several threads at once. Every
        image is checked before the driver sees any; device globals are checked when a
        kernel binds (:meth:`_image`). ``context``: where to load them (default: the
        calling thread's current context). Returns how many were loaded."""
        try:
            wanted = sorted(s for s in images if s not in self._images and self._live_copy(s) is None)
            if not wanted:
                return 0
            with ThreadPoolExecutor(max_workers=max(1, min(threads, len(wanted)))) as pool:
                blobs = list(pool.map(self._image_bytes, wanted))  # each checked against its sha256
                context = cu("cuCtxGetCurrent") if context is None else context
                futures = [pool.submit(self._load, blob, context) for blob in blobs]
        finally:
            self._checked.clear()  # the rest have live copies (or are loaded): their bytes are not needed
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:  # nothing half-loaded stays behind a refusal
            for future in futures:
                if future.exception() is None:
                    cu("cuLibraryUnload", driver().CUlibrary(future.result()))
            raise errors[0]
        self._loaded_ahead.update(zip(wanted, (f.result() for f in futures), strict=True))
        return len(wanted)

    def release(self) -> None:
        """Unload every archived image this resolver loaded (a failed LOAD's cleanup: no
        graph may use them afterwards)."""
        libraries = [*self._loaded_ahead.values(), *(self._images[s][1] for s in self.loaded)]
        self._loaded_ahead.clear()
        for sha256 in self.loaded:
            del self._images[sha256]
        self.loaded.clear()
        self._functions = {k: v for k, v in self._functions.items() if k[0] in self._images}
        for library in libraries:
            cu("cuLibraryUnload", driver().CUlibrary(library))

    def _image_bytes(self, sha256: str) -> bytes:
        """An image's bytes: as the module check read and hashed them, else read and checked now."""
        data = self._checked.pop(sha256, None)  # one thread per image: each is taken once
        if data is None:
            return self.archive.module(sha256)
        with self._lock:
            self.from_check += 1
        return data

    def _load(self, blob: bytes, context: Any = None) -> int:
        begun = time.perf_counter()
        if context is not None:  # a worker thread: the current context is per thread
            cu("cuCtxSetCurrent", context)
        # the driver reads the bytes object in place (alive until the call returns) and keeps
        # its own copy of the image (no CU_LIBRARY_BINARY_IS_PRESERVED)
        address = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p).value
        library = handle_value(cu("cuLibraryLoadData", address, None, None, 0, None, None, 0))
        with self._lock:  # summed over the prefetch threads
            self.seconds["load"] += time.perf_counter() - begun
        return library

    def _image(self, sha256: str) -> tuple[str, int]:
        if sha256 not in self._images:
            live = self._live_copy(sha256)
            if self.records is not None and sha256 not in self.records:
                raise DriftError("the archive records no device globals for this image", path=f"image {sha256[:12]}")
            if live is not None:
                if self.records is not None:
                    begun = time.perf_counter()
                    check_live(self.records[sha256], live.kind, live.handle)
                    self.seconds["globals"] += time.perf_counter() - begun
                self._images[sha256] = (live.kind, live.handle)
                self.bound_live.add(sha256)
            else:
                library = self._loaded_ahead.pop(sha256, None)
                if library is None:
                    library = self._load(self._image_bytes(sha256))  # checked against its sha256
                loaded = time.perf_counter()
                try:
                    if self.records is not None:
                        self.restored_globals += restore_fresh(self.records[sha256], sha256, library, self.moved_from)
                    self.seconds["globals"] += time.perf_counter() - loaded
                except DriftError:
                    cu("cuLibraryUnload", driver().CUlibrary(library))
                    raise
                self._images[sha256] = ("library", library)
                self.loaded.add(sha256)
        return self._images[sha256]

    def _live_copy(self, sha256: str) -> Image | None:
        """The live process's own copy of an image, found once (prefetch and binding both ask)."""
        if sha256 not in self._live:
            begun = time.perf_counter()
            self._live[sha256] = self._find_live_copy(sha256)
            self.seconds["find_live"] += time.perf_counter() - begun
        return self._live[sha256]

    def _find_live_copy(self, sha256: str) -> Image | None:
        blob = self._blob_records.get(sha256)
        if blob is None:
            return None
        for image in self._live_by_size().get(blob.size, ()):  # hash only images of the right size
            hashed = self.hook.image(image.index, hash=True)
            if hashed.sha256 == sha256 and not hashed.unloaded:  # unloaded since it was listed
                return hashed
        return None

    def _live_by_size(self) -> dict[int, list[Image]]:
        """The process's loaded images by size, listed once: listing them per archived
        image cost a registry walk each. Images loaded after this are Foundry's own
        loads of archived images, which are never live copies."""
        if self._by_size is None:
            self._by_size = {}
            for image in self.hook.images():
                if not image.unloaded:
                    self._by_size.setdefault(image.size, []).append(image)
        return self._by_size

    @staticmethod
    def _lookup(kind: str, handle: int, kernel: KernelIdentity) -> int:
        drv = driver()
        name = kernel.name.encode()
        if kind == "library":
            kern = cu("cuLibraryGetKernel", drv.CUlibrary(handle), name)
            return handle_value(cu("cuKernelGetFunction", kern))
        return handle_value(cu("cuModuleGetFunction", drv.CUmodule(handle), name))
