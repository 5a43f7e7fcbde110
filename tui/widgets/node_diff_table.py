"""The differing nodes of a changed graph, aligned: A's node beside B's, and
the fields that differ; edges only one side has follow the nodes."""

from __future__ import annotations

from foundry.tui.describe import change_key
from foundry.tui.widgets.row_table import RowTable
from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from foundry.graphir.passes.diff import EdgeChange, GraphDiff, NodeDiff, Status
from foundry.text import plain

MARKS = {Status.CHANGED: ("~", "bold yellow"), Status.ONLY_A: ("-", "bold red"), Status.ONLY_B: ("+", "bold green")}


def changed_fields(node: NodeDiff) -> str:
    """The rows of the side-by-side view that differ (``param[3], grid``)."""
    if node.status is Status.ONLY_A:
        return "only in A"
    if node.status is Status.ONLY_B:
        return "only in B"
    keys: list[str] = []
    for change in node.changes:
        key = change_key(change)
        if key not in keys:
            keys.append(key)
    return ", ".join(keys)


class NodeDiffTable(RowTable):
    """Rows are :class:`~foundry.graphir.passes.diff.NodeDiff` items, then edges of
    another kind in B, then edges only in A or B; posts :class:`NodeDiffTable.NodeDiffHighlighted`."""

    class NodeDiffHighlighted(Message):
        """The cursor is on a node diff (``node``) or on an edge row (``node`` is ``None``)."""

        def __init__(self, node: NodeDiff | None) -> None:
            super().__init__()
            self.node = node

    class NodeDiffOpened(Message):
        """A row was selected (enter or click); ``node`` is ``None`` for an edge row."""

        def __init__(self, node: NodeDiff | None) -> None:
            super().__init__()
            self.node = node

    def __init__(self, **kwargs) -> None:
        super().__init__(zebra_stripes=True, **kwargs)
        self.items: list[NodeDiff | EdgeChange | tuple[str, int, int]] = []

    def on_mount(self) -> None:
        self.add_column("", width=1, key="mark")
        self.add_column("A", width=5, key="a")
        self.add_column("B", width=5, key="b")
        self.add_column("node", width=34, key="label")
        self.add_column("differs in", key="fields")

    def show(self, graph: GraphDiff | None) -> None:
        self.clear()
        self.items = []
        if graph is None:
            return
        for node in graph.nodes:
            mark, style = MARKS[node.status]
            self.items.append(node)
            self.add_row(
                Text(mark, style=style),
                Text("-" if node.a is None else str(node.a), justify="right"),
                Text("-" if node.b is None else str(node.b), justify="right"),
                plain(node.label),
                plain(changed_fields(node), style="yellow" if node.status is Status.CHANGED else style),
            )
        for change in graph.edges_changed:
            self.items.append(change)
            kinds = plain(f"{change.kind_a} -> {change.kind_b}", "yellow")
            ends = [Text(f"{src}->{dst}", justify="right") for src, dst in (change.a, change.b)]
            self.add_row(Text("~", style="yellow"), *ends, "edge", kinds)
        for side, edges, style in (("A", graph.edges_only_a, "red"), ("B", graph.edges_only_b, "green")):
            for src, dst in edges:
                self.items.append((side, src, dst))
                mark = "-" if side == "A" else "+"
                self.add_row(Text(mark, style=style), "", "", f"edge {src} -> {dst}", Text(f"only in {side}", style))

    def current(self) -> NodeDiff | None:
        if not self.items or not self.row_count:
            return None
        item = self.items[self.cursor_row]
        return item if isinstance(item, NodeDiff) else None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self.items):
            item = self.items[event.cursor_row]
            self.post_message(self.NodeDiffHighlighted(item if isinstance(item, NodeDiff) else None))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self.items):
            item = self.items[event.cursor_row]
            self.post_message(self.NodeDiffOpened(item if isinstance(item, NodeDiff) else None))
