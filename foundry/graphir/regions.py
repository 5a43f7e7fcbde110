"""Memory regions: the named address ranges operands point into.

A region is either named by whoever lowers the graph (the deterministic ``vmm``
region, a backend's buffers such as ``symm.buffer``) or discovered during
lowering through the driver's range queries (``alloc.<n>``, numbered by first
reference, so two processes that capture the same program name them alike).
"""

from __future__ import annotations

import bisect
from enum import StrEnum

import msgspec

from foundry.errors import IRError

#: The region of a word known to be a pointer that lies in no known allocation.
UNRESOLVED = "unresolved"


class RegionKind(StrEnum):
    VMM = "vmm"  # the deterministic VMM region of the native hook
    BACKEND = "backend"  # owned by a communicator backend (symm.*, ipc.peer[r], deepep.nvl, nvshmem)
    ALLOC = "alloc"  # a live device allocation found by the driver's range query
    HOST = "host"  # pinned or registered host memory
    RNG = "rng"  # philox seed/offset cells
    TENSOR = "tensor"  # a tensor the caller named (a model weight, a static input)


class Region(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """A named address range ``[base, base + size)``."""

    name: str
    kind: RegionKind
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size

    def contains(self, address: int) -> bool:
        return self.base <= address < self.end


class RegionMap:
    """Non-overlapping regions, looked up by address in O(log n)."""

    def __init__(self, regions: tuple[Region, ...] | list[Region] = ()) -> None:
        self._by_name: dict[str, Region] = {}
        self._bases: list[int] = []
        self._sorted: list[Region] = []
        for region in regions:
            self.add(region)

    def add(self, region: Region) -> None:
        """Add a region; raise :class:`IRError` on a duplicate name or an overlap."""
        if region.name == UNRESOLVED or region.name in self._by_name:
            raise IRError(f"region name {region.name!r} is reserved or already used")
        if region.size <= 0:
            raise IRError(f"region {region.name!r} has size {region.size}")
        at = bisect.bisect_left(self._bases, region.base)
        neighbours = self._sorted[max(at - 1, 0) : at + 1]
        for other in neighbours:
            if region.base < other.end and other.base < region.end:
                raise IRError(f"region {region.name!r} overlaps region {other.name!r}")
        self._bases.insert(at, region.base)
        self._sorted.insert(at, region)
        self._by_name[region.name] = region

    def find(self, address: int) -> Region | None:
        """The region that holds ``address``, if any."""
        at = bisect.bisect_right(self._bases, address) - 1
        if at >= 0 and self._sorted[at].contains(address):
            return self._sorted[at]
        return None

    def get(self, name: str) -> Region | None:
        return self._by_name.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __iter__(self):
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self._sorted)

    def by_name(self) -> tuple[Region, ...]:
        """Regions in name order, the order archives store them in."""
        return tuple(sorted(self._sorted, key=lambda r: r.name))
