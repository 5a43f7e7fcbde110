"""Peak memory of every offline command on the largest archives the limits allow.

    python bench/hostile_memory.py [--scale full|test] [--keep DIR [--reuse]] [--only LABEL]...

Builds, each in its own directory:

- ``limits``: two graphs at the per-graph limits of ``foundry.graphir.limits`` at
  once, filled to the graph file limit (32 MiB): 32,768 kernel nodes, each with 4
  parameters holding a pointer word each, 4 undefined runs and 4 launch attributes
  (the graph totals: 131,072 parameters, operands, runs and attributes), a
  distinct kernel name long enough to fill the file, 65,536 edges, 16,384 regions
  and 256 metadata entries. Every check passes, so every command does all its
  work on it, not an early refusal. ``changed`` is the same with every node's
  grid and scalar bytes changed: the diffs compare the two as well.
- ``session``: one rank whose session holds 16,384 graphs (the limit) and an
  allocation trace of 262,144 entries (the limit), device globals filling the
  rest of the session limit (64 MiB).
- ``archive``: 65,536 one-node graphs (the archive's graph limit) over 4 ranks, each
  with its own 4 KiB kernel name, region and unresolved pointer: what the reports
  gather over a whole archive grows with every graph.
- ``moe``: 4x the largest real archive's graphs: 52 graphs (SGLang's MoE preset at
  max_running_requests 512) of 2,800 nodes (4x its 700) tiled from the tiny Qwen3 SAVE.

Then runs every offline command on each, as a user would (a fresh interpreter),
and reports its peak RSS from ``wait4`` (the TUI: its ``VmHWM`` once its first
paint, summary and lint are on screen). ``--scale test`` builds smaller ``session``,
``archive`` and ``moe`` archives (the ``limits`` ones are always full size).
Results go to ``bench/out/hostile_memory.json``; ``bench/RESULTS.md`` records them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import build as build_tiled
from synthetic import machine

from foundry.archive import Archive, ArchiveWriter
from foundry.archive.files import DEFAULT_LIMITS, sha256_hex
from foundry.archive.schema import (
    CATALOG_FILE,
    MAX_ARCHIVE_GRAPHS,
    MAX_GRAPHS,
    MAX_TRACE,
    SESSION_FORMAT,
    AllocationRecord,
    GlobalRecord,
    ImageRecord,
    Session,
)
from foundry.archive.writer import encode_record
from foundry.graphir import limits
from foundry.graphir.codec import encode_graph
from foundry.graphir.graph import Edge, GraphIR
from foundry.graphir.kernel import KernelIdentity, LaunchAttribute, LaunchConfig, ParamLayout
from foundry.graphir.nodes import KernelNode
from foundry.graphir.operands import Operand, OperandSite
from foundry.graphir.regions import UNRESOLVED, Region, RegionKind

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MiB = 1 << 20
BASE = 0x600000000000
PER_KERNEL = limits.MAX_GRAPH_PARAMS // limits.MAX_NODES  # 4: each graph total, spread over the node limit
REGION_BYTES = 1 << 16
SCALAR = 8 * PER_KERNEL  # bytes of the last parameter: a pointer word, then scalars with the undefined runs


def graph_at_limits(name: str, *, name_length: int, variant: int = 0) -> GraphIR:
    """A valid graph at every per-graph count limit at once (see the module docstring);
    another ``variant`` has the same kernels, regions and operands, and every node's grid
    and scalar parameter bytes changed."""
    nodes, edges = limits.MAX_NODES, limits.MAX_EDGES
    regions = [Region(f"alloc.{i}", RegionKind.ALLOC, BASE + i * REGION_BYTES, REGION_BYTES)
               for i in range(limits.MAX_REGIONS)]  # fmt: skip
    ir = GraphIR(name, regions=regions, meta={f"key.{i}": i for i in range(limits.MAX_META)})
    sizes = (8,) * (PER_KERNEL - 1) + (8 + SCALAR,)
    layout = ParamLayout(tuple(8 * i for i in range(PER_KERNEL)), sizes)
    attributes = tuple(LaunchAttribute("priority", i) for i in range(limits.MAX_GRAPH_ATTRIBUTES // nodes))
    runs = limits.MAX_GRAPH_UNDEFINED_RUNS // nodes
    assert limits.MAX_OPERANDS // nodes == PER_KERNEL  # one pointer word in each parameter
    kernels, operands = [], []
    for n in range(nodes):
        params = bytearray()
        for p in range(PER_KERNEL):
            region = regions[(n * PER_KERNEL + p) % len(regions)]
            offset = 8 * ((n + p) % (REGION_BYTES // 8))
            params += (region.base + offset).to_bytes(8, "little")
            operands.append(Operand(n, OperandSite.PARAM, p, 8 * p, region.base + offset, region.name, offset))
        params += bytes((n + variant + i) & 0xFF for i in range(SCALAR))
        undefined = tuple((8 * PER_KERNEL + 2 * r, 1) for r in range(runs))  # one byte apart, in the scalars
        kernel = KernelIdentity(f"_Z{name_length}k{n:06d}".ljust(name_length, "x"))
        launch = LaunchConfig((n + 1 + variant, 1, 1), (128, 1, 1), 0, attributes)
        kernels.append(KernelNode(n, kernel, launch, layout, bytes(params), undefined=undefined))
    ir.add_nodes(kernels)
    forward = [Edge(i, i + step) for step in (1, 2, 3) for i in range(nodes - step)]  # forward only: acyclic
    ir.add_edges(forward[:edges])
    ir.set_operands(operands)
    return ir


def build_limits(out: Path, variant: int = 0) -> Path:
    """Two graphs at the limits, their kernel names as long as the graph file limit allows."""
    environment = Archive.open(FIXTURES / "tiny-qwen3").catalog.environment
    writer = ArchiveWriter(out, environment=environment, model={"model": "limits"})
    rank = writer.rank(0)
    probe = graph_at_limits("probe", name_length=16)
    spare = DEFAULT_LIMITS.graph - len(encode_graph(probe)) - 64 * 1024
    length = 16 + spare // limits.MAX_NODES
    for name in ("limits.a", "limits.b"):
        rank.add_graph(graph_at_limits(name, name_length=length, variant=variant))
    rank.seal()
    return writer.commit()


def build_many(out: Path, *, graphs: int = MAX_ARCHIVE_GRAPHS, ranks: int = 4) -> Path:
    """``graphs`` one-node graphs over ``ranks`` ranks (the archive's graph limit at full
    scale), each with its own 4 KiB kernel name, region and unresolved pointer: what the
    reports gather over a whole archive (kernels, regions, findings) grows with every one."""
    environment = Archive.open(FIXTURES / "tiny-qwen3").catalog.environment
    writer = ArchiveWriter(out, environment=environment, world_size=ranks, model={"model": "many"})
    layout = ParamLayout((0, 8), (8, 8))
    for r in range(ranks):
        rank = writer.rank(r)
        for i in range(graphs // ranks):
            base = BASE + (i << 20)
            region = Region(f"alloc.r{r}.{i:05d}", RegionKind.ALLOC, base, REGION_BYTES)
            ir = GraphIR(f"r{r}.g{i:05d}", regions=[region])
            params = base.to_bytes(8, "little") + (BASE - 4096 - i).to_bytes(8, "little")
            kernel = KernelIdentity(f"_Zr{r}k{i:05d}".ljust(4096, "x"))
            ir.add_nodes([KernelNode(0, kernel, LaunchConfig((1, 1, 1), (32, 1, 1)), layout, params)])
            ir.set_operands([Operand(0, OperandSite.PARAM, 0, 0, base, region.name, 0),
                             Operand(0, OperandSite.PARAM, 1, 8, BASE - 4096 - i, UNRESOLVED, 0)])  # fmt: skip
            rank.add_graph(ir, shape_key=i, runner="decode")
        rank.seal()
    return writer.commit()


def build_session(out: Path, *, graphs: int = MAX_GRAPHS) -> Path:
    """One rank with ``graphs`` small real graphs, the longest trace allowed and globals
    filling the session to its limit."""
    source = Archive.open(FIXTURES / "saveload-a")
    template = source.graph(0, "sample.bs8")
    writer = ArchiveWriter(out, environment=source.catalog.environment, model={"model": "session"})
    rank = writer.rank(0)
    for i in range(graphs):
        ir = GraphIR(f"g{i:05d}", regions=template.regions.values(), meta=template.meta)
        ir.add_nodes(template.nodes())
        ir.add_edges(template.edges())
        ir.set_operands(template.operands)
        rank.add_graph(ir, shape_key=i, runner="decode")
    region = source.session(0).region
    trace = tuple(AllocationRecord(i, i * 4096, 4096, 4096, "warmup") for i in range(MAX_TRACE))
    rank.set_region(msgspec.structs.replace(region, trace=trace, allocations=MAX_TRACE))
    session = Session(SESSION_FORMAT, 1, 0, tuple(rank.graphs), rank.region)
    used = len(encode_record(session))  # as seal() writes it: indented JSON
    value = bytes(range(256)) * (MiB // 256)
    one = GlobalRecord("g0", len(value), True, sha256_hex(value), value)
    each = len(encode_record(ImageRecord("0" * 64, True, (one, one)))) - len(
        encode_record(ImageRecord("0" * 64, True, (one,)))
    )
    count = max(0, (DEFAULT_LIMITS.session - used - MiB) // each)
    globals_ = tuple(msgspec.structs.replace(one, name=f"g{i}") for i in range(count))
    rank.add_images([ImageRecord("0" * 64, True, globals_)])
    rank.seal()
    return writer.commit()


def commands(archive: Path, graph: str, other: Path | None = None) -> dict[str, list[str]]:
    """Every offline command over ``archive`` (``graph`` for the per-graph ones); the diffs
    compare it with itself, and with ``other`` too where given."""
    a = str(archive)
    out = {
        "archive inspect": ["archive", "inspect", a],
        "archive inspect --json": ["archive", "inspect", a, "--json"],
        "graph lint": ["graph", "lint", a],
        "archive verify": ["archive", "verify", a],
        "graph show": ["graph", "show", a, graph],
        "graph show --json": ["graph", "show", a, graph, "--json"],
        "graph export dot": ["graph", "export", a, graph, "--format", "dot"],
        "graph export graphml": ["graph", "export", a, graph, "--format", "graphml"],
        "archive diff": ["archive", "diff", a, a],
        "archive diff --json": ["archive", "diff", a, a, "--json"],
        "archive diff --relocations": ["archive", "diff", a, a, "--relocations"],
    }
    if other is not None:
        b = str(other)
        out.update({
            "archive diff (every node changed)": ["archive", "diff", a, b],
            "archive diff --json (every node changed)": ["archive", "diff", a, b, "--json"],
            "archive diff --relocations (every node changed)": ["archive", "diff", a, b, "--relocations"],
        })  # fmt: skip
    return out


# A process started before anything is built starts every measured command: a child's peak
# RSS (ru_maxrss) starts at its parent's RSS when it forks, so measured from this process,
# which holds the archives it built, every figure would carry this process's size.
_SPAWNER = r"""
import json, os, re, subprocess, sys, time
def command(request):
    started = time.perf_counter()
    proc = subprocess.Popen(request["argv"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=request["cwd"])
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return {"rc": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss,
            "seconds": time.perf_counter() - started, "stderr": err.decode(errors="replace")[-2000:]}
def tui(request):
    import pexpect, pyte
    screen = pyte.Screen(120, 40)
    stream = pyte.ByteStream(screen)
    started = time.perf_counter()
    child = pexpect.spawn(request["argv"][0], request["argv"][1:], dimensions=(40, 120), cwd=request["cwd"],
                          env=dict(os.environ, TERM="xterm-256color"))
    painted = settled = None
    last, changed = "", time.monotonic()
    deadline = time.monotonic() + request["timeout"]
    while settled is None and time.monotonic() < deadline:
        try:
            stream.feed(child.read_nonblocking(1 << 20, timeout=0.05))
        except pexpect.TIMEOUT:
            pass
        text = "\n".join(screen.display)
        if text != last:
            last, changed = text, time.monotonic()
        if painted is None and re.search(request["painted"], text):
            painted = time.perf_counter() - started
        done = painted is not None and re.search(request["settled"], text)
        if done and time.monotonic() - changed > request["quiet"]:
            settled = time.perf_counter() - started
    status = open(f"/proc/{child.pid}/status").read()
    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
    child.send("q")
    try:
        child.expect(pexpect.EOF, timeout=30)
    except pexpect.TIMEOUT:
        pass
    child.close(force=True)
    return {"rc": 0 if settled is not None else 124, "maxrss_kib": hwm, "seconds": settled or 0.0,
            "painted_s": painted, "stderr": "" if settled is not None else text[-2000:]}
for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps(tui(request) if request["tui"] else command(request)), flush=True)
"""


class Spawner:
    """The small process that runs every measured command (see ``_SPAWNER``)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SPAWNER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip

    def _ask(self, request: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cwd": str(ROOT), **request}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def foundry(self, argv: list[str]) -> dict:
        """``foundry ARGV`` in a fresh interpreter: exit status, peak RSS (KiB), seconds."""
        reply = self._ask({"tui": False, "argv": [sys.executable, "-m", "foundry", *argv]})
        if reply["rc"] not in (0, 1):
            raise SystemExit(f"foundry {' '.join(argv)} failed ({reply['rc']}): {reply['stderr'].strip()}")
        return reply

    def tui(self, archive: Path, graph: str, nodes: int, *, timeout: float = 600) -> dict:
        """``foundry-tui ARCHIVE`` in a 120x40 pseudo-terminal: its peak RSS once the first graph's
        nodes are on screen, then the lint verdict (summary and lint ran in the background), and
        the screen has been still for a second."""
        reply = self._ask({"tui": True, "argv": [sys.executable, "-m", "foundry.tui.app", str(archive)],
                           "painted": f"{nodes} nodes · ", "settled": r"lint: \d+ error", "quiet": 1.0,
                           "timeout": timeout})  # fmt: skip
        if reply["rc"]:
            raise SystemExit(f"foundry-tui {archive} never settled: {reply['stderr']}")
        return reply

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(root: Path, spawner: Spawner, *, scale: str = "full", reuse: bool = False,
            only: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """Build the archives under ``root`` (or, with ``reuse``, take the ones built there before)
    and measure every command on each (``only``: those whose label starts with one of them)."""
    small = scale == "test"

    def built_by(make: Callable[[Path], Path], name: str) -> Path:
        return root / name if reuse and (root / name / CATALOG_FILE).exists() else make(root / name)

    built = {
        "limits": (built_by(build_limits, "limits"), "limits.a", limits.MAX_NODES,
                   built_by(lambda p: build_limits(p, 1), "changed")),
        "session": (built_by(lambda p: build_session(p, graphs=512 if small else MAX_GRAPHS), "session"), "g00000",
                    8, None),
        "archive": (built_by(lambda p: build_many(p, graphs=2048 if small else MAX_ARCHIVE_GRAPHS), "archive"),
                    "r0.g00000", 1, None),
        "moe": (built_by(lambda p: build_tiled(p, graphs=4 if small else 52, nodes=4 * 700), "moe"), "decode.g000",
                4 * 700, None),
    }  # fmt: skip
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, (path, graph, nodes, other) in built.items():
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        results[name] = {"archive_mib": {"size": round(size / MiB, 1)}}
        for label, argv in commands(path, graph, other).items():
            if only and not any(label.startswith(o) for o in only):
                continue
            reply = spawner.foundry(argv)
            results[name][label] = {"exit": reply["rc"], "peak_rss_mib": round(reply["maxrss_kib"] / 1024, 1),
                                    "seconds": round(reply["seconds"], 2)}  # fmt: skip
        if only and not any("foundry-tui".startswith(o) for o in only):
            continue
        reply = spawner.tui(path, graph, nodes)
        results[name]["foundry-tui (first paint, then summary and lint)"] = {
            "exit": 0, "peak_rss_mib": round(reply["maxrss_kib"] / 1024, 1), "seconds": round(reply["seconds"], 2),
            "first_paint_s": round(reply["painted_s"], 2),
        }  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=("full", "test"), default="full")
    parser.add_argument("--keep", type=Path, default=None, help="build the archives here and keep them")
    parser.add_argument("--reuse", action="store_true", help="with --keep: measure the archives built there before")
    parser.add_argument("--only", action="append", help="measure only the commands whose label starts so")
    args = parser.parse_args(argv)
    spawner = Spawner()  # first: before this process holds anything
    os.fsync = lambda fd: None  # the archives built here need no durability; 130,000 fsyncs would take minutes
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = args.keep or Path(tmp)
            results = measure(root, spawner, scale=args.scale, reuse=args.reuse and args.keep is not None,
                              only=args.only)  # fmt: skip
    finally:
        spawner.close()
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "hostile_memory.json").write_text(json.dumps({"machine": machine(), "results": results}, indent=1) + "\n")
    for name, rows in results.items():
        print(f"{name}: {rows['archive_mib']['size']} MiB")
        for label, row in rows.items():
            if label != "archive_mib":
                print(f"  {label:52} exit {row['exit']}  peak RSS {row['peak_rss_mib']:7.1f} MiB  "
                      f"{row['seconds']:7.2f} s")  # fmt: skip
    worst = max(row["peak_rss_mib"] for rows in results.values() for k, row in rows.items() if k != "archive_mib")
    print(f"largest peak RSS: {worst:.1f} MiB")
    return 0 if worst < 1024 else 1


if __name__ == "__main__":
    sys.exit(main())
