"""The nodes of one graph, one row per node in capture order (row index = node id)."""

from __future__ import annotations

from foundry.tui.model import KERNEL_COLUMN, LoadedGraph
from textual.message import Message
from textual.widgets import DataTable

#: (label, width) of each column; fixed widths keep a 2,000-row table fast to fill.
COLUMNS = (
    ("id", 4),
    ("kernel / detail", KERNEL_COLUMN),
    ("grid", 6),
    ("block", 6),
    ("smem", 6),
    ("ptrs", 4),
    ("note", 14),
)


class NodeTable(DataTable):
    """Posts :class:`NodeTable.NodeHighlighted` as the cursor moves and
    :class:`NodeTable.NodeOpened` on enter or click."""

    class NodeHighlighted(Message):
        """The cursor is on node ``node_id``."""

        def __init__(self, node_id: int) -> None:
            super().__init__()
            self.node_id = node_id

    class NodeOpened(Message):
        """Node ``node_id`` was selected (enter or click)."""

        def __init__(self, node_id: int) -> None:
            super().__init__()
            self.node_id = node_id

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.graph: LoadedGraph | None = None

    def on_mount(self) -> None:
        for label, width in COLUMNS:
            self.add_column(label, width=width, key=label)

    def show(self, loaded: LoadedGraph, *, cursor: int = 0) -> None:
        """Fill the table with a loaded graph's rows and put the cursor on ``cursor``."""
        self.graph = loaded
        self.clear()
        self.add_rows(loaded.rows)
        if loaded.rows:
            self.move_cursor(row=min(cursor, len(loaded.rows) - 1), scroll=True)

    def empty(self) -> None:
        self.graph = None
        self.clear()

    @property
    def node_id(self) -> int | None:
        """The node under the cursor."""
        if self.graph is None or not self.row_count:
            return None
        return self.cursor_row

    def go_to(self, node_id: int) -> None:
        self.move_cursor(row=node_id, scroll=True)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self.graph is not None:
            self.post_message(self.NodeHighlighted(event.cursor_row))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if self.graph is not None:
            self.post_message(self.NodeOpened(event.cursor_row))
