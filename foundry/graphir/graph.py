"""``GraphIR``: a captured CUDA graph as typed nodes on a networkx ``DiGraph``.

The graph object owns every mutation, so its invariants live in one place
(:meth:`GraphIR.check`). Node ids are capture-order indices ``0..n-1``. The
networkx view (:attr:`GraphIR.nx`) holds each typed node under
:data:`NODE_KEY` and each edge's :class:`EdgeData` under :data:`EDGE_KEY`; it
is built on first use, because the offline commands that only count nodes
(inspect, lint) read tens of thousands of graphs and never walk them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from operator import attrgetter
from typing import TYPE_CHECKING

import msgspec

from foundry.errors import IRError
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.limits import I64, U8, U32, Name
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, Node
from foundry.graphir.operands import WORD, Operand, OperandManifest, OperandSite
from foundry.graphir.regions import UNRESOLVED, Region
from foundry.graphir.structure import check_acyclic, check_nodes, check_regions

if TYPE_CHECKING:
    import networkx as nx

NODE_KEY = "ir"
EDGE_KEY = "edge"

_KIND = attrgetter("kind")  # counted over thousands of nodes

#: ``CUgraphDependencyType``: a full dependency, or a programmatic (PDL) one.
EDGE_DEFAULT = 0
EDGE_PROGRAMMATIC = 1
_EDGE_TYPES = frozenset({EDGE_DEFAULT, EDGE_PROGRAMMATIC})
PROGRAMMATIC = "programmatic"  # how EdgeData.kind names a programmatic edge, first
_TYPE_NAMES = {EDGE_DEFAULT: "default-type", EDGE_PROGRAMMATIC: PROGRAMMATIC}
_PORT_NAMES = {0: "default", 1: "programmatic", 2: "launch-order"}  # CU_GRAPH_KERNEL_NODE_PORT_*


class EdgeData(msgspec.Struct, frozen=True, gc=False, array_like=True, forbid_unknown_fields=True):
    """``CUgraphEdgeData``: ports and dependency type, kept as captured."""

    from_port: U8 = 0
    to_port: U8 = 0
    type: U8 = EDGE_DEFAULT

    @property
    def kind(self) -> str:
        """As people read it: ``plain`` (the producer complete, its writes visible), else the
        dependency type and the producer's port it leaves from (a programmatic edge lets its
        consumer start before the producer ends; the launch-order port fires once all the
        producer's blocks have begun)."""
        if self == EdgeData():
            return "plain"
        to = f", to port {self.to_port}" if self.to_port else ""
        kind = _TYPE_NAMES.get(self.type, f"type {self.type}")
        return f"{kind} from the {_PORT_NAMES.get(self.from_port, str(self.from_port))} port{to}"


class Edge(msgspec.Struct, frozen=True, gc=False, array_like=True, forbid_unknown_fields=True):
    """A dependency ``src -> dst`` (``dst`` runs after ``src``)."""

    src: U32
    dst: U32
    data: EdgeData = EdgeData()


