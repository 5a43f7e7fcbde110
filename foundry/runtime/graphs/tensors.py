"""torch tensors over region memory that torch's allocator does not own.

A LOAD maps SAVE's graph pool itself; the restored graphs' outputs live there.
They are exposed through ``__cuda_array_interface__`` (no copy) as raw bytes
and viewed as the dtype, so dtypes the interface cannot spell (bfloat16, float8)
work too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from foundry.archive.outputs import OutputValue, TensorSpec, rebuild
from foundry.errors import DriftError


class _DeviceMemory:
    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "stream": None,  # no synchronisation: the caller orders work on its stream
        }


def tensor_at(address: int, dtype: Any, shape: tuple[int, ...], stride: tuple[int, ...] | None = None) -> Any:
    """A tensor of ``dtype`` and ``shape`` (and ``stride``, in elements) at a device address."""
    import torch

    if stride is None:
        stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    itemsize = torch.empty((), dtype=dtype).element_size()
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
    raw = torch.as_tensor(_DeviceMemory(address, span * itemsize), device="cuda")
    flat = raw.view(dtype)
    return flat.as_strided(shape, stride)


def outputs_at(spec: OutputValue, base_of: Callable[[str], int | None]) -> Any:
    """The output structure SAVE recorded, each tensor placed at its region's live base
    (``base_of(region name)``; None when this process cannot place that region)."""
    import torch

    def tensor(t: TensorSpec) -> Any:
        base = base_of(t.region) if t.region is not None and t.region_offset is not None else None
        if base is None:
            raise DriftError(
                "an output tensor lies outside every region this LOAD can place; it cannot be restored",
                field="outputs",
                found=t.region,
            )
        dtype = getattr(torch, t.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        return tensor_at(base + t.region_offset + t.storage_offset * itemsize, dtype, t.shape, t.stride)

    return rebuild(spec, tensor)
