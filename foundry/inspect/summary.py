"""``foundry archive inspect``: what an archive holds, as plain data.

The CLI renders it as tables or JSON; the TUI's summary pane renders it too.
What it gathers over the whole archive is bounded, however many graphs that holds
(docs/archive-format.md, "Limits"): per graph a few counts, and at most
:data:`LISTED_UNRESOLVED` unresolved pointers, :data:`LISTED_NAMES` kernel names
and as many region names (:data:`LISTED_NAME_CHARS` characters of names in all)
listed; what is not listed is counted. Each graph is reduced where it was read, in a
worker process on a large archive (:mod:`foundry.inspect.fanout`); the bounds are
applied here, in the archive's order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from foundry.archive.jit_manifest import read_manifest
from foundry.archive.reader import Archive
from foundry.archive.schema import GraphEntry
from foundry.graphir.graph import PROGRAMMATIC, GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.nodes import KernelNode
from foundry.inspect.fanout import map_graphs

if TYPE_CHECKING:  # discovering backends is slow: it happens while the graphs are read
    from foundry.backends.registry import BackendRegistry

LISTED_UNRESOLVED = 1_000  # unresolved pointers listed over the archive (all are counted)
LISTED_NAMES = 16_384  # distinct kernel names, and distinct region names, listed
LISTED_NAME_CHARS = 16 << 20  # characters of the names listed, in all


@dataclass
class GraphSummary:
    rank: int
    name: str
    shape_key: int | None
    runner: str | None
    nodes: int
    fingerprint: str
    kinds: Counter[str]
    collectives: Counter[str]
    operands: int
    unresolved: list[dict[str, Any]]  # the first ones, as many as the summary lists
    unresolved_count: int = 0  # all of them
    undefined_bytes: int = 0
    rng: bool = False
    plan: bool = False  # a launch plan: LOAD with --builder native builds it without the IR
    instantiate_flags: int = 0  # the program's own instantiation flags, which LOAD gives the graph
    edges: Counter[str] = field(default_factory=Counter)  # by kind: plain, programmatic (EdgeData.kind)

    @property
    def edges_programmatic(self) -> int:
        """Edges that let a consumer start before its producer ends (programmatic dependent launch)."""
        return sum(n for kind, n in self.edges.items() if kind.startswith(PROGRAMMATIC))


@dataclass
class ArchiveSummary:
    path: str
    catalog: dict[str, Any]
    graphs: list[GraphSummary] = field(default_factory=list)
    kernels: Counter[str] = field(default_factory=Counter)
    kernel_names: dict[str, str] = field(default_factory=dict)
    regions: dict[str, dict[str, Any]] = field(default_factory=dict)
    restore: list[dict[str, Any]] = field(default_factory=list)  # per rank: what a LOAD needs
    kernels_not_listed: int = 0  # launches of kernels whose names came after the listed ones
    regions_not_listed: int = 0  # uses of regions whose names came after the listed ones
    unresolved_not_listed: int = 0
    name_chars: int = 0  # of the kernel and region names listed

    def admits(self, table: dict[str, Any], name: str) -> bool:
        """Whether ``name`` is (or may become) a key of ``table``: the listed names are bounded."""
        if name in table:
            return True
        if len(table) >= LISTED_NAMES or self.name_chars + len(name) > LISTED_NAME_CHARS:
            return False
        self.name_chars += len(name)
        return True

    @property
    def kinds(self) -> Counter[str]:
        return sum((g.kinds for g in self.graphs), Counter())

    @property
    def collectives(self) -> Counter[str]:
        return sum((g.collectives for g in self.graphs), Counter())

    @property
    def unresolved(self) -> list[dict[str, Any]]:
        return [u for g in self.graphs for u in g.unresolved]

    def to_dict(self) -> dict[str, Any]:
        return {
            "archive": self.path,
            **self.catalog,
            "graphs": [
                {
                    "rank": g.rank,
                    "graph": g.name,
                    "shape_key": g.shape_key,
                    "runner": g.runner,
                    "nodes": g.nodes,
                    "fingerprint": g.fingerprint,
                    "kinds": dict(sorted(g.kinds.items())),
                    "edges": dict(sorted(g.edges.items())),
                    "collectives": dict(sorted(g.collectives.items())),
                    "operands": g.operands,
                    "unresolved": g.unresolved_count,
                    "undefined_bytes": g.undefined_bytes,
                    "rng": g.rng,
                    "plan": g.plan,
                    "instantiate_flags": g.instantiate_flags,
                }
                for g in self.graphs
            ],
            "totals": {
                "graphs": len(self.graphs),
                "nodes": sum(g.nodes for g in self.graphs),
                "kinds": dict(sorted(self.kinds.items())),
                "collectives": dict(sorted(self.collectives.items())),
            },
            "kernels": [{"name": n, "short": self.kernel_names[n], "count": c} for n, c in self.kernels.most_common()],
            "regions": [{"name": k, **v} for k, v in sorted(self.regions.items())],
            "unresolved": self.unresolved,
            "not_listed": {
                "kernel_launches": self.kernels_not_listed,
                "region_uses": self.regions_not_listed,
                "unresolved": self.unresolved_not_listed,
            },
            "restore": self.restore,
        }


def summarize_graph(ir: GraphIR, *, rank: int, entry: GraphEntry, listed: int = LISTED_UNRESOLVED,
                    nodes: list[KernelNode] | None = None) -> GraphSummary:  # fmt: skip
    """One graph's figures, its first ``listed`` unresolved pointers among them (``nodes``: its
    kernel nodes, if the caller has them). Its collectives are left for the caller to count,
    where the backends are."""
    found = ir.operands.unresolved() if ir.operands.count_unresolved() else []
    unresolved = [
        {
            "rank": rank,
            "graph": ir.name,
            "node": o.node,
            "site": o.site.value,
            "param": o.param,
            "offset": o.offset,
            "value": hex(o.value),
        }
        for o in found[:listed]
    ]
    nodes = ir.kernels() if nodes is None else nodes
    return GraphSummary(
        rank=rank,
        name=ir.name,
        shape_key=entry.shape_key,
        runner=entry.runner,
        nodes=len(ir),
        fingerprint=entry.fingerprint,
        kinds=ir.counts_by_kind(),
        collectives=Counter(),
        operands=len(ir.operands),
        unresolved=unresolved,
        unresolved_count=len(found),
        undefined_bytes=sum(length for node in nodes if node.undefined for _, length in node.undefined),
        rng=entry.rng is not None,
        plan=entry.plan is not None,
        instantiate_flags=entry.flags,
        edges=ir.edge_kinds(),
    )


@dataclass
class GraphFacts:
    """What one graph adds to an archive's summary (computed where the graph was read); its
    collectives are counted where the backends are (:func:`summarize`)."""

    graph: GraphSummary
    kernels: list[tuple[KernelIdentity, int]]  # each distinct kernel (by name) and its launches
    regions: list[tuple[str, str, int, int]]  # (name, kind, size, operands pointing into it)


def graph_facts(archive: Archive, _context: None, rank: int, entry: GraphEntry) -> GraphFacts:
    """Read one graph (its checks included) and reduce it to what the summary needs."""
    ir = archive.graph(rank, entry, deep=False)
    nodes = ir.kernels()
    table = ir.kernel_table(nodes)
    used = ir.operands.region_uses()
    regions = [(r.name, r.kind.value, r.size, used.get(r.name, 0)) for r in ir.regions.values()]
    row = summarize_graph(ir, rank=rank, entry=entry, nodes=nodes)
    return GraphFacts(row, list(table.values()), regions)


def summarize(archive: Archive, registry: BackendRegistry | Callable[[], BackendRegistry], *, rank: int | None = None,
              workers: int | None = 1, meanwhile: Callable[[], object] | None = None) -> ArchiveSummary:  # fmt: skip
    """Read every selected graph once and gather what inspect shows; ``workers``: processes that
    read the graphs (None: one per core on a large archive), ``meanwhile``: what this process
    does while they read (:func:`foundry.inspect.fanout.map_graphs`). ``registry`` may be what
    discovers the backends: it is called while the workers read too (discovery imports every
    backend and reads every installed distribution's entry points), as only this process
    counts collectives."""
    cat = archive.catalog
    catalog = {
        "format_version": cat.format_version,
        "tool_version": cat.tool_version,
        "created": cat.created,
        "environment": msgspec.structs.asdict(cat.environment),
        "world_size": cat.world_size,
        "modules": {"state": cat.modules.state.value, "images": len(cat.modules.blobs)},
        "model": dict(cat.model),
        "jit": jit_facts(archive),
    }
    summary = ArchiveSummary(str(archive.root), catalog)
    ranks = archive.ranks if rank is None else [rank]
    summary.restore = [restore_facts(archive, r) for r in ranks if r in archive.ranks]
    selection = archive.select(rank=rank)
    listed = LISTED_UNRESOLVED  # over the archive: each graph's facts list as many of its own
    backends: list[BackendRegistry] = []

    def alongside() -> None:
        backends.append(registry() if callable(registry) else registry)
        if meanwhile is not None:
            meanwhile()

    from foundry.backends.classify import collective_counts  # the backends' modules: imported by now

    for facts in map_graphs(archive, selection, graph_facts, None, workers=workers, meanwhile=alongside):
        graph = facts.graph
        graph.collectives = collective_counts(facts.kernels, backends[0])
        graph.unresolved = graph.unresolved[:listed]
        listed -= len(graph.unresolved)
        summary.unresolved_not_listed += graph.unresolved_count - len(graph.unresolved)
        summary.graphs.append(graph)
        for kernel, count in facts.kernels:
            if not summary.admits(summary.kernels, kernel.name):
                summary.kernels_not_listed += count
                continue
            summary.kernels[kernel.name] += count
            summary.kernel_names.setdefault(kernel.name, kernel.short_name)
        for name, kind, size, operands in facts.regions:
            if not summary.admits(summary.regions, name):
                summary.regions_not_listed += 1
                continue
            row = summary.regions.setdefault(name, {"kind": kind, "size": size, "graphs": 0, "operands": 0})
            row["size"] = max(row["size"], size)
            row["graphs"] += 1
            row["operands"] += operands
    return summary


def jit_facts(archive: Archive) -> dict[str, Any] | None:
    """The JIT caches the archive carries, per cache (None: none): files, bytes, how many
    are host code, which a LOAD installs only when the user trusts the archive's code; and
    the versions they were built for, which a LOAD compares (those recorded)."""
    jit = archive.catalog.jit
    if jit is None:
        return None
    caches: dict[str, dict[str, int]] = {}
    manifest = read_manifest(archive.root, jit)
    for entry in manifest.entries:
        row = caches.setdefault(entry.cache.value, {"files": 0, "bytes": 0, "host_files": 0})
        row["files"] += 1
        row["bytes"] += entry.size
        row["host_files"] += entry.host_code
    versions = {k: v for k, v in msgspec.structs.asdict(manifest.versions).items() if v is not None}
    rows = [{"cache": name, **row} for name, row in sorted(caches.items())]
    return {"state": jit.state.value, "files": jit.files, "bytes": jit.bytes, "host_code": jit.host_code,
            "versions": versions, "caches": rows}  # fmt: skip


def restore_facts(archive: Archive, rank: int) -> dict[str, Any]:
    """What a LOAD of ``rank`` relies on: the region, the warm-up, images and their globals."""
    session = archive.session(rank)
    region = session.region
    facts: dict[str, Any] = {"rank": rank, "region": None}
    if region is not None:
        facts["region"] = {
            "base": hex(region.base),
            "final_offset": region.final_offset,
            "allocations": region.allocations,
            "warmup_allocations": region.warmup_allocations,
            "late_allocations": sum(1 for a in region.trace if a.phase == "late"),
            "warmup_bytes": region.warmup_bytes.size if region.warmup_bytes else None,
        }
    facts["images"] = len(session.images)
    facts["globals_unknown"] = [i.sha256[:12] for i in session.images if not i.globals_known]
    facts["globals_written"] = sorted({g.name for i in session.images for g in i.globals if g.written})
    # globals holding the host addresses of SAVE's process: LOAD needs the application's own copy
    facts["globals_per_process"] = sorted({g.name for i in session.images for g in i.globals if g.host_words})
    return facts
