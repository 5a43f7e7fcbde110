"""How one captured graph's replay time moves as its process captures more graphs.

    python bench/replay_drift.py [--config qwen3-0.6b] [--out FILE]

bench/cold_start.py found restored graphs replaying ~0.7 ms faster than the
graphs of a process that warmed up and captured 36 batch sizes (a process with
max batch 1, capturing its one batch size, replayed as fast as LOAD). Plain
torch, no hook, max batch 256:
this bench captures the recipe's bs-1 decode graph first and times it again
after each step a capture process takes:

1. the bs-1 graph captured alone;
2. the other batch sizes run eagerly (their warm-up);
3. those captured, kept as graphs (``keep_graph=True``), not instantiated;
4. instantiated;
5. each launched once (the first launch uploads a graph);
6. those graphs freed again.

Each time is the median of 3 rounds of 20 replays, on an idle stream (the host's
launch counted) and behind a sleep kernel (the GPU's execution alone). Writes
JSON; prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "recipes" / "torch"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-0.6b")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "replay_drift.json")
    args = parser.parse_args(argv)

    import torch
    from decoder import CONFIGS, Decoder
    from run import BENCH_BATCHES as BATCHES  # the 36 batch sizes bench/cold_start.py captures
    from timing import median_ms

    from foundry.runtime.graphs.capture import capture

    model = Decoder(CONFIGS[args.config], max(BATCHES))
    ids = torch.zeros(max(BATCHES), dtype=torch.long, device="cuda")
    pos = torch.zeros(max(BATCHES), dtype=torch.long, device="cuda")

    def step(bs: int):
        return lambda: model.step(ids[:bs], pos[:bs])

    first, _ = capture(step(1))
    first.replay()
    rows = []

    def timed(label: str) -> None:
        torch.cuda.synchronize()
        row = {"after": label}
        for busy in (False, True):
            rounds = [median_ms(first.replay, busy=busy, repeats=args.repeats) for _ in range(3)]
            row["busy_ms" if busy else "idle_ms"] = statistics.median(rounds)
        rows.append(row)
        print(f"{row['idle_ms']:8.3f} {row['busy_ms']:8.3f}  {label}", flush=True)

    print(f"{'idle ms':>8} {'busy ms':>8}  bs-1 graph, after")
    timed("bs 1 captured alone")
    others = BATCHES[1:]
    for bs in others:
        for _ in range(2):
            model.step(ids[:bs], pos[:bs])
    timed(f"{len(others)} more batch sizes run eagerly")
    graphs = [capture(step(bs), warmup=0)[0] for bs in others]
    timed(f"{len(others)} captured, not instantiated")
    for graph in graphs:
        graph.instantiate()
    timed("instantiated")
    for graph in graphs:
        graph.replay()
    timed("each launched once")
    del graphs
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    timed("freed")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": args.config, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
