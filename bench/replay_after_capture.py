"""Restored graphs' replay time before and after the LOAD process captures with torch.

    python -m foundry run --mode save --save-runs 1 --archive A -- \
        python recipes/torch/run.py --bench --config qwen3-0.6b --batches 1,64,256 --out save.json
    FOUNDRY_LOAD_CAPTURES=allow python -m foundry run --mode load --warmup restore --builder native \
        --archive A -- python bench/replay_after_capture.py [--probe] --bench --config qwen3-0.6b \
        --batches 1,64,256 --out load.json

Runs recipes/torch/run.py (its arguments are passed through) and, where the
recipe would time its replays, first times the restored graphs of batch sizes 1,
64 and 256; then captures the recipe's decode step with torch, one batch size
after another (bench/cold_start.py's 36), and times the restored graphs again
after 1, 4, 12 and 36 captures (and after the last), beside torch's own graphs
of those batch sizes. With ``--probe`` it first takes the driver's steps one at a
time, timing the restored graphs after each: a stream capture of one memset begun and
ended through the driver (thread-local, then global mode, torch's default), that graph
instantiated, then launched; then torch's steps toward capturing the decode step: one
kernel captured, a fresh GiB allocated, one eager decode step, one GEMM captured, one kernel
captured with keep_graph=True and replayed, two decode steps on a side stream (a capture's
warm-up), the decode step captured, then replayed; where the slowdown begins
says whose state it is. Every time is the median of 20 replays behind a sleep kernel: the GPU's
execution alone. bench/cold_start.py compares restored graphs with the graphs of
another process, which captured; this compares them in one process, before and
after it captures. Prints a table. The recipe then times its replays and writes
its report as usual, after the captures: its times are the slower ones.
Batch sizes above the recipe's largest are not captured.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "recipes" / "torch"))

import run  # noqa: E402  (recipes/torch/run.py)
from timing import median_ms  # noqa: E402

TIMED = (1, 64, 256)
REPORT_AFTER = (1, 4, 12, 36)
decoders: list = []


class RecordedDecoder(run.Decoder):
    """The recipe's decoder, kept for capturing its step once the graphs are restored."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        decoders.append(self)


def row(label: str, graphs: dict) -> None:
    """One line: each timed batch size's median, or ``-`` where ``graphs`` has none yet."""
    cells = [f"{median_ms(graphs[bs].replay, busy=True, repeats=20):8.3f}" if bs in graphs else f"{'-':>8}"
             for bs in TIMED]  # fmt: skip
    print(f"{label:44} {' '.join(cells)}", flush=True)


def probe(graphs: dict, step) -> None:
    """The driver's steps of a capture one at a time, the restored graphs timed after each; then
    torch's steps toward capturing the decode ``step`` (bs 1), one at a time, timed the same way."""
    import torch

    from foundry.graphir.cuda import cu, driver
    from foundry.runtime.graphs.capture import warm_up_on_side_stream

    drv, side = driver(), torch.cuda.Stream()
    target = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    stream = drv.CUstream(side.cuda_stream)
    for label, mode in (("thread-local", "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL"),
                        ("global", "CU_STREAM_CAPTURE_MODE_GLOBAL")):  # fmt: skip
        torch.cuda.synchronize()
        cu("cuStreamBeginCapture", stream, getattr(drv.CUstreamCaptureMode, mode))
        cu("cuMemsetD8Async", drv.CUdeviceptr(target.data_ptr()), 1, target.numel(), stream)
        graph = cu("cuStreamEndCapture", stream)
        row(f"restored, after a driver capture ({label})", graphs)
    graph_exec = cu("cuGraphInstantiate", graph, 0)
    row("restored, after instantiating it", graphs)
    cu("cuGraphLaunch", graph_exec, stream)
    cu("cuStreamSynchronize", stream)
    row("restored, after launching it", graphs)
    kept: list = []  # every object made below lives until the probe ends, as a capture's would
    matrix = torch.ones(64, 1024, dtype=torch.bfloat16, device="cuda")
    for label, action in (
        ("one torch capture of one kernel", lambda: torch_capture(lambda: target.add_(1))),
        ("a fresh 1 GiB from torch", lambda: torch.ones(1 << 30, dtype=torch.uint8, device="cuda")),
        ("one eager decode step", step),
        ("one torch capture of one GEMM", lambda: torch_capture(lambda: matrix @ matrix.T)),
        ("one kernel captured with keep_graph=True", lambda: torch_capture(lambda: target.add_(1), keep=True)),
        ("that graph replayed", lambda: kept[-1].replay()),
        ("two decode steps on a side stream", lambda: warm_up_on_side_stream(step, 2)),
        ("the decode step captured", lambda: torch_capture(step)),
        ("that graph replayed", lambda: kept[-1].replay()),
    ):  # fmt: skip
        kept.append(action())
        torch.cuda.synchronize()
        row(f"restored, after {label}", graphs)


def torch_capture(fn, keep: bool = False):
    """``fn`` captured into a torch graph on its default pool; ``keep``: torch's keep_graph."""
    import torch

    graph = torch.cuda.CUDAGraph(keep_graph=keep)
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_then_capture(graphs: dict, *args, **kwargs) -> dict:
    import torch

    from foundry.runtime.graphs.capture import capture

    print(f"{'bs ' + ', '.join(map(str, TIMED)) + ': ms, GPU execution':44}")
    row("restored, before any capture", graphs)
    model, captured = decoders[0], {}
    ids = torch.zeros(model.cache.shape[2], dtype=torch.long, device="cuda")
    pos = torch.zeros_like(ids)
    if PROBE:
        probe(graphs, lambda: model.step(ids[:1], pos[:1]))
    sizes = [bs for bs in run.BENCH_BATCHES if bs <= len(ids)]
    for count, bs in enumerate(sizes, start=1):
        captured[bs] = capture(lambda bs=bs: model.step(ids[:bs], pos[:bs]))[0]
        captured[bs].replay()
        if count in REPORT_AFTER or count == len(sizes):
            row(f"restored, after {count} torch captures", graphs)
            row("  torch's graphs of the same sizes", captured)
    return recipe_timing(graphs, *args, **kwargs)


recipe_timing = run.time_replays
run.Decoder = RecordedDecoder
run.time_replays = time_then_capture
PROBE = "--probe" in sys.argv
if PROBE:  # ours, not the recipe's
    sys.argv.remove("--probe")

if __name__ == "__main__":
    sys.exit(run.main())
