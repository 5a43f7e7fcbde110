"""Build a large synthetic archive by replicating real captured graphs.

    python bench/synthetic.py OUT_DIR [--graphs 50] [--nodes 2000]

Each graph is the tiny Qwen3 decode graph from ``tests/fixtures/tiny-qwen3``
tiled until it has ``--nodes`` nodes (ids renumbered, tiles chained by one
edge, operands shifted with their nodes), so kernels, parameter bytes and
operands are real; graph ``i`` cycles through the fixture's batch sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec

from foundry.archive import Archive, ArchiveWriter
from foundry.graphir.graph import Edge, GraphIR

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tiny-qwen3"


def tile(source: GraphIR, name: str, nodes: int) -> GraphIR:
    """``source`` repeated until it has ``nodes`` nodes, as one chained graph."""
    out = GraphIR(name, regions=source.regions.values(), meta=dict(source.meta))
    base_nodes, base_edges, base_ops = source.nodes(), source.edges(), list(source.operands)
    size = len(base_nodes)
    new_nodes, new_edges, new_ops = [], [], []
    copies = -(-nodes // size)
    for c in range(copies):
        shift = c * size
        take = min(size, nodes - shift)
        new_nodes += [msgspec.structs.replace(n, id=n.id + shift) for n in base_nodes[:take]]
        new_edges += [Edge(e.src + shift, e.dst + shift, e.data) for e in base_edges if e.dst < take]
        new_ops += [msgspec.structs.replace(o, node=o.node + shift) for o in base_ops if o.node < take]
        if c:
            new_edges.append(Edge(shift - 1, shift))
    out.add_nodes(new_nodes)
    out.add_edges(new_edges)
    out.set_operands(new_ops)
    return out


def build(out: Path, *, graphs: int = 50, nodes: int = 2000, fixture: Path = FIXTURE) -> Path:
    source = Archive.open(fixture)
    templates = [source.graph(0, e) for e in source.entries(0)]
    writer = ArchiveWriter(
        out, environment=source.catalog.environment, model=dict(source.catalog.model), overwrite=True
    )
    rank = writer.rank(0)
    for i in range(graphs):
        template = templates[i % len(templates)]
        rank.add_graph(tile(template, f"decode.g{i:03d}", nodes), shape_key=i + 1, runner="decode")
    rank.seal()
    return writer.commit()


@contextlib.contextmanager
def temporary_archive(graphs: int, nodes: int) -> Iterator[tuple[Path, int]]:
    """A synthetic archive in a temporary directory, with its size in bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = build(Path(tmp) / "synthetic", graphs=graphs, nodes=nodes)
        yield archive, sum(f.stat().st_size for f in archive.rglob("*") if f.is_file())


def benchmark_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every benchmark over a synthetic archive takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--graphs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    return parser


def machine() -> dict[str, object]:
    """What ran a benchmark, recorded beside its figures."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def report(name: str, result: dict, args: argparse.Namespace, size: int) -> None:
    """Write ``bench/out/<name>.json`` and print the run's heading."""
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"{args.graphs} graphs x {args.nodes} nodes ({size / 2**20:.0f} MiB), {os.cpu_count()} CPUs, "
        f"median of {args.repeat}:"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--graphs", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=2000)
    args = parser.parse_args(argv)
    path = build(args.out, graphs=args.graphs, nodes=args.nodes)
    print(f"wrote {path}: {args.graphs} graphs x {args.nodes} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
