"""What the TUI knows about an archive, with no widgets in it.

:class:`OpenedArchive` is an opened archive plus the name people know it by.
:func:`load_graph` decodes one graph and precomputes what the browse screen
shows (table rows, backend claims, nodes with unresolved operands); it runs in
a worker. The jump helpers are pure functions over sorted node ids so the
screens stay small and the rules are tested without a terminal.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.text import Text

from foundry.archive.named import archive_path, open_named
from foundry.archive.reader import Archive
from foundry.archive.sample import SAMPLE_NAME, sample_path
from foundry.archive.schema import GraphEntry
from foundry.backends.base import KernelMatch
from foundry.backends.classify import classify
from foundry.backends.registry import BackendRegistry
from foundry.graphir.graph import GraphIR
from foundry.graphir.nodes import KernelNode, MemcpyNode, MemsetNode, Node, UnsupportedNode
from foundry.inspect.lint import Finding, LintReport
from foundry.inspect.summary import ArchiveSummary
from foundry.text import printable

KERNEL_COLUMN = 34  # the node table's kernel column at its narrowest (it widens with the terminal)


@dataclass(frozen=True)
class OpenedArchive:
    """An archive opened for the TUI, with a short label that does not depend
    on where it sits on disk (the header and snapshots show it)."""

    archive: Archive
    label: str

    @classmethod
    def open(cls, text: str | Path) -> OpenedArchive:
        """Open a path or ``@sample``; raise :class:`~foundry.errors.ArchiveError` on a bad one."""
        text = str(text)
        path = archive_path(text)
        archive = open_named(text)
        is_sample = text == SAMPLE_NAME or path.resolve() == sample_path().resolve()
        label = f"{SAMPLE_NAME} ({path.name})" if is_sample else (path.resolve().name or str(path))
        return cls(archive, printable(label))


@dataclass
class LoadedGraph:
    """One decoded graph and what the browse screen derives from it."""

    rank: int
    entry: GraphEntry
    ir: GraphIR
    claims: dict[int, KernelMatch]
    unresolved: list[int]
    rows: list[tuple[Cell, ...]] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, str]:
        return (self.rank, self.entry.name)

    @property
    def collectives(self) -> list[int]:
        return sorted(self.claims)


def load_graph(archive: Archive, registry: BackendRegistry, rank: int, entry: GraphEntry) -> LoadedGraph:
    """Read, check (size, sha256, structure) and decode one graph, then build its rows.

    Raises :class:`~foundry.errors.FoundryError` for a damaged graph; the caller shows it."""
    ir = archive.graph(rank, entry, deep=False)
    claims = classify(ir, registry)
    unresolved = sorted({o.node for o in ir.operands.unresolved()})
    loaded = LoadedGraph(rank, entry, ir, claims, unresolved)
    loaded.rows = node_table_rows(loaded)
    return loaded


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 graph``, ``3 graphs``: a count with its noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def dims(value: tuple[int, int, int]) -> str:
    """Grid or block dimensions without trailing ones: ``(128, 1, 1)`` -> ``128``."""
    parts = list(value)
    while len(parts) > 1 and parts[-1] == 1:
        parts.pop()
    return ",".join(map(str, parts))


def node_summary(node: Node) -> str:
    """One line saying what a node does: the kernel's short name, or the kind and its detail."""
    if isinstance(node, KernelNode):
        return node.kernel.short_name
    if isinstance(node, MemcpyNode):
        width, height, depth = node.extent
        return f"memcpy {node.src_type}->{node.dst_type} {width * height * depth} B"
    if isinstance(node, MemsetNode):
        return f"memset {node.value:#x} x{node.width * node.height} ({node.element_size} B)"
    if isinstance(node, UnsupportedNode):
        return f"{node.node_type} (unsupported)" + (f": {node.detail}" if node.detail else "")
    event = getattr(node, "event", None)
    return f"{node.kind} {event}" if event is not None else str(node.kind)


class Cell:
    """A node-table cell: one line of text in one style.

    DataTable measures every cell of every row it is given, through rich's
    measurement protocol, and parses plain strings as markup; a 2,000-row graph
    then spends most of its time there. The node table's columns have fixed
    widths, so its cells need no measurement: this renderable has none (the
    table takes the default) and renders as a :class:`~rich.text.Text` only
    when its row scrolls into view."""

    __slots__ = ("justify", "style", "text")

    def __init__(self, text: str, style: str = "", justify: JustifyMethod | None = None) -> None:
        self.text, self.style, self.justify = printable(text), style, justify  # archive names: escaped

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(self.text, style=self.style, justify=self.justify, no_wrap=True, overflow="ellipsis")

    def __str__(self) -> str:
        return self.text


