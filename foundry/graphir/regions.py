"""Memory regions: the named address ranges operands point into.

A region is either named by whoever lowers the graph (the deterministic ``vmm``
region, a backend's buffers such as ``symm.buffer``) or discovered during
lowering through the driver's range queries (``alloc.<n>``, numbered by first
reference, so two processes that capture the same program name them alike).
:class:`AddressRanges` finds them by address, and answers the same question for
ranges that are no region (what the host process maps, the blocks an allocator keeps).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from enum import StrEnum

import msgspec

from foundry.errors import IRError
from foundry.graphir.limits import SIZE, U64, Name

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

    name: Name
    kind: RegionKind
    base: U64
    size: SIZE

    @property
    def end(self) -> int:
        return self.base + self.size

    def contains(self, address: int) -> bool:
        return self.base <= address < self.end


class AddressRanges:
    """Sorted, disjoint ``[start, end)`` address ranges, looked up by address in O(log n).

    A range may stand for a :class:`Region` (:meth:`add` refuses a duplicate name, an
    empty region or an overlap; :meth:`find` returns the region holding an address).
    Ranges without one (what the host process maps, the blocks an allocator keeps)
    only answer ``address in ranges``. ``ranges`` lists them all, sorted.
    """

    __slots__ = ("_names", "_regions", "_starts", "ranges")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self.ranges = sorted(ranges)
        self._starts = [start for start, _ in self.ranges]
        self._regions: list[Region | None] = [None] * len(self.ranges)
        self._names: set[str] = set()

    @classmethod
    def of_blocks(cls, blocks: Iterable[tuple[int, int]]) -> AddressRanges:
        """The ranges of ``(address, size)`` blocks."""
        return cls((address, address + size) for address, size in blocks)

    @classmethod
    def of_regions(cls, regions: Iterable[Region]) -> AddressRanges:
        """The ranges of ``regions``, each found again by :meth:`find`."""
        out = cls()
        for region in regions:
            out.add(region)
        return out

    def add(self, region: Region) -> None:
        """Add a region; raise :class:`IRError` on a duplicate name or an overlap."""
        if region.name == UNRESOLVED or region.name in self._names:
            raise IRError(f"region name {region.name!r} is reserved or already used")
        if region.size <= 0:
            raise IRError(f"region {region.name!r} has size {region.size}")
        at = bisect.bisect_left(self._starts, region.base)
        for i in range(max(at - 1, 0), min(at + 1, len(self.ranges))):
            start, end = self.ranges[i]
            if region.base < end and start < region.end:
                other = self._regions[i]
                raise IRError(f"region {region.name!r} overlaps region {other.name if other else hex(start)!r}")
        self.ranges.insert(at, (region.base, region.end))
        self._starts.insert(at, region.base)
        self._regions.insert(at, region)
        self._names.add(region.name)

    def _index(self, address: int) -> int:
        """The range holding ``address``, or -1."""
        i = bisect.bisect_right(self._starts, address) - 1
        return i if i >= 0 and address < self.ranges[i][1] else -1

    def __contains__(self, address: int) -> bool:
        return self._index(address) >= 0

    def find(self, address: int) -> Region | None:
        """The region that holds ``address``, if any (None also for a range that stands for none)."""
        i = self._index(address)
        return self._regions[i] if i >= 0 else None

    def regions(self) -> list[Region]:
        """The regions among the ranges, in address order."""
        return [region for region in self._regions if region is not None]

    def __len__(self) -> int:
        return len(self.ranges)
