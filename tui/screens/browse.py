"""Browse one archive: ranks -> graphs -> nodes, a node pane and a summary pane.

Graphs are decoded only when the cursor reaches them, in a worker; the
summary and lint passes run in another worker once the first graph is on
screen, so the two never compete while the user waits for it.
Jumps (next collective, unresolved operand, lint finding) look in the current
graph first, then use the summary to find the next graph that has one.
"""

from __future__ import annotations

from pathlib import Path

from foundry.tui.describe import describe_node
from foundry.tui.model import (
    LoadedGraph,
    OpenedArchive,
    finding_text,
    findings_for,
    graphs_with,
    load_graph,
    next_graph,
    next_id,
    search_nodes,
)
from foundry.tui.screens.export import ExportRequest, ExportScreen
from foundry.tui.widgets.archive_info import ArchiveInfo
from foundry.tui.widgets.graph_tree import GraphTree
from foundry.tui.widgets.key_footer import KeyFooter
from foundry.tui.widgets.node_pane import NodePane
from foundry.tui.widgets.node_table import NodeTable
from foundry.tui.widgets.search_bar import SearchBar
from foundry.tui.widgets.status_line import StatusLine
from foundry.tui.widgets.summary_pane import SummaryPane
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, TabbedContent, TabPane

from foundry.archive.files import atomic_write
from foundry.archive.schema import GraphEntry
from foundry.backends.registry import BackendRegistry
from foundry.errors import FoundryError
from foundry.graphir.passes.export import export
from foundry.inspect.lint import LintReport, Severity, lint
from foundry.inspect.summary import ArchiveSummary, summarize
from foundry.text import plain

JUMPS = {"collectives": "collective", "unresolved": "unresolved operand"}


