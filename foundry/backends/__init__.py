"""Backends: who owns which kernels and memory, and how each is validated and relocated.

See :mod:`foundry.backends.base` for the contract and ``docs/backends.md`` for
how to write one.
"""

from foundry.backends.base import CONTRACT_VERSION, Backend, KernelMatch, ParamRole
from foundry.backends.registry import ENTRY_POINT_GROUP, BackendRegistry, BrokenBackend

__all__ = [
    "CONTRACT_VERSION",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendRegistry",
    "BrokenBackend",
    "KernelMatch",
    "ParamRole",
]
