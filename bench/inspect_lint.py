"""Time ``foundry archive inspect`` and ``foundry graph lint`` on a large synthetic archive,
against the floor: a script reading the same graph files and decoding their MessagePack.

    python bench/inspect_lint.py [--graphs 50] [--nodes 2000] [--repeat 5]

Builds the archive with ``bench/synthetic.py`` (real captured graphs tiled to
size), then runs, ``--repeat`` times in turn, the floor (``bench/read_floor.py``),
``inspect`` and ``lint``, each as a user would (a fresh interpreter each time,
start-up included). The three take turns so that a busy machine slows them alike.
Every run is cold for Foundry: nothing is kept between runs, beside the archive or
anywhere else (the operating system's page cache serves the floor and the commands
alike; Python's bytecode of Foundry's modules is compiled in an uncounted first round,
as ``pip install`` compiles it). Reported: each median, and inspect + lint as a ratio to the floor (the
ratio of the medians, and the median of each round's ratio). Results go to
``bench/out/inspect_lint.json``; ``bench/RESULTS.md`` records the figures.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import benchmark_parser, machine, report, temporary_archive

FLOOR = Path(__file__).resolve().parent / "read_floor.py"


# the children compile Foundry's modules once, as pip does at install: an installed package has its
# bytecode, and PYTHONDONTWRITEBYTECODE (set on some machines) would make every run compile them again
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(args: list[str]) -> float:
    """Seconds one fresh interpreter takes to run ``args`` (exit 0 or 1, else the run stops)."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV)
    took = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return took


def rounds(archive: Path, nodes: int, repeat: int) -> dict[str, list[float]]:
    """``repeat`` rounds of floor, inspect, lint, in turn."""
    commands = {
        "floor": [str(FLOOR), str(archive)],
        "inspect": ["-m", "foundry", "archive", "inspect", str(archive)],
        "lint": ["-m", "foundry", "graph", "lint", str(archive), "--expect", f"kernel={nodes}"],
    }
    runs: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, args in commands.items():
            runs[name].append(timed(args))
    return runs


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__.splitlines()[0]).parse_args(argv)
    with temporary_archive(args.graphs, args.nodes) as (archive, size):
        rounds(archive, args.nodes, 1)  # bytecode compiled, as an installed package has it; not counted
        runs = rounds(archive, args.nodes, args.repeat)
    median = {name: statistics.median(times) for name, times in runs.items()}
    both = median["inspect"] + median["lint"]
    per_round = [(a + b) / f for f, a, b in zip(runs["floor"], runs["inspect"], runs["lint"], strict=True)]
    result = {
        "graphs": args.graphs,
        "nodes_per_graph": args.nodes,
        "archive_bytes": size,
        "floor_median_s": round(median["floor"], 3),
        "inspect_median_s": round(median["inspect"], 3),
        "lint_median_s": round(median["lint"], 3),
        "inspect_plus_lint_s": round(both, 3),
        "ratio_to_floor": round(both / median["floor"], 2),
        "ratio_to_floor_median_of_rounds": round(statistics.median(per_round), 2),
        "runs_s": {name: [round(t, 3) for t in times] for name, times in runs.items()},
        "machine": machine(),
    }
    report("inspect_lint", result, args, size)
    print(f"  floor (read + decode)    {median['floor']:.2f} s")
    print(f"  foundry archive inspect  {median['inspect']:.2f} s")
    print(f"  foundry graph lint       {median['lint']:.2f} s")
    print(f"  inspect + lint           {both:.2f} s = {result['ratio_to_floor']:.2f}x the floor "
          f"(median of the rounds' ratios: {result['ratio_to_floor_median_of_rounds']:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
