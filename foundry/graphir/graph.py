"""``GraphIR``: a captured CUDA graph as typed nodes on a networkx ``DiGraph``.

The graph object owns every mutation, so its invariants live in one place
(:meth:`GraphIR.check`). Node ids are capture-order indices ``0..n-1``; each
networkx node holds its typed node under :data:`NODE_KEY`, each edge its
:class:`EdgeData` under :data:`EDGE_KEY`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec
import networkx as nx

from foundry.errors import IRError
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, Node
from foundry.graphir.operands import WORD, Operand, OperandManifest, OperandSite
from foundry.graphir.regions import UNRESOLVED, Region

NODE_KEY = "ir"
EDGE_KEY = "edge"

#: ``CUgraphDependencyType``: a full dependency, or a programmatic (PDL) one.
EDGE_DEFAULT = 0
EDGE_PROGRAMMATIC = 1


class EdgeData(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """``CUgraphEdgeData``: ports and dependency type, kept as captured."""

    from_port: int = 0
    to_port: int = 0
    type: int = EDGE_DEFAULT


class Edge(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A dependency ``src -> dst`` (``dst`` runs after ``src``)."""

    src: int
    dst: int
    data: EdgeData = EdgeData()


MetaValue = str | int


class GraphIR:
    """One captured graph: nodes, edges, operand manifest and the regions it uses.

    Regions may nest (a backend buffer inside a larger allocation): each operand
    names the region it was resolved against.
    """

    def __init__(
        self,
        name: str,
        *,
        regions: Iterable[Region] = (),
        meta: dict[str, MetaValue] | None = None,
    ) -> None:
        self.name = name
        self.nx = nx.DiGraph(name=name)
        self.regions: dict[str, Region] = {}
        for region in regions:
            if region.name in self.regions or region.name == UNRESOLVED:
                raise IRError(f"region name {region.name!r} is reserved or used twice")
            self.regions[region.name] = region
        self.meta: dict[str, MetaValue] = dict(meta or {})
        self.operands = OperandManifest()

    # -- building ---------------------------------------------------------------

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if node.id in self.nx:
                raise IRError("node id used twice", node=node.id)
            self.nx.add_node(node.id, **{NODE_KEY: node})

    def add_edges(self, edges: Iterable[Edge]) -> None:
        for edge in edges:
            if edge.src not in self.nx or edge.dst not in self.nx:
                raise IRError(f"edge {edge.src} -> {edge.dst} names a node the graph does not have")
            if self.nx.has_edge(edge.src, edge.dst):
                raise IRError(f"duplicate edge {edge.src} -> {edge.dst}", node=edge.dst)
            self.nx.add_edge(edge.src, edge.dst, **{EDGE_KEY: edge.data})

    def set_operands(self, operands: Iterable[Operand]) -> None:
        self.operands = OperandManifest(operands)

    def replace_node(self, node: Node) -> None:
        """Swap a node for an edited copy with the same id (passes and tests use this)."""
        if node.id not in self.nx:
            raise IRError("no such node", node=node.id)
        self.nx.nodes[node.id][NODE_KEY] = node

    # -- reading ----------------------------------------------------------------

    def node(self, node_id: int) -> Node:
        try:
            return self.nx.nodes[node_id][NODE_KEY]
        except KeyError:
            raise IRError("no such node", node=node_id) from None

    def nodes(self) -> list[Node]:
        """Nodes in id (capture) order."""
        return [self.nx.nodes[i][NODE_KEY] for i in sorted(self.nx.nodes)]

    def edges(self) -> list[Edge]:
        """Edges sorted by ``(src, dst)``."""
        return [Edge(s, d, data[EDGE_KEY]) for s, d, data in sorted(self.nx.edges(data=True))]

    def kernels(self) -> list[KernelNode]:
        return [n for n in self.nodes() if isinstance(n, KernelNode)]

    def __len__(self) -> int:
        return self.nx.number_of_nodes()

    def counts_by_kind(self) -> Counter[str]:
        return Counter(str(node.kind) for node in self.nodes())

    def kernel_histogram(self) -> Counter[str]:
        return Counter(node.kernel.name for node in self.kernels())

    # -- invariants -------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`IRError` naming the node and the invariant it breaks."""
        ids = sorted(self.nx.nodes)
        if ids != list(range(len(ids))):
            raise IRError(f"node ids must be 0..{len(ids) - 1} in capture order")
        for node_id in ids:
            node = self.nx.nodes[node_id].get(NODE_KEY)
            if node is None or node.id != node_id:
                raise IRError("node record missing or holds another id", node=node_id)
            if isinstance(node, KernelNode):
                _check_kernel(node)
        for src, dst, data in self.nx.edges(data=True):
            if not isinstance(data.get(EDGE_KEY), EdgeData):
                raise IRError(f"edge {src} -> {dst} has no edge data", node=dst)
            if data[EDGE_KEY].type not in (EDGE_DEFAULT, EDGE_PROGRAMMATIC):
                raise IRError(f"edge {src} -> {dst} has unknown type {data[EDGE_KEY].type}", node=dst)
        seen: set[tuple[int, str, int]] = set()
        for operand in self.operands:
            if operand.key in seen:
                raise IRError(f"operand at {operand.site} offset {operand.offset} listed twice", node=operand.node)
            seen.add(operand.key)
            self._check_operand(operand)

    def _check_operand(self, operand: Operand) -> None:
        if operand.node not in self.nx:
            raise IRError("operand names a node the graph does not have", node=operand.node)
        node = self.node(operand.node)
        found = _word_at(node, operand)
        if found != operand.value:
            raise IRError(
                f"operand at {operand.site} offset {operand.offset} disagrees with the node's bytes",
                node=operand.node,
                expected=hex(operand.value),
                found=None if found is None else hex(found),
            )
        if not operand.resolved:
            return
        region = self.regions.get(operand.region)
        if region is None:
            raise IRError(f"operand points into unknown region {operand.region!r}", node=operand.node)
        if operand.value - region.base != operand.region_offset or not 0 <= operand.region_offset <= region.size:
            raise IRError(
                f"operand offset in {region.name} does not match its value",
                node=operand.node,
                expected=hex(operand.value - region.base),
                found=hex(operand.region_offset),
            )