class BrowseScreen(Screen):
    """Ranks and graphs on the left; the graph's nodes, and the node or summary pane, on the right."""

    HELP_TITLE = "browse"
    HELP_NOTE = (
        "Search, jumps and export act on the graph in the node table. A jump goes to the next match after "
        "the cursor, then on to the next graph that has one (once the summary is ready). Lint findings are "
        "visited in the order lint reports them."
    )

    BINDINGS = [
        Binding("slash", "search", "Search", tooltip="Search kernel names in this graph"),
        Binding("n", "search_next", "Next match", show=False, tooltip="Next search match"),
        Binding("N", "search_previous", "Previous match", show=False, tooltip="Previous search match"),
        Binding("c", "next_collective", "Collective", tooltip="Next collective kernel"),
        Binding("u", "next_unresolved", "Unresolved", tooltip="Next node with an unresolved operand"),
        Binding("l", "next_finding", "Lint", tooltip="Next lint finding"),
        Binding("e", "export", "Export", tooltip="Export this graph as GraphML or DOT"),
        Binding("s", "show_summary", "Summary", tooltip="Summary pane: histogram, collectives, regions, lint"),
        Binding("d", "show_node", "Node pane", show=False, tooltip="Node pane: the node under the cursor"),
        Binding("escape", "back", "Back", show=False, tooltip="Back to the previous pane"),
    ]

    class GraphLoaded(Message):
        """A graph has been decoded (posted by the loading worker)."""

        def __init__(self, loaded: LoadedGraph) -> None:
            super().__init__()
            self.loaded = loaded

    class GraphFailed(Message):
        """A graph could not be read (damaged, altered, unreadable)."""

        def __init__(self, rank: int, name: str, error: str) -> None:
            super().__init__()
            self.rank, self.name, self.error = rank, name, error

    class SummaryReady(Message):
        """The summary pass is done (posted by the summary worker)."""

        def __init__(self, summary: ArchiveSummary) -> None:
            super().__init__()
            self.summary = summary

    class LintReady(Message):
        """The lint pass is done (posted by the summary worker after the summary)."""

        def __init__(self, report: LintReport) -> None:
            super().__init__()
            self.report = report

    class SummaryFailed(Message):
        """The summary or the lint pass (``what``) failed, typically on a damaged graph."""

        def __init__(self, what: str, error: str) -> None:
            super().__init__()
            self.what, self.error = what, error

    class Exported(Message):
        """The export worker wrote ``path``, or failed with ``error``."""

        def __init__(self, path: Path | None, error: str | None = None) -> None:
            super().__init__()
            self.path, self.error = path, error

    def __init__(self, opened: OpenedArchive, registry: BackendRegistry) -> None:
        super().__init__()
        self.opened = opened
        self.archive = opened.archive
        self.registry = registry
        self.loaded: LoadedGraph | None = None
        self.wanted: tuple[int, str] | None = None
        self.summary: ArchiveSummary | None = None
        self.lint: LintReport | None = None
        self.query_text: str | None = None
        self.matches: list[int] = []
        self.finding_index = -1
        self._pending: int | str | None = None  # a node id, or "collectives"/"unresolved": where to go once loaded
        self._summary_started = False
        self._enter_when_loaded: tuple[int, str] | None = None  # Enter on a graph whose nodes were loading

    # -- layout -------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="browse"):
            with Vertical(id="sidebar"):
                yield GraphTree(self.archive, id="graphs")
                yield ArchiveInfo(self.archive.catalog, id="archive-info")
            with Vertical(id="main"):
                yield NodeTable(id="nodes")
                with TabbedContent(id="details", initial="node-tab"):
                    with TabPane("Node", id="node-tab"):
                        yield NodePane(id="node")
                    with TabPane("Summary", id="summary-tab"):
                        yield SummaryPane(id="summary")
        yield SearchBar(id="search")
        yield StatusLine(id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.sub_title = self.opened.label
        self.query_one("#graphs").border_title = "Graphs"
        self.query_one("#archive-info").border_title = "Archive"
        self.query_one("#nodes").border_title = "Nodes"
        self.query_one(NodePane).show_message("Choose a graph on the left, then a node.")
        self.query_one(GraphTree).focus()
        self.status.hint("enter opens · / searches kernel names · c u l jump · ? shows every key")
        self.call_after_refresh(self._painted)

    def _painted(self) -> None:
        self.app.mark("first_paint")
        # summary and lint read every graph: start them once the first graph is on screen (so the
        # two workers do not share the interpreter while the user waits), or after a second anyway
        if self.graph_tree.has_graphs:
            self.set_timer(1.0, self._start_summary)
        else:
            self._start_summary()

    def _start_summary(self) -> None:
        if not self._summary_started:
            self._summary_started = True
            self._summarize()

    # -- widgets by role --------------------------------------------------------------

    @property
    def graph_tree(self) -> GraphTree:
        return self.query_one(GraphTree)

    @property
    def node_table(self) -> NodeTable:
        return self.query_one(NodeTable)

    @property
    def node_pane(self) -> NodePane:
        return self.query_one(NodePane)

    @property
    def status(self) -> StatusLine:
        return self.query_one(StatusLine)

    # -- graphs -------------------------------------------------------------------------

    def on_graph_tree_graph_chosen(self, message: GraphTree.GraphChosen) -> None:
        key = (message.rank, message.entry.name)
        if message.opened and self.loaded is not None and self.loaded.key == key:
            self.node_table.focus()
            return
        if key != self.wanted:
            self._open_graph(message.rank, message.entry)
        if message.opened:
            self._enter_when_loaded = key  # a table still loading takes no focus: it moves once loaded
            self.node_table.focus()

    def _open_graph(self, rank: int, entry: GraphEntry) -> None:
        self.wanted = (rank, entry.name)
        self.matches = []
        table = self.node_table
        table.border_title = plain(f"Nodes · rank {rank} {entry.name}")
        table.border_subtitle = "loading..."
        table.loading = True
        self._load(rank, entry)

    @work(thread=True, exclusive=True, group="graph")
    def _load(self, rank: int, entry: GraphEntry) -> None:
        try:
            loaded = load_graph(self.archive, self.registry, rank, entry)
        except FoundryError as err:
            self.post_message(self.GraphFailed(rank, entry.name, str(err)))
        except Exception as err:  # noqa: BLE001 - shown in the pane: the TUI must not die on a bad graph
            self.post_message(self.GraphFailed(rank, entry.name, f"internal error: {type(err).__name__}: {err}"))
        else:
            self.post_message(self.GraphLoaded(loaded))

    def on_browse_screen_graph_loaded(self, message: BrowseScreen.GraphLoaded) -> None:
        loaded = message.loaded
        if loaded.key != self.wanted:
            return  # the cursor moved on while this one was decoding
        self.loaded = loaded
        table = self.node_table
        table.loading = False
        cursor = self._resolve_pending(loaded)
        table.show(loaded, cursor=cursor if cursor is not None else 0)
        edges = loaded.ir.edge_count()
        table.border_subtitle = f"{len(loaded.ir)} nodes · {edges} edges"
        if self._enter_when_loaded == loaded.key:
            table.focus()
        self._enter_when_loaded = None
        self._show_node(table.node_id)
        self.app.mark("first_graph")
        self.call_after_refresh(self._start_summary)

    def on_browse_screen_graph_failed(self, message: BrowseScreen.GraphFailed) -> None:
        if (message.rank, message.name) != self.wanted:
            return
        self.loaded = None
        self._pending = None
        table = self.node_table
        table.loading = False
        table.empty()
        table.border_subtitle = "unreadable"
        self.query_one(TabbedContent).active = "node-tab"
        self.node_pane.show_error(f"Cannot read graph {message.name!r} of rank {message.rank}", message.error)
        self.status.say(f"graph {message.name} cannot be read", style="red")
        self._start_summary()

    def _resolve_pending(self, loaded: LoadedGraph) -> int | None:
        pending, self._pending = self._pending, None
        if isinstance(pending, int):
            return pending if pending < len(loaded.ir) else None
        if pending == "collectives":
            return loaded.collectives[0] if loaded.collectives else None
        if pending == "unresolved":
            return loaded.unresolved[0] if loaded.unresolved else None
        return None

    def _go(self, rank: int, name: str, node: int | str | None) -> None:
        """Show graph ``(rank, name)`` with the cursor on ``node`` (an id, or the first jump target of a kind)."""
        if self.loaded is not None and self.loaded.key == (rank, name):
            target = node
            if isinstance(node, str):
                self._pending = node
                target = self._resolve_pending(self.loaded)
            if isinstance(target, int):
                self.node_table.go_to(target)
            return
        self._pending = node
        if not self.graph_tree.show_graph(rank, name):
            self._pending = None
            self.status.say(f"rank {rank} has no graph {name}", style="red")

    # -- nodes ----------------------------------------------------------------------------

    def on_node_table_node_highlighted(self, message: NodeTable.NodeHighlighted) -> None:
        self._show_node(message.node_id)

    def on_node_table_node_opened(self, message: NodeTable.NodeOpened) -> None:
        self._show_node(message.node_id)
        self.query_one(TabbedContent).active = "node-tab"
        self.node_pane.focus()

    def _show_node(self, node_id: int | None) -> None:
        loaded = self.loaded
        if loaded is None or node_id is None or node_id not in loaded.ir:
            return
        node = loaded.ir.node(node_id)
        findings = findings_for(self.lint, loaded.rank, loaded.entry.name, node_id)
        renderable = describe_node(
            loaded.ir, node, rank=loaded.rank, claim=loaded.claims.get(node_id), findings=findings
        )
        self.node_pane.show_node(node_id, renderable)

    # -- summary and lint (worker) -----------------------------------------------------------

    @work(thread=True, exclusive=True, group="summary")
    def _summarize(self) -> None:
        for what, run, ready in (("summary", summarize, self.SummaryReady), ("lint", lint, self.LintReady)):
            try:
                self.post_message(ready(run(self.archive, self.registry)))
            except FoundryError as err:
                self.post_message(self.SummaryFailed(what, str(err)))
            except Exception as err:  # noqa: BLE001 - shown in the pane, never a crash
                self.post_message(self.SummaryFailed(what, f"internal error: {type(err).__name__}: {err}"))

    def on_browse_screen_summary_ready(self, message: BrowseScreen.SummaryReady) -> None:
        self.summary = message.summary
        self.query_one(SummaryPane).show_summary(message.summary)

    def on_browse_screen_lint_ready(self, message: BrowseScreen.LintReady) -> None:
        self.lint = message.report
        self.query_one(SummaryPane).show_lint(message.report)
        errors, warnings = message.report.count(Severity.ERROR), message.report.count(Severity.WARNING)
        self.status.hint(f"lint: {errors} error(s), {warnings} warning(s) (l visits them, s shows the summary)")
        self._show_node(self.node_table.node_id)  # the node pane lists the node's findings

    def on_browse_screen_summary_failed(self, message: BrowseScreen.SummaryFailed) -> None:
        self.query_one(SummaryPane).show_error(message.what, message.error)

    # -- actions: panes ----------------------------------------------------------------------

    def action_show_summary(self) -> None:
        self.query_one(TabbedContent).active = "summary-tab"

    def action_show_node(self) -> None:
        self.query_one(TabbedContent).active = "node-tab"

    def action_back(self) -> None:
        focused = self.focused
        if isinstance(focused, NodePane | SummaryPane):
            self.node_table.focus()
        elif isinstance(focused, NodeTable):
            self.graph_tree.focus()

    # -- actions: search ---------------------------------------------------------------------

    def action_search(self) -> None:
        self.query_one(SearchBar).open()

    def on_search_bar_closed(self, message: SearchBar.Closed) -> None:
        self.node_table.focus()

    def on_search_bar_search(self, message: SearchBar.Search) -> None:
        self.node_table.focus()
        loaded = self.loaded
        if loaded is None:
            self.status.say("no graph is open to search", style="yellow")
            return
        self.query_text = message.query
        self.matches = search_nodes(loaded.ir, message.query)
        if not self.matches:
            self.status.say(f"no kernel in {loaded.entry.name} matches {message.query!r}", style="yellow")
            return
        current = self.node_table.node_id
        start = None if current is None else current - 1  # a match on the cursor's own row counts
        self._to_match(next_id(self.matches, start))

    def _to_match(self, node_id: int | None) -> None:
        if node_id is None:
            return
        self.node_table.go_to(node_id)
        index = self.matches.index(node_id) + 1
        self.status.say(f"{self.query_text!r}: match {index} of {len(self.matches)} (node {node_id}; n/N for more)")

    def _search_step(self, backward: bool) -> None:
        loaded = self.loaded
        if self.query_text is None:
            self.status.say("no search yet: press / to search kernel names", style="yellow")
            return
        if not self.matches and loaded is not None:  # another graph since the search: look in this one
            self.matches = search_nodes(loaded.ir, self.query_text)
        if not self.matches:
            where = loaded.entry.name if loaded is not None else "this graph"
            self.status.say(f"no kernel in {where} matches {self.query_text!r} (/ searches again)", style="yellow")
            return
        self._to_match(next_id(self.matches, self.node_table.node_id, backward=backward))

    def action_search_next(self) -> None:
        self._search_step(False)

    def action_search_previous(self) -> None:
        self._search_step(True)

    # -- actions: jumps ----------------------------------------------------------------------

    def action_next_collective(self) -> None:
        self._jump("collectives")

    def action_next_unresolved(self) -> None:
        self._jump("unresolved")

    def _jump(self, what: str) -> None:
        label = JUMPS[what]
        loaded = self.loaded
        if loaded is None:
            self.status.say("no graph is open", style="yellow")
            return
        here = loaded.collectives if what == "collectives" else loaded.unresolved
        found = next_id(here, self.node_table.node_id, wrap=False)
        if found is not None:
            self.node_table.go_to(found)
            self.status.say(f"{label} at node {found} of {loaded.entry.name} ({here.index(found) + 1}/{len(here)})")
            return
        if self.summary is None:
            if here:
                self.node_table.go_to(here[0])
                self.status.say(f"{label} at node {here[0]} (wrapped; other graphs once the summary is ready)")
            else:
                self.status.say(f"no {label} in {loaded.entry.name}; the summary is still running", style="yellow")
            return
        target = next_graph(self.graph_tree.order(), graphs_with(self.summary, what), loaded.key)
        if target is None:
            self.status.say(f"no {label} in this archive", style="yellow")
        elif target == loaded.key:
            self.node_table.go_to(here[0])
            self.status.say(f"{label} at node {here[0]} of {loaded.entry.name} (wrapped)")
        else:
            self.status.say(f"{label}: rank {target[0]} {target[1]}")
            self._go(target[0], target[1], what)

    def action_next_finding(self) -> None:
        report = self.lint
        if report is None:
            self.status.say("lint is still running", style="yellow")
            return
        if not report.findings:
            self.status.say("lint found nothing", style="green")
            return
        self.finding_index = (self.finding_index + 1) % len(report.findings)
        finding = report.findings[self.finding_index]
        style = "red" if finding.severity.value == "error" else "yellow"
        self.status.say(f"lint {self.finding_index + 1}/{len(report.findings)}: {finding_text(finding)}", style=style)
        if finding.rank is not None and finding.graph is not None:
            self._go(finding.rank, finding.graph, finding.node)

    # -- actions: export ---------------------------------------------------------------------

    def action_export(self) -> None:
        loaded = self.loaded
        if loaded is None:
            self.status.say("no graph is open to export", style="yellow")
            return
        stem = loaded.entry.name if loaded.rank == 0 else f"rank{loaded.rank}.{loaded.entry.name}"
        self.app.push_screen(ExportScreen(stem, Path.cwd()), self._export_chosen)

    def _export_chosen(self, request: ExportRequest | None) -> None:
        if request is not None and self.loaded is not None:
            self._export(self.loaded, request)

    @work(thread=True, group="export")
    def _export(self, loaded: LoadedGraph, request: ExportRequest) -> None:
        try:
            atomic_write(request.path, export(loaded.ir, request.format).encode())
        except OSError as err:
            self.post_message(self.Exported(None, f"cannot write {request.path}: {err.strerror or err}"))
        except Exception as err:  # noqa: BLE001 - reported, never a crash
            self.post_message(self.Exported(None, f"export failed: {type(err).__name__}: {err}"))
        else:
            self.post_message(self.Exported(request.path))

    def on_browse_screen_exported(self, message: BrowseScreen.Exported) -> None:
        if message.error:
            self.status.say(message.error, style="red")
            self.notify(message.error, severity="error", markup=False)
        else:
            self.status.say(f"wrote {message.path}", style="green")
            self.notify(f"wrote {message.path}", title="Export", markup=False)
