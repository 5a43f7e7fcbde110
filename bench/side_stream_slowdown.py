"""Why graphs replay slower after eager work on a second stream (run on a GPU machine).

    python bench/side_stream_slowdown.py [--variants a,b,...] [--out results.jsonl]

A process that captured with torch's usual recipe (warm-ups on a side stream, then
the capture) replays every graph of the process a constant ~0.7 ms slower than
before the warm-ups (bench/replay_after_capture.py --probe); the same eager work on
the current stream slows nothing. Each variant here runs in a process of its own
(the state is the process's): it builds the torch recipe's decoder (qwen3-0.6b),
captures its decode step at batch size 1 without any side-stream work, and a
graph of 1,000 one-element kernels; it times both, does the variant's action,
and times them again. Each time is measured four ways, so that the cost can be
placed: the GPU's execution behind a 2 ms sleep kernel (how the probe timed it),
behind a 20 ms one (a launch slower than 2 ms shows here no more), the host's own
seconds in ``replay()`` while the GPU sleeps, and one replay on an idle stream
(launch and execution). Medians of 30. Prints one table; ``--out`` appends one JSON
line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "recipes" / "torch"))

from timing import SLEEP_CYCLES, median_ms  # noqa: E402  (recipes/torch/timing.py: a 2 ms sleep)

REPEATS = 30
SLEEP_20MS = 10 * SLEEP_CYCLES

# variant: (what it does, extra environment)
VARIANTS = {
    "none": ("nothing (the control)", {}),
    "current-eager": ("two eager decode steps on the current stream", {}),
    "side-create": ("a new torch stream, nothing run on it", {}),
    "side-tiny": ("one one-element kernel on a new torch stream", {}),
    "side-eager": ("two eager decode steps on a new torch stream (a capture's warm-up)", {}),
    "side-eager-1conn": ("side-eager with CUDA_DEVICE_MAX_CONNECTIONS=1", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    "side-eager-empty": ("side-eager, then synchronize and empty torch's cache", {}),
    "side-eager-on-side": ("side-eager, then the graphs replayed on that side stream", {}),
    "side-gemm": ("eager GEMMs only (cuBLAS) on a new torch stream", {}),
    "current-gemm": ("the same GEMMs on the current stream", {}),
    "side-gemm-ws0": ("side-gemm with CUBLAS_WORKSPACE_CONFIG=:0:0", {"CUBLAS_WORKSPACE_CONFIG": ":0:0"}),
}
LIMITS = ("cudaLimitStackSize", "cudaLimitPersistingL2CacheSize", "cudaLimitMallocHeapSize")


def limits() -> dict[str, int]:
    """The context's limits a library may raise behind torch's back."""
    from cuda.bindings import runtime

    return {name: int(runtime.cudaDeviceGetLimit(getattr(runtime.cudaLimit, name))[1]) for name in LIMITS}


def timings(replay, stream) -> dict[str, float]:
    """The four medians of one graph's replay on ``stream``, in milliseconds."""
    import torch

    def host() -> float:
        times = []
        for _ in range(REPEATS):
            torch.cuda._sleep(SLEEP_20MS)
            begun = time.perf_counter()
            replay()
            times.append((time.perf_counter() - begun) * 1e3)
            torch.cuda.synchronize()
        return statistics.median(times)

    with torch.cuda.stream(stream):
        return {"gpu_2ms": median_ms(replay, busy=True, repeats=REPEATS),
                "gpu_20ms": median_ms(replay, busy=True, repeats=REPEATS, sleep_cycles=SLEEP_20MS),
                "host": host(), "idle": median_ms(replay, busy=False, repeats=REPEATS)}  # fmt: skip


def child(variant: str) -> dict:
    import torch
    from decoder import CONFIGS, Decoder

    model = Decoder(CONFIGS["qwen3-0.6b"], 256)
    ids = torch.zeros(1, dtype=torch.long, device="cuda")
    pos = torch.zeros_like(ids)

    def step():
        return model.step(ids, pos)

    step()
    torch.cuda.synchronize()
    decode = torch.cuda.CUDAGraph()
    with torch.cuda.graph(decode):
        step()
    cell = torch.zeros(1, device="cuda")
    tiny = torch.cuda.CUDAGraph()
    with torch.cuda.graph(tiny):
        for _ in range(1000):
            cell.add_(1)
    torch.cuda.synchronize()
    graphs = {"decode": decode.replay, "tiny": tiny.replay}
    current = torch.cuda.current_stream()
    before = {name: timings(replay, current) for name, replay in graphs.items()}
    limits_before = limits()
    side = act(variant, step)
    torch.cuda.synchronize()
    on = side if variant == "side-eager-on-side" else current
    after = {name: timings(replay, on) for name, replay in graphs.items()}
    return {"variant": variant, "env": VARIANTS[variant][1], "before": before, "after": after,
            "limits_before": limits_before, "limits_after": limits()}  # fmt: skip


def act(variant: str, step):
    """The variant's action; returns the side stream it used (or None)."""
    import torch

    if variant == "current-eager":
        step(), step()
    elif variant == "side-create":
        return torch.cuda.Stream()
    elif variant == "side-tiny":
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.ones(1, device="cuda").add_(1)
        return stream
    elif variant.startswith(("side-gemm", "current-gemm")):
        matrix = torch.ones(1024, 1024, dtype=torch.bfloat16, device="cuda")
        stream = torch.cuda.Stream() if variant.startswith("side") else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            for _ in range(8):
                matrix @ matrix
        return stream
    elif variant.startswith("side-eager"):
        from foundry.runtime.graphs.capture import warm_up_on_side_stream

        stream = warm_up_on_side_stream(step, 2)
        if variant == "side-eager-empty":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return stream
    return None


def table(rows: list[dict]) -> None:
    print(f"{'variant':20} {'graph':7} " + " ".join(f"{k:>17}" for k in ("gpu_2ms", "gpu_20ms", "host", "idle")))
    for row in rows:
        for name in ("decode", "tiny"):
            cells = [f"{row['before'][name][k]:7.3f}->{row['after'][name][k]:7.3f}"
                     for k in ("gpu_2ms", "gpu_20ms", "host", "idle")]  # fmt: skip
            print(f"{row['variant']:20} {name:7} " + " ".join(f"{c:>17}" for c in cells))
        after = row["limits_after"]
        changed = {k: (v, after[k]) for k, v in row["limits_before"].items() if v != after[k]}
        print(f"{'':20} limits changed: {changed or 'none'}")
    print("(ms, before -> after the action; medians of 30)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:  # before any variant runs
        parser.error(f"unknown variant {unknown[0]!r}; known: {', '.join(VARIANTS)}")
    rows = []
    for variant in variants:
        env = {**os.environ, **VARIANTS[variant][1]}
        done = subprocess.run([sys.executable, __file__, "--child", variant], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{variant}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if args.out:
            with args.out.open("a") as out:
                out.write(json.dumps(rows[-1]) + "\n")
    table(rows)
    return 0 if len(rows) == len(variants) else 1


if __name__ == "__main__":
    sys.exit(main())
