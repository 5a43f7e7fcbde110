"""Export a graph for other tools: GraphML (through networkx) and Graphviz DOT.

Both carry the same flat view: scalar attributes only (strings and ints), so
``networkx.read_graphml`` gives back exactly :func:`flat_view`. Addresses are
hex strings: they do not fit GraphML's signed 64-bit ``long``. Names from the
archive have their control characters escaped: XML cannot hold them, and an
export written to a terminal must not drive it.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from foundry.graphir.graph import GraphIR
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode
from foundry.graphir.passes.diff import node_label
from foundry.text import printable

if TYPE_CHECKING:
    import networkx as nx

FORMATS = ("graphml", "dot")


def _node_attrs(ir: GraphIR, node_id: int) -> dict[str, str | int]:
    node = ir.node(node_id)
    attrs: dict[str, str | int] = {"kind": str(node.kind), "label": printable(node_label(node))}
    if isinstance(node, KernelNode):
        attrs.update(
            kernel=printable(node.kernel.name),
            demangled=printable(node.kernel.demangled),
            image=printable(node.kernel.image or ""),
            grid=",".join(map(str, node.launch.grid)),
            block=",".join(map(str, node.launch.block)),
            shared_mem=node.launch.shared_mem,
            params=node.params.hex(),
        )
    elif isinstance(node, MemcpyNode):
        attrs.update(src=hex(node.src), dst=hex(node.dst), bytes=node.extent[0] * node.extent[1] * node.extent[2])
    elif isinstance(node, MemsetNode):
        attrs.update(dst=hex(node.dst), value=node.value, element_size=node.element_size, width=node.width)
    operands = ir.operands.of(node_id)
    if operands:
        attrs["operands"] = printable(
            ";".join(f"{o.site.value}[{o.param}]+{o.offset}={o.location()}" for o in operands)
        )
    return attrs


def flat_view(ir: GraphIR) -> nx.DiGraph:
    """The graph with scalar attributes only, as exported."""
    import networkx as nx  # imported here: it takes a tenth of a second, and only an export needs it

    flat = nx.DiGraph(name=printable(ir.name))
    for node in ir.nodes():
        flat.add_node(node.id, **_node_attrs(ir, node.id))
    for edge in ir.edges():
        flat.add_edge(edge.src, edge.dst, from_port=edge.data.from_port, to_port=edge.data.to_port, type=edge.data.type)
    return flat


def to_graphml(ir: GraphIR) -> str:
    import networkx as nx

    out = io.BytesIO()
    nx.write_graphml(flat_view(ir), out, named_key_ids=True)
    return out.getvalue().decode()


def _dot_quote(value: object) -> str:
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def to_dot(ir: GraphIR) -> str:
    """Graphviz DOT: one box per node labelled ``id: kernel``; programmatic edges dashed."""
    flat = flat_view(ir)
    lines = [f"digraph {_dot_quote(printable(ir.name))} {{", "  node [shape=box, fontname=monospace];"]
    for node_id, attrs in flat.nodes(data=True):
        label = f"{node_id}: {attrs['label']}"
        extra = ", ".join(f"{k}={_dot_quote(v)}" for k, v in attrs.items() if k not in ("label", "params"))
        lines.append(f"  {node_id} [label={_dot_quote(label)}, {extra}];")
    for src, dst, data in flat.edges(data=True):
        style = ", style=dashed" if data["type"] else ""
        lines.append(f"  {src} -> {dst} [from_port={data['from_port']}, to_port={data['to_port']}{style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export(ir: GraphIR, fmt: str) -> str:
    if fmt == "graphml":
        return to_graphml(ir)
    if fmt == "dot":
        return to_dot(ir)
    raise ValueError(f"unknown export format {fmt!r}; choose one of {FORMATS}")
