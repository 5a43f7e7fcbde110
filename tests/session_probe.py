"""Child program of the SAVE/LOAD session GPU tests (run under `foundry run`, not collected).

    session_probe.py CUBIN [--scale N] [--skip-module] [--extra-alloc] [--take-base] [--capture-again]
                           [--allocate-after] [--cache-config] [--two-graphs]

A CUDA module built by the test holds ``__device__ int scale``; the program sets it
before capture, then captures ``y = x * scale`` through a SAVE/LOAD session. Variants
for LOAD: ``--skip-module`` does not load the module (the archived image is loaded
and its global restored), ``--scale`` sets another value (the live copy then differs
from SAVE's), ``--extra-alloc`` allocates 64 MiB more before the warm-up (the trace
diverges), ``--take-base`` reserves the region's base address before the session
starts, ``--capture-again`` captures the step with torch after the session (what an
engine whose Foundry plugin did not load would do) and reports what happened,
``--allocate-after`` allocates 64 MiB after ``finish()`` (a server's first request)
and reports how the hook saw it. ``--two-graphs`` first captures ``copied`` (the step's output
copied into memory the capture allocates, kept by the graph's outputs), so that ``scaled``
is captured into a pool an earlier graph holds, as engines capture their graph sets.
Prints one JSON line: the session report, the output and the hook counters;
a Foundry error is printed as ``{"error": ...}`` with exit code 3.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

N = 1024


def _exec_flags(graph) -> int:
    """The instantiation flags of the graph the program replays: torch's (SAVE), Foundry's (LOAD)."""
    from foundry.graphir.cuda import cu, driver

    inner = getattr(graph, "graph", None)  # a CapturedGraph holds torch's graph
    handle = graph.built.exec if inner is None else driver().CUgraphExec(inner.raw_cuda_graph_exec())
    return int(cu("cuGraphExecGetFlags", handle))


def _kernel_cache_config(graph) -> int | None:
    """The cache preference the hook saw set on the function the graph's kernel node runs
    (None without the hook: a plain run)."""
    from foundry.errors import FoundryError
    from foundry.graphir.cuda import cu, driver
    from foundry.runtime.native.hook import Hook

    try:
        hook = Hook.attach()
    except FoundryError:
        return None
    inner = getattr(graph, "graph", None)
    handle = graph.built.graph if inner is None else driver().CUgraph(inner.raw_cuda_graph())
    count = cu("cuGraphGetNodes", handle, 0)[1]
    kernels = [n for n in cu("cuGraphGetNodes", handle, count)[0][:count]
               if cu("cuGraphNodeGetType", n) == driver().CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL]  # fmt: skip
    return hook.cache_config(int(cu("cuGraphKernelNodeGetParams", kernels[0]).func))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--scale", type=int, default=3)
    parser.add_argument("--skip-module", action="store_true")
    parser.add_argument("--extra-alloc", action="store_true")
    parser.add_argument("--take-base", action="store_true")
    parser.add_argument("--capture-again", action="store_true")
    parser.add_argument("--allocate-after", action="store_true")
    parser.add_argument("--cache-config", action="store_true")  # prefer shared memory for the kernel, as Triton does
    parser.add_argument("--two-graphs", action="store_true")
    args = parser.parse_args()

    import torch

    from foundry.errors import FoundryError
    from foundry.graphir.cuda import cu, driver
    from foundry.runtime.sessions.open import open_session

    drv = driver()
    try:
        session = open_session()
        if args.take_base:
            cu("cuInit", 0)
            cu("cuCtxSetCurrent", cu("cuDevicePrimaryCtxRetain", cu("cuDeviceGet", 0)))
            cu("cuMemAddressReserve", 1 << 30, 0, 0x600000000000, 0)
        session.start()
        x = torch.arange(N, dtype=torch.float32, device="cuda")
        y = torch.zeros_like(x)
        if args.extra_alloc:
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        func = None
        if not args.skip_module:
            image = ctypes.create_string_buffer(args.cubin.read_bytes())
            module = cu("cuModuleLoadData", ctypes.addressof(image))
            dptr, size = cu("cuModuleGetGlobal", module, b"scale")
            value = ctypes.c_int(args.scale)
            cu("cuMemcpyHtoD", dptr, ctypes.addressof(value), size)
            func = cu("cuModuleGetFunction", module, b"scaled")
            if args.cache_config:
                cu("cuFuncSetCacheConfig", func, drv.CUfunc_cache.CU_FUNC_CACHE_PREFER_SHARED)

        def step():
            stream = drv.CUstream(torch.cuda.current_stream().cuda_stream)
            params = ((x.data_ptr(), y.data_ptr(), N), (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int))
            cu("cuLaunchKernel", func, N // 256, 1, 1, 256, 1, 1, 0, stream, params, 0)
            return y

        session.warmup(step if func is not None else lambda: None)
        first = session.graph("copied", lambda: step().clone()) if args.two_graphs else None
        graph = session.graph("scaled", step)
        report = session.finish()
        result = {}
        if first is not None:
            y.zero_()
            first.replay()
            torch.cuda.synchronize()
            result["copied_seen"] = (first.outputs[5] / x[5]).item()
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        out = graph.outputs
        seen = (out[5] / x[5]).item()
        result |= {"report": report, "scale_seen": seen, "same_storage": out.data_ptr() == y.data_ptr(),
                  "exec_flags": _exec_flags(graph), "cache_config": _kernel_cache_config(graph),
                  "rebuilt": hasattr(graph, "built")}  # fmt: skip
        if args.capture_again:
            try:
                with torch.cuda.graph(torch.cuda.CUDAGraph()):
                    step()
                result["captured_again"] = "captured"
            except RuntimeError as err:
                result["captured_again"] = str(err).splitlines()[0]
            if getattr(session, "hook", None) is not None:  # a SAVE's priming run is a plain one: no hook
                result["counters_after"] = session.hook.counters()
        if args.allocate_after:
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # more than any cached segment
            torch.cuda.synchronize()
            if getattr(session, "hook", None) is not None:
                result["phase_after"] = session.hook.trace()[-1].phase
                result["late_events"] = [e for e in session.hook.events() if "after capturing began" in e]
        print(json.dumps(result))
        return 0
    except FoundryError as err:
        print(json.dumps({"error": err.to_dict()}, default=str))
        return 3


if __name__ == "__main__":
    sys.exit(main())
