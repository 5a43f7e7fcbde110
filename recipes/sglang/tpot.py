"""Decode step times (TPOT) by batch size, from SGLang's decode log lines.

    python recipes/sglang/tpot.py REFERENCE.log [OTHER.log ...]

Each log is the output of a ``recipes/sglang/run.py --tpot SIZES --set
decode_log_interval=1 --set log_level=info`` run: every decode step logs
``Decode batch, #running-req: N, ... cuda graph: True, gen throughput (token/s): T``,
and the recipe announces each batch with ``tpot batch N``. A step's time is N / T
(the tokens that step made over its throughput). For each announced size, the
median over the steps whose running batch equals the size and that replayed a CUDA
graph; then each run's ratio to the first. A log holding several runs (a SAVE's
priming run and its own, each ending with ``tpot batch end``) gives one column per
run, ``NAME#1``, ``NAME#2``, ... Exit 2 when a log holds fewer than 100
such steps for a size (too few to judge), or the first announces no size (nothing
to compare it with).
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

MARK = re.compile(r"^tpot batch (\d+|end)\s*$")
DECODE = re.compile(r"Decode batch.*?#running-req:\s*(\d+),.*?graph:\s*(True|False),\s*"
                    r"gen throughput \(token/s\):\s*([0-9.]+)")  # fmt: skip
MIN_STEPS = 100


def runs(text: str) -> list[dict[int, list[float]]]:
    """Each run's seconds per decode step by announced size; a run ends at ``tpot batch end``."""
    done: list[dict[int, list[float]]] = []
    steps: dict[int, list[float]] = {}
    size = None
    for line in text.splitlines():
        mark = MARK.match(line.strip())
        if mark:
            size = None if mark[1] == "end" else int(mark[1])
            if size is not None:
                steps.setdefault(size, [])
            elif steps:
                done.append(steps)
                steps = {}
            continue
        found = DECODE.search(line)
        if size is None or found is None:
            continue
        running, graph, throughput = int(found[1]), found[2] == "True", float(found[3])
        if running == size and graph and throughput > 0:
            steps[size].append(running / throughput)
    return [*done, steps] if steps else done


def columns(paths: list[str]) -> dict[str, dict[int, list[float]]]:
    """One column per run: a log's name (its path where two logs share a name), or
    ``NAME#N`` for each of a log's several runs."""
    names = [Path(path).name for path in paths]
    found: dict[str, dict[int, list[float]]] = {}
    for path, name in zip(paths, names, strict=True):
        label = name if names.count(name) == 1 else path
        logged = runs(Path(path).read_text(errors="replace")) or [{}]
        for number, run in enumerate(logged, 1):
            found[label if len(logged) == 1 else f"{label}#{number}"] = run
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        logs = columns(argv)
    except OSError as err:
        print(f"tpot.py: cannot read a log: {err}", file=sys.stderr)
        return 2
    reference = next(iter(logs.values()))
    if not reference:
        print(f"tpot.py: {argv[0]} announces no batch size (no 'tpot batch N' line; was it run with --tpot?)",
              file=sys.stderr)  # fmt: skip
        return 2
    status = 0
    print("batch  " + "  ".join(f"{name:>24}" for name in logs) + "  (median ms per step, steps; ratio)")
    for size in sorted(reference):
        cells = []
        for run in logs.values():
            times = run.get(size, [])
            if len(times) < MIN_STEPS:
                status = 2
                cells.append(f"{'too few: ' + str(len(times)):>24}")
                continue
            median = statistics.median(times)
            base = reference.get(size) or []
            ratio = median / statistics.median(base) if len(base) >= MIN_STEPS else float("nan")
            cells.append(f"{median * 1e3:9.3f} ({len(times):4d}) {ratio:6.3f}x")
        print(f"{size:5d}  " + "  ".join(cells))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
