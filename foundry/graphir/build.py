"""Build a live ``CUgraph`` from :class:`GraphIR` (GPU only, through cuda-bindings).

The inverse of ``lower.py``: kernel nodes with their parameter buffers (as
``kernelParams`` or one packed ``extra`` buffer, as captured), non-default
launch attributes and function attributes; memcpy, memset, event and empty
nodes; then every edge with its edge data in one call. Pointer words are
rewritten only where a relocation says so, operand by operand.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from foundry.errors import IRError
from foundry.graphir.cuda import KernelNodeParamsLayout, cu, driver, handle_value
from foundry.graphir.graph import Edge, EdgeData, GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.nodes import (
    EmptyNode,
    EventRecordNode,
    EventWaitNode,
    KernelNode,
    MemcpyNode,
    MemsetNode,
    Node,
    UnsupportedNode,
)
from foundry.graphir.operands import WORD, Operand, OperandSite

MEMORY_TYPES = {"host": 1, "device": 2, "array": 3, "unified": 4}

Relocation = Callable[[Operand], int]


class FunctionResolver(Protocol):
    """Where a kernel lives in this process: its ``CUfunction`` handle value."""

    def function(self, kernel: KernelIdentity) -> int: ...


@dataclass
class LiveFunctions:
    """Resolve kernels to functions this process already has, by entry name and image (two
    specialisations of one Triton kernel share a name).

    Lowering fills one (``lower(..., functions=...)``) while it walks a live
    graph; the native module registry provides the same for a fresh process."""

    by_identity: dict[tuple[str, str | None], int] = field(default_factory=dict)

    def add(self, kernel: KernelIdentity, handle: int) -> None:
        self.by_identity.setdefault((kernel.name, kernel.image), handle)

    def function(self, kernel: KernelIdentity) -> int:
        try:
            return self.by_identity[(kernel.name, kernel.image)]
        except KeyError:
            raise IRError("no function in this process for kernel", kernel=kernel.name) from None


@dataclass
class BuiltGraph:
    """A built, instantiated graph and what keeps it valid."""

    graph: Any
    exec: Any
    events: list[Any]
    ir: GraphIR | None = None
    handles: list[Any] | None = None  # node handles in IR order, for members built from this one

    def launch(self, stream: int = 0) -> None:
        cu("cuGraphLaunch", self.exec, driver().CUstream(stream))

    def destroy(self) -> None:
        if self.exec is not None:  # None: built, not yet instantiated (foundry.runtime.graphs.instantiation)
            cu("cuGraphExecDestroy", self.exec)
        cu("cuGraphDestroy", self.graph)
        for event in self.events:
            cu("cuEventDestroy", event)


def relocated_params(node: KernelNode, operands: tuple[Operand, ...], relocate: Relocation | None) -> bytes:
    """The bytes the launch passes (``launch_bytes`` of them), each pointer operand relocated."""
    if relocate is None:
        return node.params[: node.launch_bytes()]
    buf = bytearray(node.params)
    for operand in operands:
        if operand.site == OperandSite.PARAM:
            buf[operand.offset : operand.offset + WORD] = relocate(operand).to_bytes(WORD, "little")
    return bytes(buf[: node.launch_bytes()])


def operand_address(
    node_value: int, operands: tuple[Operand, ...], site: OperandSite, relocate: Relocation | None
) -> int:
    if relocate is None:
        return node_value
    for operand in operands:
        if operand.site == site:
            return relocate(operand)
    return node_value


def apply_func_attrs(node: KernelNode, func: int, applied: set[int]) -> None:
    """Set the function attributes SAVE recorded (dynamic shared memory, carveout, cache
    preference), once per function."""
    apply_attributes(func, ((a.name, a.value) for a in node.func_attrs), applied)


def apply_attributes(func: int, attrs: Iterable[tuple[str, int]], applied: set[int]) -> None:
    """Set ``(name, value)`` function attributes on ``func``, once per function."""
    attrs = tuple(attrs)
    if func in applied or not attrs:
        return
    drv = driver()
    fa = drv.CUfunction_attribute
    ids = {
        "max_dynamic_shared_size_bytes": fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        "preferred_shared_memory_carveout": fa.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
    }
    for name, value in attrs:
        if name == "cache_config":  # in CACHE_CONFIGS: checked when the graph or plan was decoded
            cu("cuFuncSetCacheConfig", drv.CUfunction(func), drv.CUfunc_cache(value))
        elif name in ids:
            cu("cuFuncSetAttribute", drv.CUfunction(func), ids[name], value)
        else:
            raise IRError("unknown function attribute", field="func_attrs", found=name)
    applied.add(func)


def attribute_value(
    name: str, value: Any, operands: tuple[Operand, ...], relocate: Relocation | None
) -> tuple[Any, Any]:
    """The ``(CUkernelNodeAttrID, CUkernelNodeAttrValue)`` for one recorded launch attribute."""
    drv = driver()
    ids = drv.CUkernelNodeAttrID
    v = drv.CUkernelNodeAttrValue()
    if name == "cluster_dim":
        v.clusterDim.x, v.clusterDim.y, v.clusterDim.z = value
        attr = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    elif name == "mem_sync_domain_map":
        v.memSyncDomainMap.default_, v.memSyncDomainMap.remote = value
        attr = ids.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
    elif name == "access_policy_window":
        w = v.accessPolicyWindow
        w.base_ptr = operand_address(int(value["base_ptr"]), operands, OperandSite.ACCESS_POLICY, relocate)
        w.num_bytes, w.hitRatio = int(value["num_bytes"]), float(value["hit_ratio"])
        w.hitProp, w.missProp = int(value["hit_prop"]), int(value["miss_prop"])
        attr = ids.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
    elif name == "device_updatable":
        v.deviceUpdatableKernelNode.deviceUpdatable = value
        attr = ids.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE
    elif name == "preferred_cluster_dim":
        v.preferredClusterDim.x, v.preferredClusterDim.y, v.preferredClusterDim.z = value
        attr = ids.CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION
    else:
        field_name, attr = _SCALAR_ATTRIBUTES[name]
        setattr(v, field_name, value)
        attr = getattr(ids, attr)
    return attr, v


class _Builder:
    def __init__(self, ir: GraphIR, functions: FunctionResolver, relocate: Relocation | None) -> None:
        self.drv = driver()
        self.ir = ir
        self.functions = functions
        self.relocate = relocate
        self.graph = cu("cuGraphCreate", 0)
        self.ctx = cu("cuCtxGetCurrent")
        self.events: dict[int, Any] = {}
        self.applied: set[int] = set()

    def kernel_params(self, node: KernelNode, operands: tuple[Operand, ...]) -> tuple[Any, list[Any]]:
        """``CUDA_KERNEL_NODE_PARAMS`` for a node and the buffers it points into (kept alive by the caller)."""
        func = self.functions.function(node.kernel)
        self.apply_func_attrs(node, func)
        params = relocated_params(node, operands, self.relocate)
        p = self.drv.CUDA_KERNEL_NODE_PARAMS()
        raw = KernelNodeParamsLayout.from_address(p.getPtr())
        raw.func = func
        raw.grid[:] = node.launch.grid
        raw.block[:] = node.launch.block
        raw.sharedMemBytes = node.launch.shared_mem
        buffer = ctypes.create_string_buffer(params, max(len(params), 1))
        base = ctypes.addressof(buffer)
        if node.arg_mode == "extra":
            size = ctypes.c_size_t(len(params))
            extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(size), 0)
            raw.extra = ctypes.cast(extra, ctypes.POINTER(ctypes.c_void_p))
            return p, [buffer, size, extra]
        pointers = (ctypes.c_void_p * max(len(node.layout.offsets), 1))(
            *[base + offset for offset in node.layout.offsets]
        )
        raw.kernelParams = ctypes.cast(pointers, ctypes.POINTER(ctypes.c_void_p))
        return p, [buffer, pointers]

    def add(self, node: Node) -> Any:
        operands = self.ir.operands.of(node.id)
        if isinstance(node, KernelNode):
            return self.kernel(node, operands)
        if isinstance(node, MemcpyNode):
            return self.memcpy(node, operands)
        if isinstance(node, MemsetNode):
            return self.memset(node, operands)
        if isinstance(node, EmptyNode):
            return cu("cuGraphAddEmptyNode", self.graph, None, 0)
        if isinstance(node, EventRecordNode):
            return cu("cuGraphAddEventRecordNode", self.graph, None, 0, self.event(node.event))
        if isinstance(node, EventWaitNode):
            return cu("cuGraphAddEventWaitNode", self.graph, None, 0, self.event(node.event))
        kind = node.node_type if isinstance(node, UnsupportedNode) else node.kind
        raise IRError(f"{kind} nodes cannot be rebuilt", node=node.id)

    def event(self, number: int) -> Any:
        if number not in self.events:
            self.events[number] = cu("cuEventCreate", 0)
        return self.events[number]

    def kernel(self, node: KernelNode, operands: tuple[Operand, ...]) -> Any:
        p, _keep = self.kernel_params(node, operands)
        handle = cu("cuGraphAddKernelNode", self.graph, None, 0, p)  # the driver copies the arguments
        for attr in node.launch.attributes:
            self.set_attribute(handle, attr.name, attr.value, operands)
        return handle

    def apply_func_attrs(self, node: KernelNode, func: int) -> None:
        apply_func_attrs(node, func, self.applied)

    def set_attribute(self, handle: Any, name: str, value: Any, operands: tuple[Operand, ...]) -> None:
        attr, v = attribute_value(name, value, operands, self.relocate)
        cu("cuGraphKernelNodeSetAttribute", handle, attr, v)

    def memcpy(self, node: MemcpyNode, operands: tuple[Operand, ...]) -> Any:
        return cu("cuGraphAddMemcpyNode", self.graph, None, 0, self.memcpy_params(node, operands), self.ctx)

    def memcpy_params(self, node: MemcpyNode, operands: tuple[Operand, ...]) -> Any:
        p = self.drv.CUDA_MEMCPY3D()
        src = operand_address(node.src, operands, OperandSite.MEMCPY_SRC, self.relocate)
        dst = operand_address(node.dst, operands, OperandSite.MEMCPY_DST, self.relocate)
        p.srcMemoryType, p.dstMemoryType = MEMORY_TYPES[node.src_type], MEMORY_TYPES[node.dst_type]
        if node.src_type == "host":
            p.srcHost = src
        else:
            p.srcDevice = src
        if node.dst_type == "host":
            p.dstHost = dst
        else:
            p.dstDevice = dst
        p.srcXInBytes, p.srcY, p.srcZ = node.src_pos
        p.dstXInBytes, p.dstY, p.dstZ = node.dst_pos
        p.srcPitch, p.srcHeight, p.dstPitch, p.dstHeight = (
            node.src_pitch,
            node.src_height,
            node.dst_pitch,
            node.dst_height,
        )
        p.WidthInBytes, p.Height, p.Depth = node.extent
        return p

    def memset(self, node: MemsetNode, operands: tuple[Operand, ...]) -> Any:
        return cu("cuGraphAddMemsetNode", self.graph, None, 0, self.memset_params(node, operands), self.ctx)

    def memset_params(self, node: MemsetNode, operands: tuple[Operand, ...]) -> Any:
        p = self.drv.CUDA_MEMSET_NODE_PARAMS()
        p.dst = operand_address(node.dst, operands, OperandSite.MEMSET_DST, self.relocate)
        p.value, p.elementSize, p.width, p.height, p.pitch = (
            node.value, node.element_size, node.width, node.height, node.pitch,
        )  # fmt: skip
        return p

    def edges(self, handles: list[Any]) -> None:
        """One ``cuGraphAddDependencies`` call per kind of edge, each kind's edges in the IR's
        order: given one batch, the driver gives every edge the first edge's data (seen on the
        H200 test machine, driver 580: plain edges after a programmatic first one came back
        programmatic, letting GEMMs start before their inputs were complete)."""
        described = self.ir.edges()
        by_kind: dict[EdgeData, list[Edge]] = {}
        for edge in described:
            by_kind.setdefault(edge.data, []).append(edge)
        for data, edges in by_kind.items():
            d = self.drv.CUgraphEdgeData()
            d.from_port, d.to_port, d.type = data.from_port, data.to_port, data.type
            cu(
                "cuGraphAddDependencies",
                self.graph,
                [handles[e.src] for e in edges],
                [handles[e.dst] for e in edges],
                [d] * len(edges),
                len(edges),
            )
        check_edges(self.graph, handles, described, self.ir.name)


EdgeEnds = tuple[int, int, EdgeData]  # an edge as the read-back compares it: its ends' indices, its kind


def _edge_order(edge: EdgeEnds) -> tuple[int, ...]:
    src, dst, d = edge
    return src, dst, d.from_port, d.to_port, d.type


def _edge_data(d: Any) -> EdgeData:
    return EdgeData(int(d.from_port), int(d.to_port), int(d.type))


def check_edges(graph: Any, handles: Sequence[Any], described: Iterable[Edge], name: str) -> None:
    """``graph``'s edges read back are ``described`` (``handles``: its nodes, by index), each
    with its ends and kind, or IRError naming the first that differs: a driver that changed an
    edge's kind would order the kernels otherwise, silently. All of them are read (the driver
    fills at most the count it is given), so that an edge it added is seen too."""
    want = sorted(((e.src, e.dst, e.data) for e in described), key=_edge_order)
    count = cu("cuGraphGetEdges", graph, 0)[-1]
    src, dst, data, count = cu("cuGraphGetEdges", graph, count) if count else ([], [], [], 0)
    index = {handle_value(h): i for i, h in enumerate(handles)}
    kept = sorted(
        (
            (index.get(handle_value(a), -1), index.get(handle_value(b), -1), _edge_data(d))
            for a, b, d in zip(src[:count], dst[:count], data[:count], strict=True)
        ),
        key=_edge_order,
    )
    if kept != want:
        raise IRError(f"{_first_difference(want, kept)} ({count} edges in all, {len(want)} described)", path=name)


def _first_difference(want: list[EdgeEnds], kept: list[EdgeEnds]) -> str:
    """The first edge, in order, described but not read back or read back but not described."""
    i = next((k for k, (w, g) in enumerate(zip(want, kept, strict=False)) if w != g), min(len(want), len(kept)))
    meant, back = (want[i] if i < len(want) else None), (kept[i] if i < len(kept) else None)
    if meant and back and meant[:2] == back[:2]:
        return f"edge {meant[0]} -> {meant[1]} came back {back[2].kind}, described {meant[2].kind}"
    if meant and (back is None or _edge_order(meant) < _edge_order(back)):
        return f"the driver lost edge {meant[0]} -> {meant[1]} ({meant[2].kind})"
    assert back is not None  # the lists differ, so one of them has an edge at i
    ends = " -> ".join("?" if n < 0 else str(n) for n in back[:2])  # ?: a node the graph was not given
    return f"the driver added an edge {ends} ({back[2].kind})"


_SCALAR_ATTRIBUTES: Mapping[str, tuple[str, str]] = {
    "cooperative": ("cooperative", "CU_LAUNCH_ATTRIBUTE_COOPERATIVE"),
    "cluster_scheduling_policy": (
        "clusterSchedulingPolicyPreference",
        "CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE",
    ),
    "priority": ("priority", "CU_LAUNCH_ATTRIBUTE_PRIORITY"),
    "mem_sync_domain": ("memSyncDomain", "CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN"),
    "preferred_shared_memory_carveout": ("sharedMemCarveout", "CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT"),
    "nvlink_util_centric_scheduling": (
        "nvlinkUtilCentricScheduling",
        "CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING",
    ),
}


def build(
    ir: GraphIR, functions: FunctionResolver, *, relocate: Relocation | None = None, flags: int = 0
) -> BuiltGraph:
    """Create, fill and instantiate a graph from ``ir`` in the current context.

    ``functions`` says which ``CUfunction`` runs each kernel; ``relocate``, if
    given, returns the live value of every operand (the identity when None);
    ``flags``: the instantiation flags (``CUgraphInstantiate_flags``)."""
    builder = _Builder(ir, functions, relocate)
    handles = [builder.add(node) for node in ir.nodes()]
    builder.edges(handles)
    graph_exec = cu("cuGraphInstantiate", builder.graph, flags)
    return BuiltGraph(builder.graph, graph_exec, list(builder.events.values()), ir, handles)


def _attributes_differ(a: GraphIR, b: GraphIR) -> bool:
    return any(x.launch.attributes != y.launch.attributes for x, y in zip(a.kernels(), b.kernels(), strict=True))


def build_member(
    template: BuiltGraph,
    ir: GraphIR,
    functions: FunctionResolver,
    *,
    relocate: Relocation | None = None,
    flags: int = 0,
) -> BuiltGraph:
    """Build ``ir`` from a graph of the same topology (see
    :func:`foundry.graphir.fingerprint.topology_key`): clone the template and
    update only the nodes whose parameters differ, then instantiate."""
    if template.ir is None or template.handles is None or template.events:
        raise IRError("this graph cannot serve as a template (no IR kept, or it records events)")
    if _attributes_differ(template.ir, ir):  # a launch attribute cannot be unset on a clone
        return build(ir, functions, relocate=relocate, flags=flags)
    builder = _Builder(ir, functions, relocate)
    cu("cuGraphDestroy", builder.graph)
    builder.graph = cu("cuGraphClone", template.graph)
    for node, original in zip(ir.nodes(), template.handles, strict=True):
        before = template.ir.node(node.id)
        if node == before and ir.operands.of(node.id) == template.ir.operands.of(node.id):
            continue
        handle = cu("cuGraphNodeFindInClone", original, builder.graph)
        operands = ir.operands.of(node.id)
        if isinstance(node, KernelNode):
            p, _keep = builder.kernel_params(node, operands)
            cu("cuGraphKernelNodeSetParams", handle, p)
            for attr in node.launch.attributes:  # access-policy windows hold addresses
                builder.set_attribute(handle, attr.name, attr.value, operands)
        elif isinstance(node, MemcpyNode):
            cu("cuGraphMemcpyNodeSetParams", handle, builder.memcpy_params(node, operands))
        elif isinstance(node, MemsetNode):
            cu("cuGraphMemsetNodeSetParams", handle, builder.memset_params(node, operands))
    graph_exec = cu("cuGraphInstantiate", builder.graph, flags)
    return BuiltGraph(builder.graph, graph_exec, [], ir, None)
