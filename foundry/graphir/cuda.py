"""The one door to the CUDA driver: NVIDIA's ``cuda-bindings``, imported lazily.

Offline commands never import this module's driver; GPU code calls
:func:`cu`, which checks every result and names the call and the error.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from foundry.errors import DriverError


@functools.cache
def driver() -> Any:
    """The ``cuda.bindings.driver`` module, or a clear error where it is absent."""
    try:
        from cuda.bindings import driver as drv
    except ImportError as err:
        raise DriverError(
            "NVIDIA cuda-bindings is not installed (pip install 'foundry[gpu]'); "
            "offline commands do not need it, GPU lowering and LOAD do"
        ) from err
    return drv


def cu(name: str, *args: Any) -> Any:
    """Call driver function ``name``; return its outputs (one value, a tuple, or None).

    Raises :class:`DriverError` with the call, the error's name and its meaning.
    """
    drv = driver()
    result = getattr(drv, name)(*args)
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != drv.CUresult.CUDA_SUCCESS:
        raise DriverError(f"{name} failed: {error_text(err)}", found=int(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def try_cu(name: str, *args: Any) -> tuple[Any, Any]:
    """Like :func:`cu` but returns ``(error, value)`` for calls whose failure is an answer."""
    drv = driver()
    result = getattr(drv, name)(*args)
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    value = values[0] if len(values) == 1 else (values or None)
    return err, value


def error_text(err: Any) -> str:
    drv = driver()
    _, name = drv.cuGetErrorName(err)
    _, text = drv.cuGetErrorString(err)
    return f"{_text(name)} ({_text(text)})"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def handle_value(handle: Any) -> int:
    """The raw pointer value of a cuda-bindings handle (or of a plain int)."""
    if handle is None:
        return 0
    if isinstance(handle, int):
        return handle
    try:
        return int(handle)
    except TypeError:
        return ctypes.c_uint64.from_address(handle.getPtr()).value


class KernelNodeParamsLayout(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS_v2`` as the driver lays it out."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.POINTER(ctypes.c_void_p)),
        ("extra", ctypes.POINTER(ctypes.c_void_p)),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]
