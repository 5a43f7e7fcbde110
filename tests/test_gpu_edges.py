"""On a GPU: a graph's edges, programmatic and plain, survive lowering and rebuilding.

Engines launch some kernels with programmatic dependent launch (FlashInfer's norms,
sgl-kernel's, cuBLAS's split-K reduce): captured, the edge into such a kernel is
programmatic (from the producer's programmatic port), the others plain. A rebuilt graph
must read back with exactly the capture's edges, or its kernels are ordered otherwise.
"""

from __future__ import annotations

import ctypes

import pytest

from .conftest import nvcc_cubin

pytestmark = pytest.mark.gpu

KERNEL = r"""
extern "C" __global__ void bump(int* counts) { counts[threadIdx.x] += 1; }
"""
# which launches ask for programmatic dependent launch, in capture order
PROGRAMMATIC = (False, True, False, True, True, False)


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


def test_a_rebuilt_graph_reads_back_with_the_captured_edges(tmp_path):
    import torch

    from foundry.graphir.build import LiveFunctions, build
    from foundry.graphir.cuda import cu, driver
    from foundry.graphir.lower import lower

    drv = driver()
    counts = torch.zeros(32, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    image = ctypes.create_string_buffer(nvcc_cubin(KERNEL, tmp_path, "bump").read_bytes())
    func = cu("cuModuleGetFunction", cu("cuModuleLoadData", ctypes.addressof(image)), b"bump")
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

    built = build(ir, functions)
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
