"""Cold start on a GPU: warm-up + capture of every decode graph vs LOAD of the same graphs.

    python bench/cold_start.py [--config qwen3-0.6b] [--batches 1,2,...] [--out DIR]

Runs recipes/torch/run.py --bench in fresh processes: a plain capture
(baseline), a SAVE, a LOAD that repeats the warm-up, a LOAD that restores the
warm-up's bytes instead, and that LOAD again with the hook's native graph
builder from SAVE's launch plans, on one thread and on four, and with the
instantiation left to a background thread (``graphs s`` is then the time until
the program has its graphs, ``inst. s`` until the last one is instantiated). Weights are
allocated and filled before the timed part in every run, so they are excluded
from both sides. Each run reports its
warm-up time, the time to get its graphs (capture or restore), per-graph
rebuild cost, and the median replay time of every graph in the same process,
on an idle stream (``replay x``: the host's launch counted) and behind a sleep
kernel (``busy x``: the GPU's execution alone), each relative to the capture.
Writes bench/out/cold_start.json and prints a table. Pin the JIT caches
(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) and run once before measuring: the
cache state is reported with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = (("capture", None, ()), ("save", "save", ("--save-runs", "1")), ("load-replay", "load", ("--warmup", "replay")),
        ("load-restore", "load", ("--warmup", "restore")),
        ("load-restore-native", "load", ("--warmup", "restore", "--builder", "native")),
        ("load-restore-native-4t", "load",
         ("--warmup", "restore", "--builder", "native", "--build-threads", "4")),
        ("load-restore-native-bg", "load",
         ("--warmup", "restore", "--builder", "native", "--instantiate", "background")))  # fmt: skip


def run(
    name: str, mode: str | None, extra: tuple[str, ...], archive: Path, out: Path, args: argparse.Namespace
) -> dict:
    cmd = [sys.executable, str(ROOT / "recipes" / "torch" / "run.py"), "--bench", "--config", args.config,
           "--out", str(out / f"{name}.json")]  # fmt: skip
    if args.batches:
        cmd += ["--batches", args.batches]
    if mode:
        cmd = [sys.executable, "-m", "foundry", "run", "--mode", mode, "--archive", str(archive), *extra, "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    return json.loads((out / f"{name}.json").read_text())


def summarize(results: dict) -> dict:
    capture = results["capture"]
    base_replay = capture["replay"]
    rows = {}
    for name, r in results.items():
        if "failed" in r:
            rows[name] = {"failed": r["failed"]}
            continue
        t, s = r["timing"], r["session"]
        graphs = len(r["replay"])
        row = {"warmup_s": t["warmup_s"], "graphs_s": t["graphs_s"], "total_s": t["warmup_s"] + t["graphs_s"],
               "per_graph_ms": 1000 * t["graphs_s"] / graphs, "graphs": graphs}  # fmt: skip
        ratios = [r["replay"][k] / base_replay[k] for k in base_replay if k in r["replay"]]
        row["replay_ratio_median"] = statistics.median(ratios)
        row["replay_ratio_max"] = max(ratios)
        busy, base_busy = r.get("replay_busy", {}), capture.get("replay_busy", {})
        busy_ratios = [busy[k] / base_busy[k] for k in base_busy if k in busy]
        if busy_ratios:  # the GPU's execution alone, the host's launch not counted
            row["busy_ratio_median"] = statistics.median(busy_ratios)
        keys = ("builder", "build_threads", "templates", "decode_s", "map_s", "map_to_s", "warmup_bytes",
                "warmup_read_s", "warmup_wait_s", "warmup_copy_s", "build_s", "functions_s", "prefetch_s",
                "prefetch_wait_s", "native_timing", "bound_live", "loaded_images", "instantiate",
                "instantiated_s")  # fmt: skip
        for key in keys:
            if key in s:
                row[key] = s[key]
        counters = s.get("counters", {})
        for counter, key in (("native_nodes_us", "nodes_s"), ("native_instantiate_us", "instantiate_s")):
            if counters.get(counter):
                row[key] = counters[counter] / 1e6
        rows[name] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-0.6b")
    parser.add_argument("--batches", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--runs", default=",".join(name for name, _, _ in RUNS),
                        help="comma-separated runs to make (capture and save are always made)")  # fmt: skip
    args = parser.parse_args(argv)
    wanted = {"capture", "save", *args.runs.split(",")}
    unknown = wanted - {name for name, _, _ in RUNS}
    if unknown:
        parser.error(f"unknown runs: {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "archive"
        for name, mode, extra in RUNS:
            if name in wanted:
                results[name] = run(name, mode, extra, archive, args.out, args)
    if "failed" in results["capture"]:
        print(f"the capture run failed: {results['capture']['failed']}", file=sys.stderr)
        return 1
    rows = summarize(results)
    record = {
        "config": args.config,
        "rows": rows,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "jit_cache": {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")},
    }
    (args.out / "cold_start.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'run':22} {'warm-up s':>9} {'graphs s':>9} {'total s':>8} {'ms/graph':>9} {'replay x':>9} "
          f"{'busy x':>7} {'inst. s':>8}")  # fmt: skip
    nan = float("nan")
    for name, row in rows.items():
        if "failed" in row:
            print(f"{name:22} failed: {row['failed']}")
            continue
        print(f"{name:22} {row['warmup_s']:9.3f} {row['graphs_s']:9.3f} {row['total_s']:8.3f} "
              f"{row['per_graph_ms']:9.2f} {row['replay_ratio_median']:9.4f} {row.get('busy_ratio_median', nan):7.4f} "
              f"{row.get('instantiated_s', nan):8.3f}")  # fmt: skip
    print_breakdown(rows)
    return 0


BREAKDOWN = (
    "map_s",
    "map_to_s",
    "warmup_read_s",
    "warmup_wait_s",
    "warmup_copy_s",
    "prefetch_s",
    "prefetch_wait_s",
    "functions_s",
    "nodes_s",
    "instantiate_s",
    "build_s",
)
HEADINGS = {
    "map_s": "map (total)",
    "map_to_s": "map_to",
    "warmup_read_s": "warm read",
    "warmup_wait_s": "warm wait",
    "warmup_copy_s": "warm copy",
    "prefetch_wait_s": "prefetch wait",
    "nodes_s": "nodes (sum)",
    "instantiate_s": "inst. (sum)",
    "build_s": "build (total)",
}


def print_breakdown(rows: dict) -> None:
    """Where a native LOAD's time goes: region mapping (and warm-up bytes), reading
    archived images ahead, binding kernels, adding nodes, the driver's instantiation."""
    native = {name: row for name, row in rows.items() if "instantiate_s" in row}
    if not native:
        return
    # nodes and instantiate are the hook's counters, summed over build threads; the rest
    # is wall time. map holds reading the plans and map_to (the warm-up bytes' read and
    # copy run on a thread beside it, and prefetch on another); build holds prefetch wait
    # (what was left of prefetch once map was done), functions, nodes and instantiate
    print(f"\n{'LOAD breakdown (s)':22}" + "".join(f"{HEADINGS.get(key, key[:-2]):>14}" for key in BREAKDOWN))
    for name, row in native.items():
        print(f"{name:22}" + "".join(f"{row.get(key, float('nan')):14.3f}" for key in BREAKDOWN))


if __name__ == "__main__":
    sys.exit(main())
