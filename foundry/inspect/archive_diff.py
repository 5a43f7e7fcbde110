"""``foundry archive diff``: what differs between two archives.

Graphs are compared by fingerprint first; only a changed graph is decoded and
compared node by node (:func:`foundry.graphir.passes.diff.diff_graphs`). Two graphs
whose fingerprints differ only because each SAVE marked other bytes undefined are
the same (``undefined_only``), once both records are checked honest. The diff is a
pure function; the CLI and the TUI only render it. Its graphs share one budget of
what they list (:data:`foundry.graphir.passes.diff.LISTED`), so the diff of two
archives however large stays bounded; what is not listed is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from foundry.archive.reader import Archive
from foundry.graphir.fingerprint import fingerprint
from foundry.graphir.graph import GraphIR
from foundry.graphir.passes.diff import (
    LISTED,
    REBUILT,
    EdgeChange,
    FieldChange,
    GraphDiff,
    Status,
    diff_graphs,
    mark_differences,
)


@dataclass
class ArchiveDiff:
    """Two archives compared: their environments, and every graph of every rank either holds."""

    a: str
    b: str
    environment: list[FieldChange] = field(default_factory=list)
    graphs: list[GraphDiff] = field(default_factory=list)
    # (rank, graph, change): what the sessions say of a graph, beside the graph, that changes how
    # a LOAD runs it (its instantiation flags)
    entries: list[tuple[int, str, FieldChange]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.environment and not self.entries and all(g.status is Status.SAME for g in self.graphs)

    @property
    def rebuilt_kernels(self) -> list[str]:
        """Kernels (by label) that differ only by being another build of the same source."""
        return sorted({n.label for g in self.graphs for n in g.nodes for c in n.changes if c.subject == REBUILT})

    def to_dict(self) -> dict[str, Any]:
        def graph(g: GraphDiff) -> dict[str, Any]:
            return {
                "rank": g.rank,
                "graph": g.name,
                "status": g.status.value,
                "fingerprint_a": g.fingerprint_a,
                "fingerprint_b": g.fingerprint_b,
                "undefined_only": g.undefined_only,
                "marks_differ": [vars(m) for m in g.marks_differ],
                "nodes": [
                    {
                        "status": n.status.value,
                        "a": n.a,
                        "b": n.b,
                        "label": n.label,
                        "changes": [vars(c) for c in n.changes],
                        "changes_not_listed": n.changes_not_listed,
                    }
                    for n in g.nodes
                ],
                "edges_changed": [_edge_change(c) for c in g.edges_changed],
                "edges_only_a": g.edges_only_a,
                "edges_only_b": g.edges_only_b,
                "not_listed": {"nodes": g.nodes_not_listed, "edges": g.edges_not_listed, "marks": g.marks_not_listed},
            }

        return {
            "a": self.a,
            "b": self.b,
            "identical": self.identical,
            "rebuilt_kernels": self.rebuilt_kernels,
            "environment": [vars(c) for c in self.environment],
            "entries": [{"rank": rank, "graph": name, **vars(c)} for rank, name, c in self.entries],
            "graphs": [graph(g) for g in self.graphs],
        }


def _environment_changes(a: Archive, b: Archive) -> list[FieldChange]:
    changes = []
    env_a, env_b = msgspec.structs.asdict(a.catalog.environment), msgspec.structs.asdict(b.catalog.environment)
    for key in env_a:
        if env_a[key] != env_b[key]:
            changes.append(FieldChange(f"environment.{key}", str(env_a[key]), str(env_b[key])))
    for key in ("world_size", "format_version"):
        va, vb = getattr(a.catalog, key), getattr(b.catalog, key)
        if va != vb:
            changes.append(FieldChange(key, str(va), str(vb)))
    if a.catalog.modules.state != b.catalog.modules.state:
        changes.append(FieldChange("modules.state", a.catalog.modules.state, b.catalog.modules.state))
    for key in sorted(a.catalog.model.keys() | b.catalog.model.keys()):
        va, vb = a.catalog.model.get(key, "(absent)"), b.catalog.model.get(key, "(absent)")
        if va != vb:
            changes.append(FieldChange(f"model.{key}", va, vb))
    return changes


def _marks(ir: GraphIR) -> dict[int, tuple[tuple[int, int], ...]]:
    return {node.id: node.undefined for node in ir.kernels() if node.undefined}


def _same_under_both_marks(a: GraphIR, b: GraphIR) -> bool:
    """Whether the two graphs fingerprint alike once each also leaves out the other's
    undefined bytes (recomputed: the recorded fingerprints are not trusted for this)."""
    return fingerprint(a, _marks(b)) == fingerprint(b, _marks(a))


def diff_archives(a: Archive, b: Archive) -> ArchiveDiff:
    """Environment, graph set, fingerprints and node-level differences of two archives.

    Every graph of either archive is read and checked as LOAD reads it (size, sha256,
    typed decoding, the deep check), so a graph that is missing, unreadable or damaged
    is an ArchiveError naming its file, never a graph taken as the same. Two graphs
    are the same only when their recorded fingerprints agree and are their graphs'
    own (recomputed); a stale record gets the node-by-node comparison."""
    result = ArchiveDiff(str(a.root), str(b.root), _environment_changes(a, b))
    listed = LISTED  # what the graphs' diffs list, together
    for rank in sorted(set(a.ranks) | set(b.ranks)):
        entries_a = {e.name: e for e in a.entries(rank)} if rank in a.ranks else {}
        entries_b = {e.name: e for e in b.entries(rank)} if rank in b.ranks else {}
        for name in sorted(entries_a.keys() | entries_b.keys()):
            ea, eb = entries_a.get(name), entries_b.get(name)
            ga = a.graph(rank, ea) if ea is not None else None  # read and checked, one pair at a time
            gb = b.graph(rank, eb) if eb is not None else None
            if ea is None or eb is None or ga is None or gb is None:
                status = Status.ONLY_A if eb is None else Status.ONLY_B
                result.graphs.append(GraphDiff(rank, name, status, ea and ea.fingerprint, eb and eb.fingerprint))
                continue
            flags_a, flags_b = ea.flags, eb.flags
            if flags_a != flags_b:
                result.entries.append((rank, name, FieldChange("instantiate_flags", hex(flags_a), hex(flags_b))))
            honest = fingerprint(ga) == ea.fingerprint and fingerprint(gb) == eb.fingerprint
            if ea.fingerprint == eb.fingerprint and honest:
                result.graphs.append(GraphDiff(rank, name, Status.SAME, ea.fingerprint, eb.fingerprint))
            else:
                graph = diff_graphs(ga, gb, rank=rank, listed=listed)
                graph.fingerprint_a, graph.fingerprint_b = ea.fingerprint, eb.fingerprint
                if graph.status is Status.SAME:  # no field differs: honest records that agree over both marks
                    graph.undefined_only = honest and _same_under_both_marks(ga, gb)
                    graph.status = Status.SAME if graph.undefined_only else Status.CHANGED
                    if graph.undefined_only:
                        graph.marks_differ, graph.marks_not_listed = mark_differences(ga, gb, listed=listed)
                listed -= graph.listed
                result.graphs.append(graph)
    return result


def _edge_change(change: EdgeChange) -> dict[str, Any]:
    """An edge of another kind, for ``--json``: its ends, kinds, and ``[from_port, to_port, type]``."""
    return {"a": change.a, "b": change.b, "kind_a": change.kind_a, "kind_b": change.kind_b,
            "data_a": list(msgspec.structs.astuple(change.data_a)),
            "data_b": list(msgspec.structs.astuple(change.data_b))}  # fmt: skip
