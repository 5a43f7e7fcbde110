"""The graphs of two archives with their diff status (same, changed, only in A, only in B)."""

from __future__ import annotations

from foundry.tui.widgets.row_table import RowTable
from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from foundry.graphir.passes.diff import GraphDiff, Status
from foundry.inspect.archive_diff import ArchiveDiff
from foundry.text import plain

STATUS_TEXT = {
    Status.SAME: ("same", "dim"),
    Status.CHANGED: ("changed", "bold yellow"),
    Status.ONLY_A: ("only in A", "bold red"),
    Status.ONLY_B: ("only in B", "bold green"),
}


def status_text(status: Status) -> Text:
    text, style = STATUS_TEXT[status]
    return Text(text, style=style)


class GraphDiffList(RowTable):
    """One row per graph of either archive; posts :class:`GraphDiffList.GraphHighlighted`
    as the cursor moves and :class:`GraphDiffList.GraphOpened` on enter or click."""

    class GraphHighlighted(Message):
        """The cursor is on ``graph``."""

        def __init__(self, graph: GraphDiff) -> None:
            super().__init__()
            self.graph = graph

    class GraphOpened(Message):
        """``graph`` was selected (enter or click)."""

        def __init__(self, graph: GraphDiff) -> None:
            super().__init__()
            self.graph = graph

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.graphs: list[GraphDiff] = []

    def on_mount(self) -> None:
        self.add_column("status", width=9, key="status")
        self.add_column("graph", width=15, key="graph")
        self.add_column("nodes", width=5, key="nodes")

    def show(self, diff: ArchiveDiff) -> None:
        """One row per graph; ``rank:`` prefixes the name when either archive has several ranks."""
        self.graphs = list(diff.graphs)
        self.clear()
        ranked = any(g.rank for g in self.graphs)
        for g in self.graphs:
            nodes = str(len(g.nodes)) if g.status is Status.CHANGED else ""
            name = f"{g.rank}:{g.name}" if ranked else g.name
            self.add_row(status_text(g.status), plain(name), Text(nodes, justify="right"))

    @property
    def current(self) -> GraphDiff | None:
        if not self.graphs or not self.row_count:
            return None
        return self.graphs[self.cursor_row]

    def go_to(self, index: int) -> None:
        self.move_cursor(row=index, scroll=True)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self.graphs):
            self.post_message(self.GraphHighlighted(self.graphs[event.cursor_row]))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self.graphs):
            self.post_message(self.GraphOpened(self.graphs[event.cursor_row]))
