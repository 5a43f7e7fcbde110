"""The help screen: every key of the screen below it, and the app's own."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

#: Keys the screens get from their widgets (tree, tables, tabs), listed for completeness.
WIDGET_KEYS = (
    ("↑ ↓ pgup pgdn home end", "move in the focused list or table"),
    ("enter", "open the graph or node under the cursor"),
    ("tab / shift+tab", "next / previous pane"),
    ("mouse", "click to choose, wheel to scroll, click a key in the footer"),
)


def _bindings(bindings: list[BindingType]) -> list[Binding]:
    out = []
    for binding in bindings:
        if isinstance(binding, Binding):
            out.append(binding)
        elif isinstance(binding, tuple):
            out.append(Binding(*binding))
    return out


def key_rows(screen: Screen, app_bindings: list[BindingType]) -> list[tuple[str, str]]:
    """``(key, what it does)`` for a screen's bindings, then the widgets' and the app's."""
    rows = []
    app = screen.app
    for binding in _bindings(list(screen.BINDINGS)):
        rows.append((app.get_key_display(binding), binding.tooltip or binding.description))
    rows += list(WIDGET_KEYS)
    for binding in _bindings(app_bindings):
        rows.append((app.get_key_display(binding), binding.tooltip or binding.description))
    return rows


class HelpScreen(ModalScreen[None]):
    """Lists the keys; any of escape, q or ? closes it."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close", show=False),
        Binding("question_mark", "close", "Close", show=False),
    ]

    def __init__(self, screen: Screen, app_bindings: list[BindingType]) -> None:
        super().__init__()
        self.rows = key_rows(screen, app_bindings)
        self.title_text = f"Keys: {getattr(screen, 'HELP_TITLE', type(screen).__name__)}"
        self.note = getattr(screen, "HELP_NOTE", "")

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=True, header_style="bold", padding=(0, 2))
        table.add_column("key", style="bold cyan", no_wrap=True)
        table.add_column("action")
        for key, what in self.rows:
            table.add_row(key, what)
        with VerticalScroll(id="help-dialog") as dialog:
            dialog.border_title = self.title_text
            dialog.border_subtitle = "escape closes"
            yield Static(table, id="help-keys")
            if self.note:
                yield Static(Text(self.note, style="dim"), id="help-note")

    def action_close(self) -> None:
        self.dismiss(None)
