"""Itanium C++ demangling through the C++ runtime's own ``__cxa_demangle``."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ctypes is imported when a name is first demangled: reading graphs needs none
    import ctypes


def _runtime_names() -> Iterator[str]:
    """The C++ runtimes to try, libstdc++'s soname first: ``find_library`` runs ``ldconfig`` in a
    child process, so it is asked only when the soname does not load."""
    yield "libstdc++.so.6"
    import ctypes.util  # imports subprocess

    found = ctypes.util.find_library("stdc++")
    if found:
        yield found
    yield "libc++.so.1"


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    import ctypes

    for name in _runtime_names():
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        demangle = lib.__cxa_demangle
        demangle.restype = ctypes.c_void_p
        demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        return lib
    return None


# nvcc prefixes internal-linkage kernels of relocatable device code with
# ``__nv_static_<n>__<file hash>_`` before the Itanium ``_Z`` name.
_NV_STATIC = re.compile(r"^__nv_static_\d+__\w*?_(?=_Z)")


# Real kernel names stay under a few KiB; longer ones (a hostile archive) are
# shown mangled rather than handed to a recursive C demangler.
_MAX_MANGLED = 8192


@functools.cache
def demangle(name: str) -> str:
    """The demangled form of ``name``; ``name`` itself when it is not mangled
    (``extern "C"`` kernels, Triton) or no C++ runtime is found."""
    lib = _runtime()
    name = _NV_STATIC.sub("", name)
    if lib is None or not name.startswith("_Z") or len(name) > _MAX_MANGLED or "\x00" in name:
        return name
    import ctypes

    status = ctypes.c_int()
    out = lib.__cxa_demangle(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return name
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(out))
