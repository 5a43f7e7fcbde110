"""Where the two archives' environments and catalogs differ (GPU, driver, CUDA, torch, model)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from foundry.graphir.passes.diff import FieldChange
from foundry.text import plain


def changes_view(changes: list[FieldChange]) -> RenderableType:
    """Each differing field on a line of its own, whole, and its two values below it, each
    wrapped within its own column: a narrow pane never cuts a field's name in two."""
    parts: list[RenderableType] = []
    for c in changes:
        values = Table.grid(padding=(0, 1))
        values.add_column(no_wrap=True)
        values.add_column(overflow="fold")
        values.add_row(Text("A", style="bold"), plain(c.a, style="red"))
        values.add_row(Text("B", style="bold"), plain(c.b, style="green"))
        parts += [plain(c.field.removeprefix("environment."), style="bold"), Padding(values, (0, 0, 0, 2))]
    return Group(*parts)


class EnvironmentDiff(VerticalScroll, can_focus=True):
    """The environment part of an :class:`~foundry.inspect.archive_diff.ArchiveDiff`, scrolled when long."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.changes: list[FieldChange] = []
        self.shown: RenderableType = Text("comparing...", style="dim")

    def compose(self):
        yield Static(self.shown, id="env-body")

    @property
    def content(self) -> RenderableType:
        """What the pane shows (as :attr:`textual.widgets.Static.content` would say)."""
        return self.shown

    def show(self, changes: list[FieldChange]) -> None:
        self.changes = list(changes)
        self.shown = changes_view(self.changes) if changes else Text("environment and catalog match", style="green")
        self.query_one("#env-body", Static).update(self.shown)
