"""Time ``foundry-tui`` from start to first paint on a large synthetic archive.

    python bench/tui_first_paint.py [--graphs 50] [--nodes 2000] [--repeat 5]

Builds the archive with ``bench/synthetic.py`` into a temporary directory, then
measures two ways, median of ``--repeat`` runs each:

* in process (``App.run_test``, headless, 120x40): from making the app (which
  opens the archive) to the first refresh after the browse screen mounted
  (``first paint``: graph list, archive pane, empty node table), and to the
  first graph's 2,000 nodes shown (decoded in a worker);
* in a real terminal (pexpect + pyte, 120x40, a fresh interpreter each run, so
  start-up and imports count): from spawning ``python -m foundry.tui.app`` to
  the graph list on screen, and to the first graph's node count on screen.

In the same run, taking turns with the terminal runs, the floor: ``bench/read_floor.py``
reading the archive's graph files and decoding their MessagePack (a fresh interpreter);
the terminal figures are also given as ratios to it. Nothing is kept between runs (an
uncounted first run compiles Foundry's bytecode, as ``pip install`` does).

Results go to ``bench/out/tui_first_paint.json``. Target: first paint under 1 s.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundry.tui.app import FoundryApp, open_archives
from synthetic import benchmark_parser, machine, report, temporary_archive

SIZE = (120, 40)
TIMEOUT = 30.0
FLOOR = Path(__file__).resolve().parent / "read_floor.py"
# an installed package has its bytecode: PYTHONDONTWRITEBYTECODE (set on some machines) would
# make every run compile Foundry's modules again
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def floor(archive: Path) -> float:
    """Seconds a fresh interpreter takes to read the archive's graph files and decode them."""
    started = time.perf_counter()
    subprocess.run([sys.executable, str(FLOOR), str(archive)], check=True, capture_output=True, env=ENV)
    return time.perf_counter() - started


async def _in_process(archive: Path) -> tuple[float, float]:
    started = time.perf_counter()
    app = FoundryApp(*open_archives([str(archive)]))
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + TIMEOUT
        while "first_graph" not in app.timings and time.monotonic() < deadline:
            await pilot.pause(0.005)
        if "first_graph" not in app.timings:
            raise SystemExit("the first graph was never shown")
        painted = app.timings["first_paint"] - started
        nodes = app.timings["first_graph"] - started
        await pilot.press("q")
    return painted, nodes


def in_process(archive: Path) -> tuple[float, float]:
    """Seconds from making the app to first paint, and to the first graph's nodes."""
    return asyncio.run(_in_process(archive))


def in_terminal(archive: Path, first_graph: str, nodes: int) -> tuple[float, float]:
    """Seconds from spawning the TUI in a pty to the graph list, and to the node count, on screen."""
    import pexpect
    import pyte

    screen = pyte.Screen(*SIZE)
    stream = pyte.ByteStream(screen)
    env = dict(ENV, TERM="xterm-256color")
    started = time.perf_counter()
    child = pexpect.spawn(
        sys.executable, ["-m", "foundry.tui.app", str(archive)], dimensions=(SIZE[1], SIZE[0]), env=env
    )
    painted = shown = None
    deadline = time.monotonic() + TIMEOUT
    try:
        while shown is None and time.monotonic() < deadline:
            try:
                stream.feed(child.read_nonblocking(65536, timeout=0.01))
            except pexpect.TIMEOUT:
                continue
            text = "\n".join(screen.display)
            if painted is None and f"{first_graph} {nodes}" in text:
                painted = time.perf_counter() - started
            if f"{nodes} nodes · " in text:
                shown = time.perf_counter() - started
        child.send("q")
        child.expect(pexpect.EOF, timeout=TIMEOUT)
    finally:
        child.close(force=True)
    if painted is None or shown is None:
        raise SystemExit("the TUI never showed the graph list and nodes in the terminal")
    return painted, shown


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__.splitlines()[0]).parse_args(argv)
    with temporary_archive(args.graphs, args.nodes) as (archive, size):
        inproc = [in_process(archive) for _ in range(args.repeat)]
        floors: list[float] = []
        try:
            in_terminal(archive, "decode.g000", args.nodes)  # bytecode compiled; not counted
            pty = []
            for _ in range(args.repeat):  # in turn with the floor, so a busy machine slows both alike
                floors.append(floor(archive))
                pty.append(in_terminal(archive, "decode.g000", args.nodes))
        except ImportError as err:  # pexpect/pyte are test extras
            print(f"skipping the terminal measurement: {err}")
            pty = []

    def median(runs: list[tuple[float, float]], i: int) -> float | None:
        return round(statistics.median(r[i] for r in runs), 3) if runs else None

    result = {
        "graphs": args.graphs,
        "nodes_per_graph": args.nodes,
        "archive_bytes": size,
        "terminal": f"{SIZE[0]}x{SIZE[1]}",
        "in_process_first_paint_s": median(inproc, 0),
        "in_process_first_graph_s": median(inproc, 1),
        "terminal_first_paint_s": median(pty, 0),
        "terminal_first_graph_s": median(pty, 1),
        "floor_median_s": round(statistics.median(floors), 3) if floors else None,
        "first_paint_ratio_to_floor": round(median(pty, 0) / statistics.median(floors), 2) if floors else None,
        "first_graph_ratio_to_floor": round(median(pty, 1) / statistics.median(floors), 2) if floors else None,
        "runs_s": {
            "in_process": [[round(a, 3), round(b, 3)] for a, b in inproc],
            "terminal": [[round(a, 3), round(b, 3)] for a, b in pty],
            "floor": [round(f, 3) for f in floors],
        },
        "machine": machine(),
    }
    report("tui_first_paint", result, args, size)
    print(f"  in process:  first paint {result['in_process_first_paint_s']:.3f} s, "
          f"first graph's nodes {result['in_process_first_graph_s']:.3f} s")  # fmt: skip
    if pty:
        print(f"  terminal:    first paint {result['terminal_first_paint_s']:.3f} s, "
              f"first graph's nodes {result['terminal_first_graph_s']:.3f} s "
              "(fresh interpreter: start-up and imports included)")  # fmt: skip
        print(f"  floor:       {result['floor_median_s']:.3f} s (read + decode the graph files); first paint "
              f"{result['first_paint_ratio_to_floor']:.2f}x, first graph's nodes "
              f"{result['first_graph_ratio_to_floor']:.2f}x the floor")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
