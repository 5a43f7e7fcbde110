"""Where the two archives' environments and catalogs differ (GPU, driver, CUDA, torch, model)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from foundry.graphir.passes.diff import FieldChange
from foundry.text import plain


class EnvironmentDiff(Static):
    """The environment part of an :class:`~foundry.inspect.archive_diff.ArchiveDiff`."""

    def __init__(self, **kwargs) -> None:
        super().__init__(Text("comparing...", style="dim"), **kwargs)
        self.changes: list[FieldChange] = []

    def show(self, changes: list[FieldChange]) -> None:
        self.changes = list(changes)
        if not changes:
            self.update(Text("environment and catalog match", style="green"))
            return
        table = Table(box=None, header_style="bold", padding=(0, 1), expand=True)
        table.add_column("field", overflow="fold")
        table.add_column("A", overflow="fold", style="red")
        table.add_column("B", overflow="fold", style="green")
        for c in changes:
            table.add_row(plain(c.field.removeprefix("environment.")), plain(c.a), plain(c.b))
        self.update(table)
