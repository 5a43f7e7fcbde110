"""On a GPU: what a graph rebuilt from its IR keeps: its edges, programmatic and plain, and
its kernel nodes' launch attributes.

Engines launch some kernels with programmatic dependent launch (FlashInfer's norms,
sgl-kernel's, cuBLAS's split-K reduce): captured, the edge into such a kernel is
programmatic (from the producer's programmatic port), the others plain. A rebuilt graph
must read back with exactly the capture's edges, or its kernels are ordered otherwise,
and with every launch attribute its nodes had, or they are scheduled otherwise.
"""

from __future__ import annotations

import ctypes
from collections import Counter

import pytest

from .conftest import nvcc_cubin

pytestmark = pytest.mark.gpu

# waits for its producer's writes where it was launched programmatically (a no-op otherwise);
# atomic: a cluster's blocks run together
KERNEL = r"""
extern "C" __global__ void bump(int* counts) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    atomicAdd(&counts[threadIdx.x], 1);
}
"""
# which launches ask for programmatic dependent launch, in capture order
PROGRAMMATIC = (False, True, False, True, True, False)


def _bump(tmp_path):
    """The driver module, 32 zeroed counters on the GPU and KERNEL loaded as a CUfunction."""
    import torch

    from foundry.graphir.cuda import cu, driver

    counts = torch.zeros(32, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    image = ctypes.create_string_buffer(nvcc_cubin(KERNEL, tmp_path, "bump").read_bytes())
    return driver(), counts, cu("cuModuleGetFunction", cu("cuModuleLoadData", ctypes.addressof(image)), b"bump")


def _launch(drv, cu, func, stream, counts, programmatic: bool) -> None:
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 1, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 32, 1, 1
    config.hStream = stream
    if programmatic:
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs, config.numAttrs = [attr], 1
    cu("cuLaunchKernelEx", config, func, ((counts.data_ptr(),), (ctypes.c_void_p,)), 0)


def _build(builder: str, hook_library, ir, functions):
    """``ir`` rebuilt by the Python builder (cuda-bindings) or the native one (the hook library)."""
    from foundry.graphir.build import build
    from foundry.runtime.graphs.native_build import build_native

    if builder == "python":
        return build(ir, functions)
    return build_native(ctypes.CDLL(str(hook_library)), ir, functions)


@pytest.mark.parametrize("builder", ["python", "native"])
def test_a_rebuilt_graph_reads_back_with_the_captured_edges(tmp_path, builder, hook_library):
    """Given all edges in one call, the driver gave each the first edge's data: the plain
    edges came back programmatic. Both builders add each kind of edge apart."""
    import torch

    from foundry.graphir.build import LiveFunctions
    from foundry.graphir.cuda import cu
    from foundry.graphir.lower import lower

    drv, counts, func = _bump(tmp_path)
    side = torch.cuda.Stream()
    stream = drv.CUstream(side.cuda_stream)
    cu("cuStreamBeginCapture", stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    for programmatic in PROGRAMMATIC:
        _launch(drv, cu, func, stream, counts, programmatic)
    captured = cu("cuStreamEndCapture", stream)

    functions = LiveFunctions()
    ir = lower(captured, "edges", functions=functions)
    edges = [(e.src, e.dst, e.data.from_port, e.data.to_port, e.data.type) for e in ir.edges()]
    # CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC (1) with CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC (1)
    expected = [(i - 1, i, 1, 0, 1) if p else (i - 1, i, 0, 0, 0) for i, p in enumerate(PROGRAMMATIC) if i]
    assert edges == expected
    exec_of_capture = cu("cuGraphInstantiate", captured, 0)  # what a first replay does to the capture
    assert _edges_of(lower(captured, "edges")) == _edges_of(ir)

    built = _build(builder, hook_library, ir, functions)
    back = lower(built.graph, "edges", functions=LiveFunctions())
    assert _edges_of(back) == _edges_of(ir)
    built.launch(side.cuda_stream)
    side.synchronize()
    assert counts.tolist() == [len(PROGRAMMATIC)] * 32  # every kernel ran once
    built.destroy()
    cu("cuGraphExecDestroy", exec_of_capture)
    cu("cuGraphDestroy", captured)


def _edges_of(ir) -> list[tuple]:
    return [(e.src, e.dst, e.data) for e in ir.edges()]


def test_a_rebuilt_node_keeps_its_launch_attributes(tmp_path):
    """Every launch attribute a kernel node may carry that lowering records is set on the
    rebuilt node (the cluster dimension always; the NVLink hint and the preferred cluster
    dimension where this GPU accepts them: the test prints which)."""
    import torch

    from foundry.graphir.build import LiveFunctions, build
    from foundry.graphir.cuda import cu, try_cu
    from foundry.graphir.lower import lower

    drv, counts, func = _bump(tmp_path)
    side = torch.cuda.Stream()
    stream = drv.CUstream(side.cuda_stream)
    cu("cuStreamBeginCapture", stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    cu("cuLaunchKernel", func, 4, 1, 1, 32, 1, 1, 0, stream, ((counts.data_ptr(),), (ctypes.c_void_p,)), 0)
    graph = cu("cuStreamEndCapture", stream)
    node = cu("cuGraphGetNodes", graph, 1)[0][0]
    ids = drv.CUkernelNodeAttrID

    def set_attribute(attr, fill) -> bool:
        """Set, where the driver takes it and reports it back on the node (on the H200 test
        machine, driver 580, it takes the NVLink hint but reports it on no node: lowering
        cannot see it; it refuses a preferred cluster dimension on a node)."""
        value = drv.CUkernelNodeAttrValue()
        fill(value)
        if try_cu("cuGraphKernelNodeSetAttribute", node, attr, value)[0] != drv.CUresult.CUDA_SUCCESS:
            return False
        return try_cu("cuGraphKernelNodeGetAttribute", node, attr)[0] == drv.CUresult.CUDA_SUCCESS

    def dims(field: str, x: int):
        return lambda v: [setattr(getattr(v, field), axis, n) for axis, n in zip("xyz", (x, 1, 1), strict=True)]

    assert set_attribute(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, dims("clusterDim", 2))
    expected = {"cluster_dim": (2, 1, 1)}
    if set_attribute(ids.CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING,
                     lambda v: setattr(v, "nvlinkUtilCentricScheduling", 1)):  # fmt: skip
        expected["nvlink_util_centric_scheduling"] = 1
    if set_attribute(ids.CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION, dims("preferredClusterDim", 4)):
        expected["preferred_cluster_dim"] = (4, 1, 1)
    print("attributes set:", sorted(expected))

    functions = LiveFunctions()
    ir = lower(graph, "attributes", functions=functions)
    recorded = {a.name: a.value for a in ir.node(0).launch.attributes}
    assert {k: recorded.get(k) for k in expected} == expected, recorded
    built = build(ir, functions)
    back = lower(built.graph, "attributes", functions=LiveFunctions())
    assert back.node(0).launch == ir.node(0).launch
    built.launch(side.cuda_stream)
    side.synchronize()
    assert counts.tolist() == [4] * 32  # four blocks, each adding one
    built.destroy()
    cu("cuGraphDestroy", graph)


def test_edges_the_driver_changed_are_named(tmp_path):
    """The driver's behaviour both builders work around, and the check that would catch it:
    the capture's edges added in one batch, the plain ones read back programmatic, and
    ``check_edges`` refuses naming the first plain edge that came back programmatic."""

    from foundry.errors import IRError
    from foundry.graphir.build import check_edges
    from foundry.graphir.cuda import cu
    from foundry.graphir.graph import Edge, EdgeData

    drv, counts, func = _bump(tmp_path)
    graph = cu("cuGraphCreate", 0)
    params = drv.CUDA_KERNEL_NODE_PARAMS()
    params.func, params.gridDimX, params.gridDimY, params.gridDimZ = func, 1, 1, 1
    params.blockDimX, params.blockDimY, params.blockDimZ = 32, 1, 1
    params.kernelParams = ((counts.data_ptr(),), (ctypes.c_void_p,))
    nodes = [cu("cuGraphAddKernelNode", graph, None, 0, params) for _ in PROGRAMMATIC]
    kinds = [EdgeData(1, 0, 1) if p else EdgeData() for p in PROGRAMMATIC[1:]]
    data = []
    for kind in kinds:
        d = drv.CUgraphEdgeData()
        d.from_port, d.to_port, d.type = kind.from_port, kind.to_port, kind.type
        data.append(d)
    cu("cuGraphAddDependencies", graph, nodes[:-1], nodes[1:], data, len(data))  # one batch, the first programmatic
    _, _, back, _ = cu("cuGraphGetEdges", graph, len(data))
    if Counter(EdgeData(int(d.from_port), int(d.to_port), int(d.type)) for d in back) == Counter(kinds):
        cu("cuGraphDestroy", graph)
        pytest.skip("this driver keeps each edge's data in one batch")
    described = [Edge(i, i + 1, kind) for i, kind in enumerate(kinds)]
    with pytest.raises(IRError, match="edge 1 -> 2 came back programmatic from the programmatic port, described plain"):
        check_edges(graph, nodes, described, "batched")
    cu("cuGraphDestroy", graph)
