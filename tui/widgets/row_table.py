"""A table whose cursor is a row: Home and End go to the first and the last row.

Textual's DataTable binds Home and End to its leftmost and rightmost column, which
a row cursor never leaves, so in a row table they would do nothing.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import DataTable


class RowTable(DataTable):
    """A DataTable with a row cursor; Home and End move it to the first and last row."""

    BINDINGS = [
        Binding("home", "first_row", "First row", show=False),
        Binding("end", "last_row", "Last row", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", **kwargs)

    def action_first_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=0, scroll=True)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1, scroll=True)
