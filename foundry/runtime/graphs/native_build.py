"""Build graphs through the hook's native builder: pack the IR once, one C call per graph.

Building node by node through ``cuda-bindings`` costs ~145 ms for a 1,850-node
graph on the H200 test machine, almost all of it Python-side marshalling. Here
Python packs the graph into the flat description ``native/src/graph_build.c``
reads (kernels with their parameter bytes, copies, sets, edges) and the C
side makes the driver calls. Graphs with event nodes are left to
:func:`foundry.graphir.build.build`.
"""

from __future__ import annotations

import ctypes
import struct
import time
from typing import Any

from foundry.errors import IRError
from foundry.graphir.build import (
    MEMORY_TYPES,
    BuiltGraph,
    FunctionResolver,
    Relocation,
    apply_func_attrs,
    attribute_value,
    operand_address,
    relocated_params,
)
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import ATTRIBUTES_SINCE_4
from foundry.graphir.nodes import EmptyNode, EventRecordNode, EventWaitNode, KernelNode, MemcpyNode, MemsetNode
from foundry.graphir.operands import OperandSite

MAGIC = b"FGB1"
KERNEL, MEMCPY, MEMSET, EMPTY = 1, 2, 3, 4
ATTR_VALUE_BYTES = 64


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 4)


def supported(ir: GraphIR) -> bool:
    """Whether the native builder takes this graph (no event nodes)."""
    return not any(isinstance(n, EventRecordNode | EventWaitNode) for n in ir.nodes())


def packed_version(ir: GraphIR) -> int:
    """The lowest packed-graph version that holds ``ir``: 2 adds the launch attributes of graph
    format 4 (``ATTRIBUTES_SINCE_4``), so an older native library refuses only the plans it
    would build without them."""
    newer = any(a.name in ATTRIBUTES_SINCE_4 for node in ir.kernels() for a in node.launch.attributes)
    return 2 if newer else 1


def pack(ir: GraphIR, functions: FunctionResolver, *, relocate: Relocation | None = None,
         attribute_bytes: Any = None) -> bytes:  # fmt: skip
    """The packed description of ``ir`` (format in native/src/graph_build.c).
    ``attribute_bytes(name, value, operands)`` returns ``(id, 64 bytes)`` for a launch
    attribute; by default the driver's own structure is serialised."""
    to_bytes = attribute_bytes or _attribute_bytes(relocate)
    parts = [MAGIC, struct.pack("<III", packed_version(ir), len(ir), ir.edge_count())]
    for node in ir.nodes():
        operands = ir.operands.of(node.id)
        if isinstance(node, KernelNode):
            params = relocated_params(node, operands, relocate)
            parts.append(struct.pack("<IQ3I3III", KERNEL, functions.function(node.kernel), *node.launch.grid,
                                     *node.launch.block, node.launch.shared_mem,
                                     1 if node.arg_mode == "extra" else 0))  # fmt: skip
            n = len(node.layout.offsets)
            parts.append(struct.pack(f"<I{n}I{n}I", n, *node.layout.offsets, *node.layout.sizes))
            parts.append(struct.pack("<I", len(params)) + _pad(params))
            attrs = [to_bytes(a.name, a.value, operands) for a in node.launch.attributes]
            parts.append(struct.pack("<I", len(attrs)))
            parts.extend(struct.pack("<II", attr_id, 0) + raw for attr_id, raw in attrs)
        elif isinstance(node, MemcpyNode):
            src = operand_address(node.src, operands, OperandSite.MEMCPY_SRC, relocate)
            dst = operand_address(node.dst, operands, OperandSite.MEMCPY_DST, relocate)
            parts.append(
                struct.pack("<III", MEMCPY, int(MEMORY_TYPES[node.src_type]), int(MEMORY_TYPES[node.dst_type]))
            )
            parts.append(struct.pack("<QQ3Q3QQQQQ3Q", src, dst, *node.src_pos, *node.dst_pos, node.src_pitch,
                                     node.src_height, node.dst_pitch, node.dst_height, *node.extent))  # fmt: skip
        elif isinstance(node, MemsetNode):
            dst = operand_address(node.dst, operands, OperandSite.MEMSET_DST, relocate)
            parts.append(struct.pack("<IQIIQQQ", MEMSET, dst, node.value, node.element_size, node.width, node.height,
                                     node.pitch))  # fmt: skip
        elif isinstance(node, EmptyNode):
            parts.append(struct.pack("<I", EMPTY))
        else:
            raise IRError(f"{node.kind} nodes are not built natively", node=node.id, path=ir.name)
    for edge in ir.edges():
        parts.append(struct.pack("<IIBBBB", edge.src, edge.dst, edge.data.from_port, edge.data.to_port,
                                 edge.data.type, 0))  # fmt: skip
    return b"".join(parts)


def _attribute_bytes(relocate: Relocation | None) -> Any:
    def convert(name: str, value: Any, operands: tuple) -> tuple[int, bytes]:
        attr, v = attribute_value(name, value, operands, relocate)
        return int(attr), ctypes.string_at(v.getPtr(), ATTR_VALUE_BYTES)

    return convert


def check(lib: ctypes.CDLL, desc: bytes) -> tuple[int, int]:
    """Parse a description with the native reader: ``(nodes, edges)``, or IRError saying why not."""
    nodes, edges, err = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.create_string_buffer(256)
    if lib.foundry_graph_check(desc, ctypes.c_size_t(len(desc)), ctypes.byref(nodes), ctypes.byref(edges), err, 256):
        raise IRError(f"packed graph refused: {err.value.decode(errors='replace')}")
    return nodes.value, edges.value


def build_native(lib: ctypes.CDLL, ir: GraphIR, functions: FunctionResolver, *, relocate: Relocation | None = None,
                 applied: set[int] | None = None, timing: dict[str, float] | None = None,
                 flags: int = 0) -> BuiltGraph:  # fmt: skip
    """Build ``ir`` in the current context with the native builder and instantiate it with
    ``flags``. ``timing`` accumulates the seconds spent packing (Python) and in the C call."""
    from foundry.graphir.cuda import driver

    started = time.perf_counter()
    applied = set() if applied is None else applied
    for node in ir.kernels():
        apply_func_attrs(node, functions.function(node.kernel), applied)
    desc = pack(ir, functions, relocate=relocate)
    packed = time.perf_counter()
    graph, graph_exec, err = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.create_string_buffer(256)
    status = lib.foundry_graph_build(desc, ctypes.c_size_t(len(desc)), ctypes.c_uint64(flags), ctypes.byref(graph),
                                     ctypes.byref(graph_exec), err, 256)  # fmt: skip
    if timing is not None:
        timing["pack_s"] = timing.get("pack_s", 0.0) + packed - started
        timing["native_s"] = timing.get("native_s", 0.0) + time.perf_counter() - packed
    if status:
        raise IRError(f"native build failed: {err.value.decode(errors='replace')}", path=ir.name)
    drv = driver()
    return BuiltGraph(drv.CUgraph(graph.value), drv.CUgraphExec(graph_exec.value), [], ir, None)
