"""The operand manifest: every word of a graph that is a device pointer.

An operand names where a pointer sits (node, site, parameter, byte offset),
the value the SAVE process saw, and where it points as ``(region, offset)``.
Relocation rewrites exactly these words and nothing else; the semantic
fingerprint hashes ``(region, offset)`` so it does not depend on addresses.

A graph of 2,000 nodes holds ~8,000 operands, so the manifest is stored as
columns (one list per field, sorted by node, site, offset) and
:class:`Operand` objects are made only for the nodes someone asks about.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Annotated

import msgspec

from foundry.errors import IRError
from foundry.graphir.limits import MAX_OPERANDS, U32, U64, at_most
from foundry.graphir.regions import UNRESOLVED

WORD = 8  # bytes of a device pointer


class OperandSite(StrEnum):
    """Which field of a node holds the pointer."""

    PARAM = "param"  # a word of a kernel's parameter buffer
    MEMCPY_SRC = "memcpy.src"
    MEMCPY_DST = "memcpy.dst"
    MEMSET_DST = "memset.dst"
    ACCESS_POLICY = "attr.access_policy_window"


class Operand(msgspec.Struct, frozen=True, gc=False, array_like=True, forbid_unknown_fields=True):
    """One pointer word.

    For ``site == param``: ``param`` is the parameter index and ``offset`` the
    byte offset of the word in the whole parameter buffer. For other sites
    ``param`` is -1 and ``offset`` 0.
    """

    node: int
    site: OperandSite
    param: int
    offset: int
    value: int
    region: str
    region_offset: int

    @property
    def resolved(self) -> bool:
        return self.region != UNRESOLVED

    @property
    def key(self) -> tuple[int, str, int]:
        """Where the word sits, independent of its value."""
        return (self.node, self.site, self.offset)

    def location(self) -> str:
        """``region+0x..`` as people read it."""
        if not self.resolved:
            return f"unresolved 0x{self.value:x}"
        return f"{self.region}+0x{self.region_offset:x}"


_Index = Annotated[int, msgspec.Meta(ge=-1, lt=1 << 31)]


class OperandColumns(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """The manifest as stored: parallel columns; ``region`` indexes the graph's
    region list (sorted by name), -1 meaning unresolved."""

    node: Annotated[list[U32], at_most(MAX_OPERANDS)] = []
    site: Annotated[list[OperandSite], at_most(MAX_OPERANDS)] = []
    param: Annotated[list[_Index], at_most(MAX_OPERANDS)] = []  # -1: not a parameter
    offset: Annotated[list[U32], at_most(MAX_OPERANDS)] = []
    value: Annotated[list[U64], at_most(MAX_OPERANDS)] = []
    region: Annotated[list[_Index], at_most(MAX_OPERANDS)] = []  # -1: unresolved
    region_offset: Annotated[list[U64], at_most(MAX_OPERANDS)] = []

    def __len__(self) -> int:
        return len(self.node)


class OperandManifest:
    """Operands of one graph, ordered by node then site then offset.

    Each operand's region is held as an index (-1: unresolved) into a list of names: the graph's
    regions for a manifest read from a file, as the file stores it, or the sorted names its
    operands use for one built from them (:meth:`to_columns` maps them onto the file's list). The
    names per operand are listed when first asked: inspect and lint only count them, and a graph
    holds thousands of operands in a few dozen regions."""

    def __init__(self, operands: Iterable[Operand] = ()) -> None:
        ordered = sorted(operands, key=lambda o: (o.node, o.site, o.offset))
        self._node = [o.node for o in ordered]
        self._site = [OperandSite(o.site) for o in ordered]
        self._param = [o.param for o in ordered]
        self._offset = [o.offset for o in ordered]
        self._value = [o.value for o in ordered]
        self._region_offset = [o.region_offset for o in ordered]
        named = sorted({o.region for o in ordered} - {UNRESOLVED})
        position = {name: i for i, name in enumerate(named)} | {UNRESOLVED: -1}
        self._index = [position[o.region] for o in ordered]  # each operand's region, into _names
        self._names = [*named, UNRESOLVED]  # index -1 reads the last entry
        self._region: list[str] | None = None  # the names per operand, once listed

    @classmethod
    def from_columns(cls, columns: OperandColumns, region_names: list[str]) -> OperandManifest:
        """Rebuild from stored columns; the caller has checked lengths and indices
        (:func:`check_columns`)."""
        manifest = cls()
        manifest._node, manifest._site, manifest._param = columns.node, columns.site, columns.param
        manifest._offset, manifest._value = columns.offset, columns.value
        manifest._index, manifest._names = columns.region, [*region_names, UNRESOLVED]
        manifest._region_offset = columns.region_offset
        return manifest

    def _regions(self) -> list[str]:
        """Each operand's region name, listed from the indices on first use."""
        if self._region is None:
            self._region = [self._names[i] for i in self._index]
        return self._region

    def to_columns(self, region_names: list[str]) -> OperandColumns:
        index = {name: i for i, name in enumerate(region_names)} | {UNRESOLVED: -1}
        used = {i: self._names[i] for i in set(self._index)}
        missing = sorted(name for name in used.values() if name not in index)
        if missing:
            raise IRError("an operand points into a region the graph does not list", found=missing[0])
        remap = {i: index[name] for i, name in used.items()}  # this manifest's indices to the file's
        return OperandColumns(
            node=list(self._node),
            site=list(self._site),
            param=list(self._param),
            offset=list(self._offset),
            value=list(self._value),
            region=[remap[i] for i in self._index],
            region_offset=list(self._region_offset),
        )

    def check_structure(self, node_count: int, regions: set[str] | dict[str, object]) -> str | None:
        """What is structurally wrong, or ``None``: nodes out of range or out of
        order, or a region the graph does not have. (C-speed scans: graphs are big.)"""
        nodes = self._node
        if nodes and (nodes[0] < 0 or nodes[-1] >= node_count):
            return "operand names a node the graph does not have"
        if nodes != sorted(nodes):  # sorting a list already in order is one pass at C speed
            return "operands are not ordered by node"
        unknown = {self._names[i] for i in set(self._index)} - set(regions) - {UNRESOLVED}
        if unknown:
            return f"operand points into unknown region {sorted(unknown)[0]!r}"
        return None

    def _make(self, i: int, regions: list[str]) -> Operand:
        return Operand(
            self._node[i],
            self._site[i],
            self._param[i],
            self._offset[i],
            self._value[i],
            regions[i],
            self._region_offset[i],
        )

    def of(self, node: int) -> tuple[Operand, ...]:
        lo = bisect.bisect_left(self._node, node)
        hi = bisect.bisect_right(self._node, node, lo)
        regions = self._regions()
        return tuple(self._make(i, regions) for i in range(lo, hi))

    def unresolved(self) -> list[Operand]:
        regions = self._regions()
        return [self._make(i, regions) for i, region in enumerate(regions) if region == UNRESOLVED]

    def count_unresolved(self) -> int:
        return self._index.count(-1)

    def region_names(self) -> list[str]:
        """The region of every operand, in manifest order."""
        return self._regions()

    def region_uses(self) -> dict[str, int]:
        """How many operands point into each region that any points into (unresolved ones too)."""
        return {self._names[i]: count for i, count in Counter(self._index).items()}  # counted at C speed

    def rows(self) -> Iterator[tuple[int, OperandSite, int, int, int, str, int]]:
        """Every operand as a plain tuple (fast path for checks)."""
        return zip(
            self._node,
            self._site,
            self._param,
            self._offset,
            self._value,
            self._regions(),
            self._region_offset,
            strict=True,
        )

    def as_tuple(self) -> tuple[Operand, ...]:
        return tuple(self)

    def __iter__(self) -> Iterator[Operand]:
        regions = self._regions()
        return (self._make(i, regions) for i in range(len(self._node)))

    def __len__(self) -> int:
        return len(self._node)
