"""Diff two archives: graphs with their status, the differing nodes of a
changed graph aligned side by side, and the environment diff.

The diff itself is :func:`foundry.inspect.archive_diff.diff_archives`, run in a
worker; this screen only renders it. To lay whole nodes side by side it also
decodes the two versions of the graph under the cursor (another worker).
"""

from __future__ import annotations

from foundry.tui.model import OpenedArchive, counted, next_id
from foundry.tui.widgets.environment_diff import EnvironmentDiff
from foundry.tui.widgets.graph_diff_list import STATUS_TEXT, GraphDiffList
from foundry.tui.widgets.key_footer import KeyFooter
from foundry.tui.widgets.node_compare import NodeCompare
from foundry.tui.widgets.node_diff_table import NodeDiffTable
from foundry.tui.widgets.status_line import StatusLine
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header

from foundry.errors import FoundryError
from foundry.graphir.graph import GraphIR
from foundry.graphir.passes.diff import FieldChange, GraphDiff, NodeDiff, Status
from foundry.inspect.archive_diff import ArchiveDiff, diff_archives
from foundry.text import plain


class DiffScreen(Screen):
    """Graphs and the environment diff on the left; node diffs and the side-by-side view on the right."""

    HELP_TITLE = "diff"
    HELP_NOTE = (
        "Graphs are compared by fingerprint; a changed graph's nodes are aligned by kernel, and only the "
        "nodes that differ are listed. The side-by-side view marks the fields the diff pass reports "
        "(kernel, launch config, scalar bytes, operand region/offset) with ≠."
    )

    BINDINGS = [
        Binding("n", "next_changed", "Next change", tooltip="Next graph that differs"),
        Binding("N", "previous_changed", "Previous change", tooltip="Previous graph that differs"),
        Binding("escape", "back", "Back", show=False),
    ]

    class DiffReady(Message):
        """The diff pass is done (posted by the diff worker)."""

        def __init__(self, diff: ArchiveDiff) -> None:
            super().__init__()
            self.diff = diff

    class DiffFailed(Message):
        """The archives could not be compared (a damaged graph, say)."""

        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    class PairLoaded(Message):
        """Both versions of one graph, decoded for the side-by-side view (``None`` where unreadable)."""

        def __init__(self, key: tuple[int, str], a: GraphIR | None, b: GraphIR | None, error: str | None) -> None:
            super().__init__()
            self.key, self.a, self.b, self.error = key, a, b, error

    def __init__(self, a: OpenedArchive, b: OpenedArchive) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.diff: ArchiveDiff | None = None
        self.graph: GraphDiff | None = None
        self.pair: tuple[tuple[int, str], GraphIR | None, GraphIR | None] | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="diff"):
            with Vertical(id="diff-side"):
                yield GraphDiffList(id="diff-graphs")
                yield EnvironmentDiff(id="diff-env")
            with Vertical(id="diff-main"):
                yield NodeDiffTable(id="diff-nodes")
                yield NodeCompare(id="diff-compare")
        yield StatusLine(id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.sub_title = f"A {self.a.label}  vs  B {self.b.label}"
        graphs = self.query_one(GraphDiffList)
        graphs.border_title = "Graphs"
        graphs.loading = True
        self.query_one(EnvironmentDiff).border_title = "Environment"
        self.query_one(NodeDiffTable).border_title = "Nodes that differ"
        self.query_one(NodeCompare).border_title = "Side by side"
        self.query_one(NodeCompare).show_message("Choose a changed graph, then a node.")
        graphs.focus()
        self.call_after_refresh(self.app.mark, "first_paint")
        self._diff()

    # -- the diff (worker) ------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="diff")
    def _diff(self) -> None:
        try:
            self.post_message(self.DiffReady(diff_archives(self.a.archive, self.b.archive)))
        except FoundryError as err:
            self.post_message(self.DiffFailed(str(err)))
        except Exception as err:  # noqa: BLE001 - shown on screen, never a crash
            self.post_message(self.DiffFailed(f"internal error: {type(err).__name__}: {err}"))

    def on_diff_screen_diff_ready(self, message: DiffScreen.DiffReady) -> None:
        diff = self.diff = message.diff
        graphs = self.query_one(GraphDiffList)
        graphs.loading = False
        graphs.show(diff)
        entries = [FieldChange(f"rank {rank} {name}: {c.field}", c.a, c.b) for rank, name, c in diff.entries]
        self.query_one(EnvironmentDiff).show([*diff.environment, *entries])
        counts = {s: sum(g.status is s for g in diff.graphs) for s in Status}
        summary = ", ".join(f"{n} {STATUS_TEXT[s][0]}" for s, n in counts.items())
        env = counted(len(diff.environment), "environment difference") if diff.environment else "environment matches"
        if entries:
            env += "; " + counted(len(entries), "graph entry difference")
        verdict = "identical" if diff.identical else "archives differ"
        rebuilt = (
            f"; {len(diff.rebuilt_kernels)} kernel(s) rebuilt from the same source" if diff.rebuilt_kernels else ""
        )
        self.query_one(StatusLine).say(f"{verdict}: {len(diff.graphs)} graphs ({summary}); {env}{rebuilt}")
        first = next((i for i, g in enumerate(diff.graphs) if g.status is not Status.SAME), 0)
        if diff.graphs:
            graphs.go_to(first)
            self._show_graph(diff.graphs[first])
        self.app.mark("first_graph")

    def on_diff_screen_diff_failed(self, message: DiffScreen.DiffFailed) -> None:
        self.query_one(GraphDiffList).loading = False
        self.query_one(EnvironmentDiff).show([])
        self.query_one(NodeCompare).show_message(f"The archives cannot be compared:\n\n{message.error}", style="red")
        self.query_one(StatusLine).say("diff failed", style="red")

    # -- graphs --------------------------------------------------------------------------------

    def on_graph_diff_list_graph_highlighted(self, message: GraphDiffList.GraphHighlighted) -> None:
        self._show_graph(message.graph)

    def on_graph_diff_list_graph_opened(self, message: GraphDiffList.GraphOpened) -> None:
        self._show_graph(message.graph)
        table = self.query_one(NodeDiffTable)
        if table.row_count:
            table.focus()

    def _show_graph(self, graph: GraphDiff) -> None:
        if self.graph is graph:
            return
        self.graph = graph
        table = self.query_one(NodeDiffTable)
        compare = self.query_one(NodeCompare)
        table.border_title = plain(f"Nodes that differ · rank {graph.rank} {graph.name}")
        if graph.status is Status.CHANGED:
            table.show(graph)
            unlisted = graph.nodes_not_listed + graph.edges_not_listed
            table.border_subtitle = differing(graph.node_count, graph.edge_count) + (
                f" ({unlisted} past what a diff lists)" if unlisted else ""
            )
            self._load_pair(graph.rank, graph.name)
            node = table.current()
            if node is not None:
                compare.show(node, *self._irs(graph))
            else:
                compare.show_message("only edges differ")
            return
        table.show(None)
        table.border_subtitle = ""
        if graph.status is Status.SAME:
            compare.show_message(f"The graph is the same in A and B (fingerprint {graph.fingerprint_a}).")
        else:
            side = "A" if graph.status is Status.ONLY_A else "B"
            compare.show_message(f"The graph is only in {side}.")

    def _irs(self, graph: GraphDiff) -> tuple[GraphIR | None, GraphIR | None]:
        if self.pair is not None and self.pair[0] == (graph.rank, graph.name):
            return self.pair[1], self.pair[2]
        return None, None

    @work(thread=True, exclusive=True, group="pair")
    def _load_pair(self, rank: int, name: str) -> None:
        irs: list[GraphIR | None] = []
        errors = []
        for opened in (self.a, self.b):
            try:
                irs.append(opened.archive.graph(rank, name, deep=False))
            except FoundryError as err:
                irs.append(None)
                errors.append(str(err))
        self.post_message(self.PairLoaded((rank, name), irs[0], irs[1], "; ".join(errors) or None))

    def on_diff_screen_pair_loaded(self, message: DiffScreen.PairLoaded) -> None:
        self.pair = (message.key, message.a, message.b)
        if message.error:
            self.query_one(StatusLine).say(message.error, style="red")
        graph = self.graph
        if graph is None or (graph.rank, graph.name) != message.key:
            return
        node = self.query_one(NodeDiffTable).current()
        if node is not None:
            self.query_one(NodeCompare).show(node, message.a, message.b)

    # -- nodes -----------------------------------------------------------------------------------

    def on_node_diff_table_node_diff_highlighted(self, message: NodeDiffTable.NodeDiffHighlighted) -> None:
        self._show_node(message.node)

    def on_node_diff_table_node_diff_opened(self, message: NodeDiffTable.NodeDiffOpened) -> None:
        self._show_node(message.node)
        self.query_one(NodeCompare).focus()

    def _show_node(self, node: NodeDiff | None) -> None:
        compare = self.query_one(NodeCompare)
        if node is None:
            compare.show_message("An edge: of another kind in B (~), or only in one archive (- A, + B).")
        elif self.graph is not None:
            compare.show(node, *self._irs(self.graph))

    # -- actions -----------------------------------------------------------------------------------

    def _step(self, backward: bool) -> None:
        if self.diff is None:
            return
        changed = [i for i, g in enumerate(self.diff.graphs) if g.status is not Status.SAME]
        graphs = self.query_one(GraphDiffList)
        target = next_id(changed, graphs.cursor_row if graphs.row_count else None, backward=backward)
        if target is None:
            self.query_one(StatusLine).say("no graph differs", style="green")
            return
        graphs.go_to(target)
        g = self.diff.graphs[target]
        self.query_one(StatusLine).say(f"rank {g.rank} {g.name}: {STATUS_TEXT[g.status][0]}")

    def action_next_changed(self) -> None:
        self._step(False)

    def action_previous_changed(self) -> None:
        self._step(True)

    def action_back(self) -> None:
        focused = self.focused
        if isinstance(focused, NodeCompare):
            self.query_one(NodeDiffTable).focus()
        elif isinstance(focused, NodeDiffTable):
            self.query_one(GraphDiffList).focus()


def differing(nodes: int, edges: int) -> str:
    """What the node-diff table's subtitle counts: nodes that differ, edges that differ (of
    another kind, or in one archive only)."""
    return f"{counted(nodes, 'node')} {_differ(nodes)} · {counted(edges, 'edge')} {_differ(edges)}"


def _differ(count: int) -> str:
    return "differs" if count == 1 else "differ"
