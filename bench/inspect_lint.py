"""Time ``foundry archive inspect`` and ``foundry graph lint`` on a large synthetic archive.

    python bench/inspect_lint.py [--graphs 50] [--nodes 2000] [--repeat 5]

Builds the archive with ``bench/synthetic.py`` (real captured graphs tiled to
size), then runs each command as a user would (a fresh interpreter each time,
start-up included) and reports the median wall time. Results go to
``bench/out/inspect_lint.json``; ``bench/RESULTS.md`` records the figures.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import benchmark_parser, machine, report, temporary_archive


def timed(args: list[str], repeat: int) -> tuple[float, list[float], int]:
    times, code = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "foundry", *args], capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        code = proc.returncode
        if code not in (0, 1):
            raise SystemExit(f"foundry {' '.join(args)} failed ({code}): {proc.stderr.strip()}")
    return statistics.median(times), times, code


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__.splitlines()[0]).parse_args(argv)
    with temporary_archive(args.graphs, args.nodes) as (archive, size):
        inspect = timed(["archive", "inspect", str(archive)], args.repeat)
        lint = timed(["graph", "lint", str(archive), "--expect", f"kernel={args.nodes}"], args.repeat)
    result = {
        "graphs": args.graphs,
        "nodes_per_graph": args.nodes,
        "archive_bytes": size,
        "inspect_median_s": round(inspect[0], 3),
        "lint_median_s": round(lint[0], 3),
        "inspect_plus_lint_s": round(inspect[0] + lint[0], 3),
        "runs_s": {"inspect": [round(t, 3) for t in inspect[1]], "lint": [round(t, 3) for t in lint[1]]},
        "machine": machine(),
    }
    report("inspect_lint", result, args, size)
    print(f"  foundry archive inspect  {inspect[0]:.2f} s")
    print(f"  foundry graph lint       {lint[0]:.2f} s")
    print(f"  inspect + lint           {inspect[0] + lint[0]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