def _check_kernel(node: KernelNode) -> None:
    try:
        node.layout.check()
    except IRError as err:
        raise IRError(err.message, node=node.id, kernel=node.kernel.name) from None
    if len(node.params) != node.layout.size:
        raise IRError(
            "parameter bytes do not match the layout",
            node=node.id,
            kernel=node.kernel.name,
            expected=node.layout.size,
            found=len(node.params),
        )


def _word_at(node: Node, operand: Operand) -> int | None:
    """The pointer word the operand names, read from the node, or None if absent."""
    site = operand.site
    if site is OperandSite.PARAM and isinstance(node, KernelNode):
        index = node.layout.slot_at(operand.offset)
        if index != operand.param or operand.offset % WORD or operand.offset + WORD > node.layout.slots[index].end:
            return None
        return int.from_bytes(node.params[operand.offset : operand.offset + WORD], "little")
    if site is OperandSite.MEMCPY_SRC and isinstance(node, MemcpyNode):
        return node.src
    if site is OperandSite.MEMCPY_DST and isinstance(node, MemcpyNode):
        return node.dst
    if site is OperandSite.MEMSET_DST and isinstance(node, MemsetNode):
        return node.dst
    if site is OperandSite.ACCESS_POLICY and isinstance(node, KernelNode):
        for attr in node.launch.attributes:
            if attr.name == "access_policy_window" and isinstance(attr.value, dict):
                return int(attr.value.get("base_ptr", -1))
    return None
