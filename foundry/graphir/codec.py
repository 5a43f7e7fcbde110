"""The serialized form of one graph: a typed MessagePack document.

MessagePack rather than JSON because graphs are large and machine-read:
parameter buffers stay raw bytes instead of base64, and decoding is faster.
People read graphs through ``foundry graph show`` / ``export`` or the TUI.
Encoding is canonical (nodes by id, edges by endpoints, operands by node, site
and offset, regions by name), so archive -> IR -> archive is byte-stable.
Decoding is typed (msgspec, unknown fields refused), bounded (every array by
:mod:`foundry.graphir.limits`; the nodes of a large file are decoded one at a
time, within the graph's totals) and ends with :meth:`GraphIR.check`; nothing in
the document is evaluated.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Annotated, Literal

import msgspec

from foundry.errors import IRError
from foundry.graphir.graph import Edge, GraphIR, MetaValue
from foundry.graphir.kernel import ATTRIBUTES_SINCE_4
from foundry.graphir.limits import (
    MAX_EDGES,
    MAX_GRAPH_ATTRIBUTES,
    MAX_GRAPH_PARAMS,
    MAX_GRAPH_UNDEFINED_RUNS,
    MAX_META,
    MAX_NODES,
    MAX_REGIONS,
    Name,
    at_most,
)
from foundry.graphir.nodes import KernelNode, Node
from foundry.graphir.operands import OperandColumns, OperandManifest
from foundry.graphir.regions import Region

GRAPH_FORMAT = "foundry-graph"
# 2 adds ``KernelNode.packed_size``, 3 the function attribute ``cache_config``, 4 the launch
# attributes ``preferred_cluster_dim`` and ``nvlink_util_centric_scheduling``; a graph is
# written at the lowest version that holds it, so graphs without them stay readable by older Foundry
GRAPH_VERSION = 4


class GraphDocument(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """A graph as stored; every array bounded (:mod:`foundry.graphir.limits`)."""

    format: Literal["foundry-graph"]
    version: int
    name: Name
    meta: Annotated[dict[Name, MetaValue], at_most(MAX_META)]
    regions: Annotated[tuple[Region, ...], at_most(MAX_REGIONS)]
    nodes: Annotated[tuple[Node, ...], at_most(MAX_NODES)]
    edges: Annotated[tuple[Edge, ...], at_most(MAX_EDGES)]
    operands: OperandColumns


class _StoredDocument(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """A :class:`GraphDocument` as read: its nodes left raw, to be decoded one at a time."""

    format: Literal["foundry-graph"]
    version: int
    name: Name
    meta: Annotated[dict[Name, MetaValue], at_most(MAX_META)]
    regions: Annotated[tuple[Region, ...], at_most(MAX_REGIONS)]
    nodes: Annotated[tuple[msgspec.Raw, ...], at_most(MAX_NODES)]
    edges: Annotated[tuple[Edge, ...], at_most(MAX_EDGES)]
    operands: OperandColumns


GRAPH_SUFFIX = ".msgpack"

#: Below this many bytes a graph file is decoded whole (its objects, 10-20x its bytes, stay in the
#: low hundreds of MiB), which is a third faster; above it, node by node within the totals.
WHOLE_DECODE_BYTES = 8 << 20

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_StoredDocument)
_document_decoder = msgspec.msgpack.Decoder(GraphDocument)
_node_decoder = msgspec.msgpack.Decoder(Node)
_TOTALS = (MAX_GRAPH_PARAMS, MAX_GRAPH_UNDEFINED_RUNS, MAX_GRAPH_ATTRIBUTES)
_COUNTED = tuple(map(attrgetter, ("layout.offsets", "undefined", "launch.attributes")))  # what each total counts
_AT = re.compile(r" - at `\$(.*)`$")


def _decode_nodes(raws: tuple[msgspec.Raw, ...]) -> tuple[Node, ...]:
    """Decode the nodes in order, refusing the graph as soon as its kernels hold more
    parameters, undefined runs or launch attributes in all than the limits allow: memory
    stays bounded by the totals, not by what the file manages to pack into its bytes."""
    nodes: list[Node] = []
    totals = [0, 0, 0]
    for i, raw in enumerate(raws):
        try:
            node = _node_decoder.decode(raw)
        except msgspec.ValidationError as err:  # the path from the document's root, as a whole decode says it
            text = str(err)
            found = _AT.search(text)
            where = f"$.nodes[{i}]{found.group(1) if found else ''}"
            raise msgspec.ValidationError(f"{text[: found.start()] if found else text} - at `{where}`") from None
        _count(node, i, totals)
        nodes.append(node)
    return tuple(nodes)


def _check_totals(nodes: tuple[Node, ...]) -> None:
    """The totals :func:`_decode_nodes` keeps, for a graph decoded whole: summed at once, and
    only for a graph over a limit counted node by node, to name where it passed it."""
    params = runs = attributes = 0  # what _COUNTED names, summed in one pass over the nodes, not three
    for node in nodes:
        if isinstance(node, KernelNode):
            params += len(node.layout.offsets)
            runs += len(node.undefined)
            attributes += len(node.launch.attributes)
    if all(found <= limit for found, limit in zip((params, runs, attributes), _TOTALS, strict=True)):
        return
    totals = [0, 0, 0]
    for i, node in enumerate(nodes):
        _count(node, i, totals)


def _count(node: Node, index: int, totals: list[int]) -> None:
    """Add a kernel's parameters, undefined runs and launch attributes to ``totals``; refuse
    the graph once one passes its limit."""
    if not isinstance(node, KernelNode):
        return
    for i, field in enumerate(_COUNTED):
        totals[i] += len(field(node))
    if any(found > limit for found, limit in zip(totals, _TOTALS, strict=True)):
        raise IRError("the graph's kernels hold more parameters, undefined runs or launch attributes "
                      "than a graph may", field="nodes", node=index,
                      expected="<= {} parameters, {} undefined runs, {} launch attributes".format(*_TOTALS),
                      found=totals)  # fmt: skip


def graph_version(ir: GraphIR) -> int:
    """The lowest graph format version that holds ``ir``."""
    kernels = ir.kernels()
    if any(a.name in ATTRIBUTES_SINCE_4 for node in kernels for a in node.launch.attributes):
        return 4
    if any(a.name == "cache_config" for node in kernels for a in node.func_attrs):
        return 3
    return 2 if any(node.packed_size for node in kernels) else 1


def to_document(ir: GraphIR) -> GraphDocument:
    regions = tuple(sorted(ir.regions.values(), key=lambda r: r.name))
    return GraphDocument(
        format=GRAPH_FORMAT,
        version=graph_version(ir),
        name=ir.name,
        meta=dict(sorted(ir.meta.items())),
        regions=regions,
        nodes=tuple(ir.nodes()),
        edges=tuple(ir.edges()),
        operands=ir.operands.to_columns([r.name for r in regions]),
    )


def _check_columns(columns: OperandColumns, regions: int) -> None:
    lengths = {len(getattr(columns, f)) for f in columns.__struct_fields__}
    if len(lengths) > 1:
        raise IRError("operand columns differ in length", field="operands")
    used = set(columns.region)  # a few distinct indices among thousands of operands
    if used and not -1 <= min(used) <= max(used) < regions:
        raise IRError("operand region index out of range", field="operands.region")


def from_document(doc: GraphDocument, *, deep: bool = True) -> GraphIR:
    """Build and check the IR a document describes; raise :class:`IRError` if it
    breaks an invariant. ``deep=False`` checks structure only (see
    :meth:`GraphIR.check_structure`)."""
    if not 1 <= doc.version <= GRAPH_VERSION:
        raise IRError(
            "graph format version not readable by this Foundry",
            field="version",
            expected=f"1 to {GRAPH_VERSION}",
            found=doc.version,
        )
    ir = GraphIR(doc.name, regions=doc.regions, meta=doc.meta)
    ir.add_nodes(doc.nodes)
    ir.add_edges(doc.edges)
    _check_columns(doc.operands, len(doc.regions))
    ir.operands = OperandManifest.from_columns(doc.operands, [r.name for r in doc.regions])
    if doc.version < (needed := graph_version(ir)):  # an older Foundry would have misread it
        raise IRError(f"the graph holds fields of format version {needed}", field="version", expected=needed,
                      found=doc.version)  # fmt: skip
    if deep:
        ir.check()
    else:
        ir.check_structure()
    return ir


def encode_graph(ir: GraphIR) -> bytes:
    return _encoder.encode(to_document(ir))


def decode_graph(data: bytes, *, deep: bool = True) -> GraphIR:
    """Decode and check a graph document.

    Raises :class:`IRError` for a well-typed document that breaks an invariant and
    ``msgspec.ValidationError``/``msgspec.DecodeError``/``RecursionError`` for
    malformed input; the archive reader turns both into one ``ArchiveError``.
    """
    if len(data) <= WHOLE_DECODE_BYTES:
        document = _document_decoder.decode(data)
        _check_totals(document.nodes)
        return from_document(document, deep=deep)
    stored = _decoder.decode(data)
    document = GraphDocument(stored.format, stored.version, stored.name, stored.meta, stored.regions,
                             _decode_nodes(stored.nodes), stored.edges, stored.operands)  # fmt: skip
    return from_document(document, deep=deep)