def node_table_rows(loaded: LoadedGraph) -> list[tuple[Cell, ...]]:
    """The node table, one tuple per node in capture order (built in the worker)."""
    ir = loaded.ir
    unresolved = set(loaded.unresolved)
    counts: dict[int, int] = {}
    for row in ir.operands.rows():  # one pass over the manifest instead of a lookup per node
        counts[row[0]] = counts.get(row[0], 0) + 1
    empty = Cell("")
    rows = []
    for node in ir.nodes():
        notes = []
        claim = loaded.claims.get(node.id)
        if claim is not None:
            notes.append(claim.kind)
        if node.id in unresolved:
            notes.append("unresolved")
        if isinstance(node, UnsupportedNode):
            notes.append("unsupported")
        style = "bold red" if len(notes) > (claim is not None) else "bold cyan"
        if isinstance(node, KernelNode):
            launch = node.launch
            cells = (Cell(dims(launch.grid)), Cell(dims(launch.block)), Cell(str(launch.shared_mem), justify="right"))
        else:
            cells = (empty, empty, empty)
        pointers = counts.get(node.id, 0)
        rows.append(
            (
                Cell(str(node.id), justify="right"),
                Cell(node_summary(node)),  # cut to the column's width, with an ellipsis, when drawn
                *cells,
                Cell(str(pointers), justify="right") if pointers else empty,
                Cell(" ".join(notes), style) if notes else empty,
            )
        )
    return rows


# -- search and jumps ---------------------------------------------------------------


def kernel_matches(node: Node, query: str) -> bool:
    """Whether a node's kernel name (mangled, demangled or short) contains ``query``, ignoring case."""
    if not isinstance(node, KernelNode):
        return False
    needle = query.casefold()
    kernel = node.kernel
    return needle in kernel.name.casefold() or needle in kernel.demangled.casefold()


def search_nodes(ir: GraphIR, query: str) -> list[int]:
    """Ids of the nodes whose kernel name contains ``query``."""
    return [node.id for node in ir.nodes() if kernel_matches(node, query)]


def next_id(ids: Sequence[int], current: int | None, *, backward: bool = False, wrap: bool = True) -> int | None:
    """The first id after ``current`` (before it with ``backward``) in sorted ``ids``,
    wrapping around unless ``wrap`` is false; ``None`` when there is none."""
    if not ids:
        return None
    if current is None:
        return ids[-1] if backward else ids[0]
    if backward:
        at = bisect.bisect_left(ids, current) - 1
        if at >= 0:
            return ids[at]
        return ids[-1] if wrap else None
    at = bisect.bisect_right(ids, current)
    if at < len(ids):
        return ids[at]
    return ids[0] if wrap else None


def graphs_with(summary: ArchiveSummary, what: str) -> list[tuple[int, str]]:
    """``(rank, graph)`` of the graphs the summary says hold ``collectives`` or ``unresolved`` operands."""
    if what == "collectives":
        return [(g.rank, g.name) for g in summary.graphs if sum(g.collectives.values())]
    return [(g.rank, g.name) for g in summary.graphs if g.unresolved_count]


def next_graph(order: Sequence[tuple[int, str]], candidates: Sequence[tuple[int, str]], current: tuple[int, str]):
    """The first of ``candidates`` after ``current`` in archive ``order`` (wrapping), or ``None``."""
    if not candidates:
        return None
    position = {key: i for i, key in enumerate(order)}
    here = position.get(current, -1)
    ranked = sorted(candidates, key=lambda key: position.get(key, len(order)))
    for key in ranked:
        if position.get(key, len(order)) > here:
            return key
    return ranked[0]


GROUP_OVER = 200  # a rank with more graphs lists them in groups (vLLM saves about 2,000 a rank)
CHUNK = 100  # graphs a group holds where their names share no prefix


def graph_groups(names: Sequence[str]) -> list[tuple[str, list[int]]] | None:
    """The groups a rank's graphs are listed in, in archive order, as (label, indices into
    ``names``); ``None`` where there are few enough to list flat. Graphs group by their name
    without its last dotted part (``piecewise.t16.p3`` under ``piecewise.t16``), a group of
    more than :data:`CHUNK` in runs of that many; where that leaves too many groups, the
    graphs go in runs of :data:`CHUNK` in archive order."""
    if len(names) <= GROUP_OVER:
        return None
    by_prefix: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by_prefix.setdefault(name.rsplit(".", 1)[0], []).append(i)
    groups = [group for label, members in by_prefix.items() for group in _runs(names, members, label)]
    return groups if len(groups) <= GROUP_OVER else _runs(names, list(range(len(names))), None)


def _runs(names: Sequence[str], members: list[int], label: str | None) -> list[tuple[str, list[int]]]:
    """``members`` as one group named ``label``, or in runs of :data:`CHUNK` named by their ends."""
    if label is not None and len(members) <= CHUNK:
        return [(label, members)]
    runs = [members[start : start + CHUNK] for start in range(0, len(members), CHUNK)]
    return [(f"{names[run[0]]} .. {names[run[-1]]}", run) for run in runs]


def finding_text(finding: Finding) -> str:
    """A lint finding as one line, as ``foundry graph lint`` prints it."""
    where = f"rank {finding.rank} {finding.graph}" + (f" node {finding.node}" if finding.node is not None else "")
    return f"{finding.severity.value} {finding.rule}: {where}: {finding.message}"


def findings_for(report: LintReport | None, rank: int, graph: str, node: int | None = None) -> list[Finding]:
    """Findings of one graph, or of one node of it."""
    if report is None:
        return []
    return [f for f in report.findings if f.rank == rank and f.graph == graph and (node is None or f.node == node)]
