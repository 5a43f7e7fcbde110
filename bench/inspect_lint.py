"""Time ``foundry archive inspect`` and ``foundry graph lint`` on a large synthetic archive,
against the floor: a script reading the same graph files and decoding their MessagePack.

    python bench/inspect_lint.py [--graphs 50] [--nodes 2000] [--repeat 5]

Builds the archive with ``bench/synthetic.py`` (real captured graphs tiled to
size), then runs, ``--repeat`` times in turn, the floor (``bench/read_floor.py``),
``inspect`` and ``lint``, each as a user would (a fresh interpreter each time,
start-up included). The three take turns so that a busy machine slows them alike.
Every run is cold for Foundry: nothing is kept between runs, beside the archive or
anywhere else (the operating system's page cache serves the floor and the commands
alike; Python's bytecode of Foundry's modules is compiled in an uncounted first
round, as ``pip install`` compiles it). Reported: each median; inspect + lint as a
ratio to the floor (the ratio of the medians, and the median of each round's
ratio); the CPU seconds each spent, its workers included (a large archive's graphs
are read on every core, so how busy the machine is shows in the wall time) and the
load average. Results go to ``bench/out/inspect_lint.json``; ``bench/RESULTS.md``
records the figures.
"""

from __future__ import annotations

import os
import resource
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


def timed(args: list[str]) -> tuple[float, float]:
    """Wall seconds one fresh interpreter takes to run ``args`` (exit 0 or 1, else the run stops),
    and the CPU seconds it and its workers spent."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV)
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return took, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def rounds(archive: Path, nodes: int, repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``repeat`` rounds of floor, inspect, lint, in turn: wall and CPU seconds of each run."""
    commands = {
        "floor": [str(FLOOR), str(archive)],
        "inspect": ["-m", "foundry", "archive", "inspect", str(archive)],
        "lint": ["-m", "foundry", "graph", "lint", str(archive), "--expect", f"kernel={nodes}"],
    }
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, args in commands.items():
            took, spent = timed(args)
            wall[name].append(took)
            cpu[name].append(spent)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__.splitlines()[0]).parse_args(argv)
    with temporary_archive(args.graphs, args.nodes) as (archive, size):
        rounds(archive, args.nodes, 1)  # bytecode compiled, as an installed package has it; not counted
        runs, cpu = rounds(archive, args.nodes, args.repeat)
    median = {name: statistics.median(times) for name, times in runs.items()}
    cpu_median = {name: statistics.median(times) for name, times in cpu.items()}
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
        "cpu_median_s": {name: round(t, 3) for name, t in cpu_median.items()},
        "cpu_ratio_to_floor": round((cpu_median["inspect"] + cpu_median["lint"]) / cpu_median["floor"], 2),
        "runs_s": {name: [round(t, 3) for t in times] for name, times in runs.items()},
        "load_average": os.getloadavg(),
        "machine": machine(),
    }
    report("inspect_lint", result, args, size)
    print(f"  floor (read + decode)    {median['floor']:.2f} s")
    print(f"  foundry archive inspect  {median['inspect']:.2f} s")
    print(f"  foundry graph lint       {median['lint']:.2f} s")
    print(f"  inspect + lint           {both:.2f} s = {result['ratio_to_floor']:.2f}x the floor "
          f"(median of the rounds' ratios: {result['ratio_to_floor_median_of_rounds']:.2f}x)")  # fmt: skip
    print(f"  CPU seconds (workers included): floor {cpu_median['floor']:.2f}, inspect {cpu_median['inspect']:.2f}, "
          f"lint {cpu_median['lint']:.2f}; load average before {result['load_average'][0]:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