MetaValue = Name | I64


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
        self.regions: dict[str, Region] = {}
        for region in regions:
            if region.name in self.regions or region.name == UNRESOLVED:
                raise IRError(f"region name {region.name!r} is reserved or used twice")
            self.regions[region.name] = region
        self.meta: dict[str, MetaValue] = dict(meta or {})
        self.operands = OperandManifest()
        self._nodes: dict[int, Node] = {}
        self._edges: dict[tuple[int, int], EdgeData] = {}
        self._nx: nx.DiGraph | None = None

    # -- building ---------------------------------------------------------------

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if node.id in self._nodes:
                raise IRError("node id used twice", node=node.id)
            self._nodes[node.id] = node
        self._nx = None

    def add_edges(self, edges: Iterable[Edge]) -> None:
        for edge in edges:
            key = (edge.src, edge.dst)
            if edge.src not in self._nodes or edge.dst not in self._nodes:
                raise IRError(f"edge {edge.src} -> {edge.dst} names a node the graph does not have")
            if key in self._edges:
                raise IRError(f"duplicate edge {edge.src} -> {edge.dst}", node=edge.dst)
            self._edges[key] = edge.data
        self._nx = None

    def set_operands(self, operands: Iterable[Operand]) -> None:
        self.operands = OperandManifest(operands)

    def replace_node(self, node: Node) -> None:
        """Swap a node for an edited copy with the same id (passes and tests use this)."""
        if node.id not in self._nodes:
            raise IRError("no such node", node=node.id)
        self._nodes[node.id] = node
        if self._nx is not None:
            self._nx.nodes[node.id][NODE_KEY] = node

    # -- reading ----------------------------------------------------------------

    @property
    def nx(self) -> nx.DiGraph:
        """The networkx view: typed nodes under ``NODE_KEY``, ``EdgeData`` under ``EDGE_KEY``."""
        if self._nx is None:
            import networkx  # imported here: commands that only count nodes never pay for it

            graph = networkx.DiGraph(name=self.name)
            graph.add_nodes_from((i, {NODE_KEY: n}) for i, n in sorted(self._nodes.items()))
            graph.add_edges_from((s, d, {EDGE_KEY: data}) for (s, d), data in sorted(self._edges.items()))
            self._nx = graph
        return self._nx

    def node(self, node_id: int) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise IRError("no such node", node=node_id) from None

    def nodes(self) -> list[Node]:
        """Nodes in id (capture) order."""
        nodes = list(self._nodes.values())
        if list(self._nodes) == list(range(len(nodes))):  # added in order: the usual case
            return nodes
        return [self._nodes[i] for i in sorted(self._nodes)]

    def edges(self) -> list[Edge]:
        """Edges sorted by ``(src, dst)``."""
        return [Edge(s, d, data) for (s, d), data in sorted(self._edges.items())]

    def edge_count(self) -> int:
        return len(self._edges)

    def dependencies(self, node_id: int) -> tuple[list[Edge], list[Edge]]:
        """The edges into ``node_id`` and out of it, each side sorted (one pass over the edges:
        cheaper for one node than building the networkx view of a large graph)."""
        into, out = [], []
        for (src, dst), data in self._edges.items():
            if dst == node_id:
                into.append(Edge(src, dst, data))
            elif src == node_id:
                out.append(Edge(src, dst, data))
        return sorted(into, key=attrgetter("src")), sorted(out, key=attrgetter("dst"))

    def edge_kinds(self) -> Counter[str]:
        """Edges counted by :attr:`EdgeData.kind` (counted by their data first: graphs hold
        thousands of edges of two or three kinds)."""
        kinds: Counter[str] = Counter()
        for data, count in Counter(self._edges.values()).items():
            kinds[data.kind] += count
        return kinds

    def kernels(self) -> list[KernelNode]:
        return [n for n in self.nodes() if isinstance(n, KernelNode)]

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def counts_by_kind(self) -> Counter[str]:
        """Node counts keyed by :class:`NodeKind` (a ``str``)."""
        return Counter(map(_KIND, self._nodes.values()))

    def kernel_histogram(self) -> Counter[str]:
        return Counter(node.kernel.name for node in self._nodes.values() if isinstance(node, KernelNode))

    def kernel_table(self, kernels: list[KernelNode] | None = None) -> dict[str, tuple[KernelIdentity, int]]:
        """Each distinct kernel (by name, the first identity of it) with its launch count
        (``kernels``: the graph's kernel nodes, if the caller has them). Counted over names: a
        graph launches a few dozen kernels thousands of times, all of them among its first nodes."""
        kernels = self.kernels() if kernels is None else kernels
        counts = Counter([node.kernel.name for node in kernels])
        first: dict[str, KernelIdentity] = {}
        for node in kernels:
            if node.kernel.name not in first:
                first[node.kernel.name] = node.kernel
                if len(first) == len(counts):
                    break
        return {name: (first[name], count) for name, count in counts.items()}

    # -- invariants -------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`IRError` naming the node and the invariant it breaks:
        structure (:meth:`check_structure`), and every operand against the node's
        bytes and its region."""
        self.check_structure()
        self._check_operands()

    def check_structure(self) -> None:
        """The cheap half of :meth:`check`: ids, every node's own fields (layouts,
        undefined runs, copies and sets: :mod:`foundry.graphir.structure`), regions
        that nest or are disjoint, an acyclic set of edges, and every operand naming
        an existing node and region. Enough for every offline pass to run safely;
        :meth:`check` adds the byte-level checks LOAD relies on."""
        count = len(self._nodes)
        ids, expected = list(self._nodes), list(range(count))
        if ids != expected and sorted(ids) != expected:  # in order: the usual case
            raise IRError(f"node ids must be 0..{count - 1} in capture order")
        if [node.id for node in self._nodes.values()] != ids:
            node_id, node = next((i, n) for i, n in self._nodes.items() if n.id != i)
            raise IRError("node record holds another id", node=node_id, found=node.id)
        check_nodes(self._nodes.values())
        check_regions(self.regions.values())
        if not {data.type for data in self._edges.values()} <= _EDGE_TYPES:  # the types in use; the edge named after
            for (src, dst), data in self._edges.items():
                if data.type not in _EDGE_TYPES:
                    raise IRError(f"edge {src} -> {dst} has unknown type {data.type}", node=dst)
        check_acyclic(self._edges, count)
        problem = self.operands.check_structure(count, self.regions)
        if problem:
            raise IRError(problem, field="operands")

    def _check_operands(self) -> None:
        # one row per pointer word, hundreds of thousands in a large archive: the node a run of
        # rows belongs to is looked up once for the run, as are its parameter bytes and layout
        nodes, regions, param_site = self._nodes, self.regions, OperandSite.PARAM
        previous: tuple[int, str, int] | None = None
        current, node, kernel = -1, None, None
        for node_id, site, param, offset, value, region_name, region_offset in self.operands.rows():
            key = (node_id, site, offset)
            if previous is not None and key <= previous:
                raise IRError(f"operand at {site} offset {offset} listed twice or out of order", node=node_id)
            previous = key
            if node_id != current:
                current, node = node_id, nodes[node_id]
                kernel = node if isinstance(node, KernelNode) else None
                if kernel is not None:
                    limit, params = kernel.launch_bytes(), kernel.params
                    starts, sizes = kernel.layout.offsets, kernel.layout.sizes
            if site == param_site and kernel is not None:
                # the word, if it lies whole inside its parameter and inside what the launch passes
                whole = offset + WORD <= limit and not offset % WORD and 0 <= param < len(starts)
                if whole and starts[param] <= offset and offset + WORD <= starts[param] + sizes[param]:
                    found = int.from_bytes(params[offset : offset + WORD], "little")
                else:
                    found = None
            else:
                found = _field_word(node, site)
            if found != value:
                raise IRError(
                    f"operand at {site} offset {offset} disagrees with the node's bytes",
                    node=node_id,
                    expected=hex(value),
                    found=None if found is None else hex(found),
                )
            if region_name == UNRESOLVED:
                continue
            region = regions[region_name]
            if value - region.base != region_offset:
                raise IRError(
                    f"operand offset in {region.name} does not match its value",
                    node=node_id,
                    expected=hex(value - region.base),
                    found=hex(region_offset),
                )
            if region_offset > region.size:
                raise IRError(f"operand points outside its region {region.name}", node=node_id,
                              expected=f"<= {hex(region.size)}", found=hex(region_offset))  # fmt: skip


def _field_word(node: Node, site: OperandSite) -> int | None:
    """The address a non-parameter operand names (memcpy/memset target, access policy)."""
    if site == OperandSite.MEMCPY_SRC and isinstance(node, MemcpyNode):
        return node.src
    if site == OperandSite.MEMCPY_DST and isinstance(node, MemcpyNode):
        return node.dst
    if site == OperandSite.MEMSET_DST and isinstance(node, MemsetNode):
        return node.dst
    if site == OperandSite.ACCESS_POLICY and isinstance(node, KernelNode):
        for attr in node.launch.attributes:
            if attr.name == "access_policy_window" and isinstance(attr.value, dict):
                return int(attr.value.get("base_ptr", -1))
    return None
