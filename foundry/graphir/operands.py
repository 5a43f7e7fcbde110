"""The operand manifest: every word of a graph that is a device pointer.

An operand names where a pointer sits (node, site, parameter, byte offset),
the value the SAVE process saw, and where it points as ``(region, offset)``.
Relocation rewrites exactly these words and nothing else; the semantic
fingerprint hashes ``(region, offset)`` so it does not depend on addresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from enum import StrEnum

import msgspec

from foundry.graphir.regions import UNRESOLVED

WORD = 8  # bytes of a device pointer


class OperandSite(StrEnum):
    """Which field of a node holds the pointer."""

    PARAM = "param"  # a word of a kernel's parameter buffer
    MEMCPY_SRC = "memcpy.src"
    MEMCPY_DST = "memcpy.dst"
    MEMSET_DST = "memset.dst"
    ACCESS_POLICY = "attr.access_policy_window"


class Operand(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
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
        return (self.node, self.site.value, self.offset)

    def location(self) -> str:
        """``region+0x..`` as people read it."""
        if not self.resolved:
            return f"unresolved 0x{self.value:x}"
        return f"{self.region}+0x{self.region_offset:x}"


class OperandManifest:
    """Operands of one graph, ordered by node then site then offset, indexed by node."""

    def __init__(self, operands: Iterable[Operand] = ()) -> None:
        self._operands = tuple(sorted(operands, key=lambda o: (o.node, o.site.value, o.offset)))
        self._by_node: dict[int, list[Operand]] = {}
        for operand in self._operands:
            self._by_node.setdefault(operand.node, []).append(operand)

    def of(self, node: int) -> tuple[Operand, ...]:
        return tuple(self._by_node.get(node, ()))

    def unresolved(self) -> list[Operand]:
        return [o for o in self._operands if not o.resolved]

    def regions_used(self) -> set[str]:
        return {o.region for o in self._operands if o.resolved}

    def as_tuple(self) -> tuple[Operand, ...]:
        return self._operands

    def __iter__(self) -> Iterator[Operand]:
        return iter(self._operands)

    def __len__(self) -> int:
        return len(self._operands)
