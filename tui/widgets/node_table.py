"""The nodes of one graph, one row per node in capture order (row index = node id)."""

from __future__ import annotations

from foundry.tui.model import KERNEL_COLUMN, LoadedGraph
from foundry.tui.widgets.row_table import RowTable
from textual import events
from textual.message import Message
from textual.widgets import DataTable

KERNEL = "kernel / detail"
#: (label, width) of each column; fixed widths keep a 2,000-row table fast to fill. The
#: kernel column's is its narrowest: it takes whatever the others leave of the table's width.
COLUMNS = (
    ("id", 4),
    (KERNEL, KERNEL_COLUMN),
    ("grid", 6),
    ("block", 6),
    ("smem", 6),
    ("ptrs", 4),
    ("note", 14),
)


def kernel_width(table_width: int, padding: int) -> int:
    """The kernel column's width in a table ``table_width`` cells wide (cells padded by ``padding``
    on each side): all that the other columns leave, and never less than :data:`KERNEL_COLUMN`."""
    others = sum(width + 2 * padding for label, width in COLUMNS if label != KERNEL)
    return max(KERNEL_COLUMN, table_width - others - 2 * padding)


class NodeTable(RowTable):
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
        super().__init__(zebra_stripes=True, **kwargs)
        self.graph: LoadedGraph | None = None

    def on_mount(self) -> None:
        for label, width in COLUMNS:
            self.add_column(label, width=width, key=label)

    def on_resize(self, event: events.Resize) -> None:
        """Widen (or narrow) the kernel column to the table's width: names are cut only where they must be."""
        column = self.columns.get(KERNEL)  # type: ignore[call-overload]
        width = kernel_width(self.scrollable_content_region.width, self.cell_padding)
        if column is not None and column.width != width:
            column.width = width
            self._require_update_dimensions = True  # DataTable re-lays its columns on its next idle
            self.refresh()

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
