"""Semantic views of nodes and the fingerprint of a graph.

A semantic view is what a node *means*, independent of where the process put
its memory: pointer words are replaced by their ``(region, offset)`` and the
remaining parameter bytes kept as they are. Two SAVEs of the same program at
different region bases therefore fingerprint the same, and any change in
kernel, launch config, scalar bytes, operand target or edges changes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import msgspec

from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import LaunchConfig
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, Node
from foundry.graphir.operands import WORD, Operand, OperandSite

FINGERPRINT_SCHEME = "fp1"


def scalar_bytes(node: KernelNode, operands: tuple[Operand, ...],
                 also_undefined: tuple[tuple[int, int], ...] = ()) -> bytes:  # fmt: skip
    """The parameter buffer with every pointer word and undefined byte zeroed
    (``also_undefined``: more ``(offset, length)`` runs, e.g. another SAVE's marks)."""
    buf = bytearray(node.params)
    for offset, length in (*node.undefined, *also_undefined):  # another SAVE's runs may reach past this buffer
        end = min(offset + length, len(buf))
        if offset < end:
            buf[offset:end] = bytes(end - offset)
    for operand in operands:
        if operand.site is OperandSite.PARAM:
            buf[operand.offset : operand.offset + WORD] = bytes(WORD)
    return bytes(buf)


def operand_target(operand: Operand) -> tuple[str, int]:
    """Where a pointer points, as compared across processes."""
    if operand.resolved:
        return (operand.region, operand.region_offset)
    return (operand.region, operand.value)


def _launch_view(launch: LaunchConfig) -> tuple[Any, ...]:
    attributes = []
    for attr in launch.attributes:
        value = attr.value
        if isinstance(value, dict):  # its base_ptr is an operand, compared by target
            value = tuple(sorted((k, v) for k, v in value.items() if k != "base_ptr"))
        attributes.append((attr.name, value))
    return (launch.grid, launch.block, launch.shared_mem, tuple(attributes))


def node_view(node: Node, operands: tuple[Operand, ...],
              also_undefined: tuple[tuple[int, int], ...] = ()) -> tuple[Any, ...]:  # fmt: skip
    """The semantic view of one node (see module docstring)."""
    targets = tuple((o.site.value, o.param, o.offset, *operand_target(o)) for o in operands)
    if isinstance(node, KernelNode):
        return (
            "kernel",
            node.kernel.name,
            node.kernel.image,
            _launch_view(node.launch),
            (node.layout.offsets, node.layout.sizes),
            scalar_bytes(node, operands, also_undefined),
            node.arg_mode,
            tuple((a.name, a.value) for a in node.func_attrs),
            targets,
        ) + ((("packed_size", node.packed_size),) if node.packed_size else ())
    if isinstance(node, MemcpyNode):
        fields = msgspec.structs.asdict(node)
        for key in ("id", "src", "dst"):
            fields.pop(key)
        return ("memcpy", tuple(sorted(fields.items())), targets)
    if isinstance(node, MemsetNode):
        return ("memset", node.value, node.element_size, node.width, node.height, node.pitch, targets)
    fields = msgspec.structs.asdict(node)
    fields.pop("id")
    return (str(node.kind), tuple(sorted(fields.items())), targets)


def fingerprint(ir: GraphIR, also_undefined: Mapping[int, tuple[tuple[int, int], ...]] | None = None) -> str:
    """``fp1:<sha256>`` over node views in id order and edges with their data.
    ``also_undefined``: more undefined runs by node id (another SAVE's marks), for comparing."""
    digest = hashlib.sha256()
    encode = msgspec.msgpack.Encoder().encode
    extra = also_undefined or {}
    for node in ir.nodes():
        digest.update(encode(node_view(node, ir.operands.of(node.id), extra.get(node.id, ()))))
    for edge in ir.edges():
        digest.update(encode((edge.src, edge.dst, edge.data.from_port, edge.data.to_port, edge.data.type)))
    return f"{FINGERPRINT_SCHEME}:{digest.hexdigest()}"


def topology_key(ir: GraphIR) -> str:
    """``top1:<sha256>`` over node kinds, kernel identities and edges: graphs with
    the same key differ only in what a parameter update can change, so LOAD builds
    them from one template."""
    digest = hashlib.sha256()
    encode = msgspec.msgpack.Encoder().encode
    for node in ir.nodes():
        identity = (node.kernel.name, node.kernel.image) if isinstance(node, KernelNode) else None
        digest.update(encode((str(node.kind), identity)))
    for edge in ir.edges():
        digest.update(encode((edge.src, edge.dst, edge.data.from_port, edge.data.to_port, edge.data.type)))
    return f"top1:{digest.hexdigest()}"
