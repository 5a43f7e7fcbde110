"""Child program of the hook's GPU tests (run under LD_PRELOAD, not collected by pytest).

Allocates tensors of several sizes, computes, captures and replays a small
graph, then prints as JSON what it got and what the hook saw.
"""

from __future__ import annotations

import dataclasses
import json
import sys


def main() -> int:
    import torch

    from foundry.runtime.native.hook import Hook

    report: dict = {}
    try:
        torch.manual_seed(0)
        x = torch.randn(1024, 1024, device="cuda")
        w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        value = float((x @ x).sum())
        static = torch.randn(256, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = static * 2 + 1
        graph.replay()
        torch.cuda.synchronize()
        report.update(
            ptrs=[t.data_ptr() for t in (x, w, big, static, out)],
            value=value,
            out_ok=bool(torch.equal(out, static * 2 + 1)),
        )
    except Exception as err:  # noqa: BLE001 - the parent asserts on this report, including failures
        report["error"] = f"{type(err).__name__}: {err}"
    hook = Hook.attach()
    report.update(
        active=hook.active(),
        region=dataclasses.asdict(hook.region()),
        trace=[dataclasses.asdict(a) for a in hook.trace()],
        counters=hook.counters(),
        events=hook.events(),
    )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
