"""The serialized form of one graph: a typed JSON document.

Encoding is canonical (nodes by id, edges by endpoints, operands by node, site
and offset, regions by name), so archive -> IR -> archive is byte-stable.
Decoding is typed (msgspec, unknown fields refused) and ends with
:meth:`GraphIR.check`; nothing in the document is evaluated.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from foundry.errors import IRError
from foundry.graphir.graph import Edge, GraphIR, MetaValue
from foundry.graphir.nodes import Node
from foundry.graphir.operands import Operand
from foundry.graphir.regions import Region

GRAPH_FORMAT = "foundry-graph"
GRAPH_VERSION = 1


class GraphDocument(msgspec.Struct, forbid_unknown_fields=True):
    format: Literal["foundry-graph"]
    version: int
    name: str
    meta: dict[str, MetaValue]
    regions: tuple[Region, ...]
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    operands: tuple[Operand, ...]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(GraphDocument)


def to_document(ir: GraphIR) -> GraphDocument:
    return GraphDocument(
        format=GRAPH_FORMAT,
        version=GRAPH_VERSION,
        name=ir.name,
        meta=dict(sorted(ir.meta.items())),
        regions=tuple(sorted(ir.regions.values(), key=lambda r: r.name)),
        nodes=tuple(ir.nodes()),
        edges=tuple(ir.edges()),
        operands=ir.operands.as_tuple(),
    )


def from_document(doc: GraphDocument) -> GraphIR:
    """Build and check the IR a document describes; raise :class:`IRError` if it breaks an invariant."""
    if doc.version != GRAPH_VERSION:
        raise IRError(
            "graph format version not readable by this Foundry",
            field="version",
            expected=GRAPH_VERSION,
            found=doc.version,
        )
    ir = GraphIR(doc.name, regions=doc.regions, meta=doc.meta)
    ir.add_nodes(doc.nodes)
    ir.add_edges(doc.edges)
    ir.set_operands(doc.operands)
    ir.check()
    return ir


def encode_graph(ir: GraphIR) -> bytes:
    return _encoder.encode(to_document(ir))


def decode_graph(data: bytes) -> GraphIR:
    """Decode and check a graph document.

    Raises :class:`IRError` for a well-typed document that breaks an invariant and
    ``msgspec.ValidationError``/``msgspec.DecodeError``/``RecursionError`` for
    malformed input; the archive reader turns both into one ``ArchiveError``.
    """
    return from_document(_decoder.decode(data))
