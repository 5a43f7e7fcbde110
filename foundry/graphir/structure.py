"""What a graph must be for LOAD to build it, checked without looking at operand bytes.

:meth:`GraphIR.check_structure` runs these on every graph read, so no offline
command works on a graph LOAD could not honour: parameter layouts that fit their
bytes, ``undefined`` runs inside the parameter buffer, copies and sets whose
fields describe memory an address can reach, regions that are disjoint or nest
(a tensor inside its allocation) but never cross, and dependencies without
self-loops or cycles. Each check raises :class:`IRError` naming the node.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from itertools import starmap

import msgspec

from foundry.errors import IRError
from foundry.graphir.kernel import ParamLayout
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, Node
from foundry.graphir.regions import Region

UNSET = msgspec.UNSET
ADDRESS_END = 1 << 64  # one past the last byte a 64-bit address can name


def check_node(node: Node) -> None:
    """The fields of one node agree with each other (see the module docstring)."""
    if isinstance(node, KernelNode):
        check_kernel(node)
    elif isinstance(node, MemcpyNode):
        check_memcpy(node)
    elif isinstance(node, MemsetNode):
        check_memset(node)


def check_nodes(nodes: Iterable[Node]) -> None:
    """:func:`check_node` for each node. A graph launches a few dozen kernels thousands of times
    alike, so a kernel is checked only where what :func:`check_kernel` reads of it (all but the
    id and kernel it names) differs from every kernel passed before it; one that fails raises,
    naming itself, as it would checked alone."""
    passed: set[tuple[object, ...]] = set()  # this graph's: at most one key per node
    for node in nodes:
        if type(node) is not KernelNode:
            check_node(node)
            continue
        key = node.layout, len(node.params), node.packed_size, node.arg_mode, node.undefined
        if key not in passed:
            check_kernel(node)
            passed.add(key)


@functools.lru_cache(maxsize=4096)
def _checked_size(layout: ParamLayout) -> int:
    """The buffer size of a layout whose slots were checked (:meth:`ParamLayout.check`). A graph
    launches the same kernels thousands of times, so each distinct layout is checked once; a
    layout that fails is not remembered, and is checked (and refused) again wherever it occurs."""
    layout.check()
    return layout.size


def check_kernel(node: KernelNode) -> None:
    """Parameter layout ordered and covering ``params`` exactly; ``undefined`` runs inside it."""
    try:
        size = _checked_size(node.layout)
    except IRError as err:
        raise IRError(err.message, node=node.id, kernel=node.kernel.name) from None
    params = len(node.params)
    if params != size:
        raise IRError("parameter bytes do not match the layout", node=node.id, kernel=node.kernel.name,
                      expected=size, found=params)  # fmt: skip
    packed = node.packed_size
    if packed is not UNSET and not (node.arg_mode == "extra" and 0 < packed < size):
        raise IRError("a shorter packed buffer needs arg mode 'extra' and fewer bytes than the layout", node=node.id,
                      kernel=node.kernel.name, expected=f"< {size}", found=packed)  # fmt: skip
    end = 0
    for offset, length in node.undefined:
        if length <= 0 or offset < end or offset + length > len(node.params):
            raise IRError("undefined bytes must be ordered runs inside the parameter buffer", node=node.id,
                          field="undefined", expected=f"runs in [{end}, {len(node.params)})",
                          found=[offset, length])  # fmt: skip
        end = offset + length


def _copy_end(address: int, pos: tuple[int, int, int], pitch: int, height: int, extent: tuple[int, int, int]) -> int:
    """One past the last byte a 3D copy side touches (as the driver walks it)."""
    width, rows, depth = extent
    start = address + pos[2] * pitch * height + pos[1] * pitch + pos[0]
    return start + (depth - 1) * pitch * height + (rows - 1) * pitch + width


def check_memcpy(node: MemcpyNode) -> None:
    """A copy of at least one byte whose pitches hold its rows and whose sides stay in the address space."""
    width, rows, depth = node.extent
    if min(node.extent) < 1:
        raise IRError("a copy's extent must be at least one byte, row and slice", node=node.id, field="extent",
                      found=list(node.extent))  # fmt: skip
    for side in ("src", "dst"):
        pos, pitch, height = (
            getattr(node, f"{side}_pos"),
            getattr(node, f"{side}_pitch"),
            getattr(node, f"{side}_height"),
        )
        if (rows > 1 or depth > 1) and pitch < pos[0] + width:
            raise IRError(f"the {side} pitch is shorter than a row", node=node.id, field=f"{side}_pitch",
                          expected=f">= {pos[0] + width}", found=pitch)  # fmt: skip
        if depth > 1 and height < pos[1] + rows:
            raise IRError(f"the {side} height is shorter than a slice", node=node.id, field=f"{side}_height",
                          expected=f">= {pos[1] + rows}", found=height)  # fmt: skip
        if _copy_end(getattr(node, side), pos, pitch, height, node.extent) > ADDRESS_END:
            raise IRError(f"the copy's {side} runs past the end of the address space", node=node.id, field=side)


def check_memset(node: MemsetNode) -> None:
    """A set of at least one element whose pitch holds a row and that stays in the address space."""
    row = node.width * node.element_size
    if node.width < 1 or node.height < 1:
        raise IRError("a memset sets at least one element and one row", node=node.id, field="width/height",
                      found=[node.width, node.height])  # fmt: skip
    if node.height > 1 and node.pitch < row:
        raise IRError("the memset pitch is shorter than a row", node=node.id, field="pitch", expected=f">= {row}",
                      found=node.pitch)  # fmt: skip
    if node.dst + (node.height - 1) * node.pitch + row > ADDRESS_END:
        raise IRError("the memset runs past the end of the address space", node=node.id, field="dst")


def check_regions(regions: Iterable[Region]) -> None:
    """Regions are disjoint or nest; two that cross cannot both be where an operand points."""
    open_: list[Region] = []  # the chain of regions that contain the current one
    for region in sorted(regions, key=lambda r: (r.base, -r.size, r.name)):
        while open_ and open_[-1].end <= region.base:
            open_.pop()
        if open_ and region.end > open_[-1].end:
            raise IRError(f"region {region.name!r} overlaps region {open_[-1].name!r} without nesting in it",
                          field="regions", found=[hex(region.base), region.size])  # fmt: skip
        open_.append(region)


def check_acyclic(edges: Iterable[tuple[int, int]], count: int) -> None:
    """No node depends on itself, directly or through others (a CUDA graph is a DAG)."""
    edges = list(edges)
    if all(starmap(operator.lt, edges)):
        return  # every edge runs forward in capture order: no cycle, no self-loop (the usual case)
    for src, dst in edges:
        if src == dst:
            raise IRError(f"edge {src} -> {dst} makes node {src} depend on itself", node=src, field="edges")
    incoming = [0] * count
    after: list[list[int]] = [[] for _ in range(count)]
    for src, dst in edges:
        incoming[dst] += 1
        after[src].append(dst)
    ready = [i for i in range(count) if not incoming[i]]
    done = 0
    while ready:
        node = ready.pop()
        done += 1
        for nxt in after[node]:
            incoming[nxt] -= 1
            if not incoming[nxt]:
                ready.append(nxt)
    if done < count:
        stuck = next(i for i in range(count) if incoming[i])
        raise IRError("the dependencies form a cycle", node=stuck, field="edges")
