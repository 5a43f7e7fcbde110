"""Lower a live ``CUgraph`` to :class:`GraphIR` (GPU only, through cuda-bindings).

This module and ``build.py`` are the only ones that speak raw driver structs.
Pointer words are found exactly: a word is an operand only when it lies in a
region the caller names or in a live allocation the driver reports through
``cuPointerGetAttribute`` range queries. Addresses that must be pointers
(memcpy/memset targets, the access policy window) but lie in no known
allocation are recorded as ``unresolved``, never guessed.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterable
from typing import Any, Protocol

import msgspec

from foundry.errors import DriverError
from foundry.graphir.cuda import KernelNodeParamsLayout, cu, driver, handle_value, try_cu
from foundry.graphir.graph import Edge, EdgeData, GraphIR, MetaValue
from foundry.graphir.kernel import (
    FuncAttribute,
    KernelIdentity,
    LaunchAttribute,
    LaunchConfig,
    ParamLayout,
    ParamSlot,
)
from foundry.graphir.kinds import NodeKind
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
from foundry.graphir.regions import UNRESOLVED, AddressRanges, Region, RegionKind

log = logging.getLogger(__name__)


class ImageSource(Protocol):
    """Says which module image (sha256) holds a kernel, given its handles, and the cache
    preference (``CUfunc_cache``) the program set on it, which the driver cannot report."""

    def image_of(self, func: int, kern: int) -> str | None: ...

    def cache_config_of(self, func: int, kern: int) -> int: ...


class FunctionSink(Protocol):
    """Collects the live ``CUfunction`` of every kernel met while lowering."""

    def add(self, kernel: KernelIdentity, handle: int) -> None: ...


_LAUNCH_PARAM_END = 0
_LAUNCH_PARAM_BUFFER_POINTER = 1
_LAUNCH_PARAM_BUFFER_SIZE = 2

# Function attributes as a freshly loaded function has them: 48 KiB of dynamic
# shared memory (less static) and no carveout preference. Only raised values
# need re-applying at LOAD, so only those are kept.
_FUNC_ATTR_DEFAULTS = {"max_dynamic_shared_size_bytes": 48 * 1024, "preferred_shared_memory_carveout": -1}

_MEMORY_TYPES = {1: "host", 2: "device", 3: "array", 4: "unified"}

# Plausible user-space virtual addresses; anything else is scalar data.
_MIN_ADDRESS = 1 << 16
_MAX_ADDRESS = 1 << 49


class AddressResolver:
    """Maps a 64-bit value to ``(region, offset)`` or ``None``.

    Named regions win; otherwise the driver's range query finds the live
    allocation, which becomes region ``alloc.<n>`` (``host.<n>`` for host
    memory) numbered by first reference.
    """

    def __init__(self, named: Iterable[Region] = (), *, query_driver: bool = True) -> None:
        self.named = AddressRanges.of_regions(named)
        self.discovered = AddressRanges()
        self.query_driver = query_driver
        self._misses: set[int] = set()
        self._counts = {RegionKind.ALLOC: 0, RegionKind.HOST: 0}

    def resolve(self, value: int) -> tuple[Region, int] | None:
        region = self.named.find(value) or self.discovered.find(value)
        if region is not None:
            return region, value - region.base
        if not self.query_driver or not _MIN_ADDRESS <= value < _MAX_ADDRESS or value in self._misses:
            return None
        found = self._query(value)
        if found is None:
            self._misses.add(value)
            return None
        return found, value - found.base

    def _query(self, value: int) -> Region | None:
        drv = driver()
        attr = drv.CUpointer_attribute
        err, mem_type = try_cu("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, value)
        if err != drv.CUresult.CUDA_SUCCESS:
            return None
        start = handle_value(cu("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, value))
        size = int(cu("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_RANGE_SIZE, value))
        kind = RegionKind.HOST if int(mem_type) == 1 else RegionKind.ALLOC
        region = Region(f"{kind.value}.{self._counts[kind]}", kind, start, size)
        self._counts[kind] += 1
        self.discovered.add(region)
        return region


class _Lowering:
    """State of one lowering: node ids, event numbering, operands, attribute defaults."""

    def __init__(self, resolver: AddressResolver, functions: FunctionSink | None, images: ImageSource | None) -> None:
        self.drv = driver()
        self.resolver = resolver
        self.functions = functions
        self.images = images
        self.operands: list[Operand] = []
        self.events: dict[int, int] = {}
        self.param_layouts: dict[int, ParamLayout] = {}
        self.func_attrs: dict[int, tuple[FuncAttribute, ...]] = {}
        self.names: dict[int, KernelIdentity] = {}
        self.attr_defaults: dict[str, Any] | None = None

    # -- nodes ------------------------------------------------------------------

    def node(self, node_id: int, handle: Any) -> Node:
        types = self.drv.CUgraphNodeType
        node_type = cu("cuGraphNodeGetType", handle)
        if node_type == types.CU_GRAPH_NODE_TYPE_KERNEL:
            return self.kernel(node_id, handle)
        if node_type == types.CU_GRAPH_NODE_TYPE_MEMCPY:
            return self.memcpy(node_id, handle)
        if node_type == types.CU_GRAPH_NODE_TYPE_MEMSET:
            return self.memset(node_id, handle)
        if node_type == types.CU_GRAPH_NODE_TYPE_EMPTY:
            return EmptyNode(node_id)
        if node_type == types.CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            return EventRecordNode(node_id, self._event(cu("cuGraphEventRecordNodeGetEvent", handle)))
        if node_type == types.CU_GRAPH_NODE_TYPE_WAIT_EVENT:
            return EventWaitNode(node_id, self._event(cu("cuGraphEventWaitNodeGetEvent", handle)))
        return self.unsupported(node_id, handle, node_type)

    def _event(self, event: Any) -> int:
        return self.events.setdefault(handle_value(event), len(self.events))

    def kernel(self, node_id: int, handle: Any) -> KernelNode:
        params = cu("cuGraphKernelNodeGetParams", handle)
        raw = KernelNodeParamsLayout.from_address(params.getPtr())
        func, kern = raw.func or 0, raw.kern or 0
        identity = self._identity(func, kern)
        layout = self._layout(func, kern)
        if self.functions is not None:
            live = func or handle_value(cu("cuKernelGetFunction", self.drv.CUkernel(kern)))
            self.functions.add(identity, live)
        packed_size = 0
        if raw.kernelParams:
            buf, mode = _gather_params(raw.kernelParams, layout), "params"
        elif raw.extra:
            (buf, packed_size), mode = _packed_params(raw.extra, layout), "extra"
        else:
            buf, mode = b"", "params"
        if len(buf) != layout.size:
            raise DriverError(
                f"kernel node {node_id} has {len(buf)} parameter bytes, layout says {layout.size}", kernel=identity.name
            )
        attributes = self._launch_attributes(handle, params)
        launch = LaunchConfig(tuple(raw.grid), tuple(raw.block), raw.sharedMemBytes, attributes)
        node = KernelNode(node_id, identity, launch, layout, buf, mode, self._func_attrs(func, kern),
                          packed_size=packed_size or msgspec.UNSET)  # fmt: skip
        self._param_operands(node)
        for attr in attributes:
            if attr.name == "access_policy_window" and isinstance(attr.value, dict):
                self._pointer(node_id, OperandSite.ACCESS_POLICY, int(attr.value["base_ptr"]))
        return node

    def memcpy(self, node_id: int, handle: Any) -> MemcpyNode:
        p = cu("cuGraphMemcpyNodeGetParams", handle)
        src_type = _MEMORY_TYPES.get(int(p.srcMemoryType), "array")
        dst_type = _MEMORY_TYPES.get(int(p.dstMemoryType), "array")
        src = handle_value(p.srcHost) if src_type == "host" else handle_value(p.srcDevice)
        dst = handle_value(p.dstHost) if dst_type == "host" else handle_value(p.dstDevice)
        node = MemcpyNode(
            node_id,
            src_type,
            dst_type,
            src,
            dst,
            extent=(int(p.WidthInBytes), int(p.Height), int(p.Depth)),
            src_pos=(int(p.srcXInBytes), int(p.srcY), int(p.srcZ)),
            dst_pos=(int(p.dstXInBytes), int(p.dstY), int(p.dstZ)),
            src_pitch=int(p.srcPitch),
            src_height=int(p.srcHeight),
            dst_pitch=int(p.dstPitch),
            dst_height=int(p.dstHeight),
        )
        self._pointer(node_id, OperandSite.MEMCPY_SRC, src)
        self._pointer(node_id, OperandSite.MEMCPY_DST, dst)
        return node

    def memset(self, node_id: int, handle: Any) -> MemsetNode:
        p = cu("cuGraphMemsetNodeGetParams", handle)
        dst = handle_value(p.dst)
        node = MemsetNode(node_id, dst, int(p.value), int(p.elementSize), int(p.width), int(p.height), int(p.pitch))
        self._pointer(node_id, OperandSite.MEMSET_DST, dst)
        return node

    def unsupported(self, node_id: int, handle: Any, node_type: Any) -> UnsupportedNode:
        types = self.drv.CUgraphNodeType
        kind = {
            types.CU_GRAPH_NODE_TYPE_HOST: NodeKind.HOST,
            types.CU_GRAPH_NODE_TYPE_GRAPH: NodeKind.CHILD_GRAPH,
            types.CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL: NodeKind.EXT_SEMAS_SIGNAL,
            types.CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT: NodeKind.EXT_SEMAS_WAIT,
            types.CU_GRAPH_NODE_TYPE_MEM_ALLOC: NodeKind.MEM_ALLOC,
            types.CU_GRAPH_NODE_TYPE_MEM_FREE: NodeKind.MEM_FREE,
            types.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: NodeKind.BATCH_MEM_OP,
            types.CU_GRAPH_NODE_TYPE_CONDITIONAL: NodeKind.CONDITIONAL,
        }.get(node_type)
        if kind is None:
            raise DriverError(f"node {node_id} has a node type Foundry does not know", found=int(node_type))
        detail = ""
        if kind is NodeKind.CHILD_GRAPH:
            child = cu("cuGraphChildGraphNodeGetGraph", handle)
            detail = f"{cu('cuGraphGetNodes', child, 0)[1]} nodes"
        elif kind is NodeKind.MEM_ALLOC:
            detail = f"{int(cu('cuGraphMemAllocNodeGetParams', handle).bytesize)} bytes"
        return UnsupportedNode(node_id, kind, detail)

    # -- kernels ----------------------------------------------------------------

    def _identity(self, func: int, kern: int) -> KernelIdentity:
        key = func or kern
        if key not in self.names:
            if func:
                raw = cu("cuFuncGetName", self.drv.CUfunction(func))
            else:
                raw = cu("cuKernelGetName", self.drv.CUkernel(kern))
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            image = self.images.image_of(func, kern) if self.images is not None else None
            self.names[key] = KernelIdentity(name=name, image=image)
        return self.names[key]

    def _layout(self, func: int, kern: int) -> ParamLayout:
        key = func or kern
        if key not in self.param_layouts:
            call, handle = (
                ("cuFuncGetParamInfo", self.drv.CUfunction(func))
                if func
                else ("cuKernelGetParamInfo", self.drv.CUkernel(kern))
            )
            slots = []
            while True:
                err, info = try_cu(call, handle, len(slots))
                if err != self.drv.CUresult.CUDA_SUCCESS:
                    break
                offset, size = info
                slots.append(ParamSlot(int(offset), int(size)))
            self.param_layouts[key] = ParamLayout.of(slots)
        return self.param_layouts[key]

    def _func_attrs(self, func: int, kern: int) -> tuple[FuncAttribute, ...]:
        """Function attributes LOAD must re-apply when it loads the image itself."""
        key = func or kern
        if key not in self.func_attrs:
            fa = self.drv.CUfunction_attribute
            wanted = {
                "max_dynamic_shared_size_bytes": fa.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                "preferred_shared_memory_carveout": fa.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            }
            values = []
            for name, attr in wanted.items():
                if func:
                    value = int(cu("cuFuncGetAttribute", attr, self.drv.CUfunction(func)))
                else:
                    value = int(cu("cuKernelGetAttribute", attr, self.drv.CUkernel(kern), cu("cuCtxGetDevice")))
                if value != _FUNC_ATTR_DEFAULTS[name] and not (name.startswith("max_dynamic") and value < 48 * 1024):
                    values.append(FuncAttribute(name, value))
            config = self.images.cache_config_of(func, kern) if self.images is not None else 0
            if config:  # a freshly loaded function has none (CU_FUNC_CACHE_PREFER_NONE)
                values.append(FuncAttribute("cache_config", config))
            self.func_attrs[key] = tuple(values)
        return self.func_attrs[key]

    def _launch_attributes(self, handle: Any, params: Any) -> tuple[LaunchAttribute, ...]:
        if self.attr_defaults is None:
            try:
                self.attr_defaults = self._default_attributes(params)
            except DriverError as err:  # keeping every attribute loses nothing
                log.warning("cannot read default launch attributes (%s); recording all of them", err)
                self.attr_defaults = {}
        found = _read_attributes(handle)
        return tuple(
            LaunchAttribute(name, value)
            for name, value in sorted(found.items())
            if self.attr_defaults.get(name) != value
        )

    def _default_attributes(self, params: Any) -> dict[str, Any]:
        """Attribute values of a fresh kernel node: added to a scratch graph with the
        same launch parameters, read back, and thrown away."""
        scratch = cu("cuGraphCreate", 0)
        try:
            node = cu("cuGraphAddKernelNode", scratch, None, 0, params)
            return _read_attributes(node)
        finally:
            cu("cuGraphDestroy", scratch)

    def _param_operands(self, node: KernelNode) -> None:
        for index, slot in enumerate(node.layout.slots):
            first = -(-slot.offset // WORD) * WORD
            for offset in range(first, slot.end - WORD + 1, WORD):
                value = int.from_bytes(node.params[offset : offset + WORD], "little")
                hit = self.resolver.resolve(value)
                if hit is not None:
                    region, region_offset = hit
                    self.operands.append(
                        Operand(node.id, OperandSite.PARAM, index, offset, value, region.name, region_offset)
                    )

    def _pointer(self, node_id: int, site: OperandSite, value: int) -> None:
        """An address the API says is a pointer: resolved, or recorded as unresolved."""
        hit = self.resolver.resolve(value)
        if hit is None:
            self.operands.append(Operand(node_id, site, -1, 0, value, UNRESOLVED, 0))
        else:
            region, region_offset = hit
            self.operands.append(Operand(node_id, site, -1, 0, value, region.name, region_offset))


def _gather_params(kernel_params: Any, layout: ParamLayout) -> bytes:
    buf = bytearray(layout.size)
    for index, slot in enumerate(layout.slots):
        ptr = kernel_params[index]
        buf[slot.offset : slot.end] = ctypes.string_at(ptr, slot.size)
    return bytes(buf)


def _packed_params(extra: Any, layout: ParamLayout) -> tuple[bytes, int]:
    """The packed argument buffer of an ``extra`` launch (``CU_LAUNCH_PARAM_BUFFER_*``),
    zero-filled to the layout's size, and the buffer's size when it is shorter (else 0):
    NCCL launches its kernels, whose one parameter is a 4 KiB structure, with only the
    bytes that launch uses."""
    pointer, size, i = None, None, 0
    while extra[i] and extra[i] != _LAUNCH_PARAM_END:
        key, value = extra[i], extra[i + 1]
        if key == _LAUNCH_PARAM_BUFFER_POINTER:
            pointer = value
        elif key == _LAUNCH_PARAM_BUFFER_SIZE:
            size = ctypes.c_size_t.from_address(value).value
        i += 2
    if pointer is None or size is None:
        raise DriverError("kernel node passes 'extra' without a parameter buffer and its size")
    if size == 0 and layout.size:
        raise DriverError(f"packed parameter buffer is empty, layout needs {layout.size} bytes")
    if size < layout.size:
        return ctypes.string_at(pointer, size) + bytes(layout.size - size), size
    return ctypes.string_at(pointer, layout.size), 0


def _read_attributes(handle: Any) -> dict[str, Any]:
    """The kernel node attributes Foundry keeps, as plain values."""
    drv = driver()
    ids = drv.CUkernelNodeAttrID
    readers = {
        "access_policy_window": (ids.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, _access_policy),
        "cooperative": (ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, lambda v: int(v.cooperative)),
        "cluster_dim": (
            ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            lambda v: (int(v.clusterDim.x), int(v.clusterDim.y), int(v.clusterDim.z)),
        ),
        "cluster_scheduling_policy": (
            ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
            lambda v: int(v.clusterSchedulingPolicyPreference),
        ),
        "priority": (ids.CU_LAUNCH_ATTRIBUTE_PRIORITY, lambda v: int(v.priority)),
        "mem_sync_domain_map": (
            ids.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
            lambda v: (int(v.memSyncDomainMap.default_), int(v.memSyncDomainMap.remote)),
        ),
        "mem_sync_domain": (ids.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, lambda v: int(v.memSyncDomain)),
        "preferred_shared_memory_carveout": (
            ids.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            lambda v: int(v.sharedMemCarveout),
        ),
        "device_updatable": (
            ids.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE,
            lambda v: int(v.deviceUpdatableKernelNode.deviceUpdatable),
        ),
        "preferred_cluster_dim": (
            ids.CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
            lambda v: (int(v.preferredClusterDim.x), int(v.preferredClusterDim.y), int(v.preferredClusterDim.z)),
        ),
        "nvlink_util_centric_scheduling": (
            ids.CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING,
            lambda v: int(v.nvlinkUtilCentricScheduling),
        ),
    }
    values: dict[str, Any] = {}
    for name, (attr_id, read) in readers.items():
        err, value = try_cu("cuGraphKernelNodeGetAttribute", handle, attr_id)
        if err == drv.CUresult.CUDA_SUCCESS:
            values[name] = read(value)
    return values


def _access_policy(value: Any) -> dict[str, int | float]:
    w = value.accessPolicyWindow
    return {
        "base_ptr": handle_value(w.base_ptr),
        "num_bytes": int(w.num_bytes),
        "hit_ratio": float(w.hitRatio),
        "hit_prop": int(w.hitProp),
        "miss_prop": int(w.missProp),
    }


def graph_handle(graph: Any) -> Any:
    """A ``CUgraph`` from what callers have: a handle, an int, or a torch ``CUDAGraph``
    captured with ``keep_graph=True``."""
    drv = driver()
    if hasattr(graph, "raw_cuda_graph"):
        graph = graph.raw_cuda_graph()
    if isinstance(graph, drv.CUgraph):
        return graph
    return drv.CUgraph(int(graph))


def lower(
    graph: Any,
    name: str,
    *,
    regions: Iterable[Region] = (),
    meta: dict[str, MetaValue] | None = None,
    resolver: AddressResolver | None = None,
    functions: FunctionSink | None = None,
    images: ImageSource | None = None,
) -> GraphIR:
    """Lower a live graph to IR.

    ``regions`` are the named address ranges operands resolve against first
    (the hook's ``vmm`` region, backend buffers, weights); the IR keeps all of
    them, plus the discovered allocations its operands use. Pass a shared
    ``resolver`` to number discovered allocations consistently across graphs,
    and ``functions`` (e.g. :class:`foundry.graphir.build.LiveFunctions`) to
    collect this process's function handles for rebuilding in-process;
    ``images`` (e.g. :class:`foundry.runtime.code.images.HookImages`) fills in each
    kernel's module image.
    """
    resolver = resolver or AddressResolver(regions)
    handle = graph_handle(graph)
    count = cu("cuGraphGetNodes", handle, 0)[1]
    handles = cu("cuGraphGetNodes", handle, count)[0][:count]
    index = {handle_value(h): i for i, h in enumerate(handles)}
    state = _Lowering(resolver, functions, images)
    nodes = [state.node(i, h) for i, h in enumerate(handles)]
    edges = _edges(handle, index)
    used = {o.region for o in state.operands}
    kept = resolver.named.regions() + [r for r in resolver.discovered.regions() if r.name in used]
    ir = GraphIR(name, regions=kept, meta=meta)
    ir.add_nodes(nodes)
    ir.add_edges(edges)
    ir.set_operands(state.operands)
    ir.check()
    return ir


def _edges(handle: Any, index: dict[int, int]) -> list[Edge]:
    count = cu("cuGraphGetEdges", handle, 0)[-1]
    if not count:
        return []
    src, dst, data, count = cu("cuGraphGetEdges", handle, count)
    edges = []
    for a, b, d in zip(src[:count], dst[:count], data[:count], strict=True):
        edge_data = EdgeData(int(d.from_port), int(d.to_port), int(d.type))
        edges.append(Edge(index[handle_value(a)], index[handle_value(b)], edge_data))
    return sorted(edges, key=lambda e: (e.src, e.dst))
