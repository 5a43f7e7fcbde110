"""The export dialog: a format (GraphML or DOT) and a path; the browse screen writes the file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, RadioButton, RadioSet

EXTENSIONS = {"graphml": ".graphml", "dot": ".dot"}


@dataclass(frozen=True)
class ExportRequest:
    """What to write: ``format`` is one of :data:`foundry.graphir.passes.export.FORMATS`."""

    format: str
    path: Path


class ExportScreen(ModalScreen[ExportRequest | None]):
    """Asks where to export the current graph; dismisses with an :class:`ExportRequest` or ``None``."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, stem: str, directory: Path) -> None:
        super().__init__()
        self.stem = stem
        self.directory = directory
        self.format = "graphml"

    def compose(self) -> ComposeResult:
        with Vertical(id="export-dialog"):
            yield Label(f"Export graph [b]{self.stem}[/b]", id="export-title")
            with RadioSet(id="export-format"):
                yield RadioButton("GraphML (networkx.read_graphml)", value=True, id="format-graphml")
                yield RadioButton("DOT (Graphviz)", id="format-dot")
            yield Label("Write to:")
            yield Input(str(self.directory / f"{self.stem}.graphml"), id="export-path")
            with Horizontal(id="export-buttons"):
                yield Button("Export", variant="primary", id="export-ok")
                yield Button("Cancel", id="export-cancel")

    def on_mount(self) -> None:
        self.query_one("#export-path", Input).focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        new = "dot" if event.pressed.id == "format-dot" else "graphml"
        path_input = self.query_one("#export-path", Input)
        old_ext, new_ext = EXTENSIONS[self.format], EXTENSIONS[new]
        if path_input.value.endswith(old_ext):
            path_input.value = path_input.value[: -len(old_ext)] + new_ext
        self.format = new

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "export-ok":
            self._submit()
        else:
            self.dismiss(None)

    def _submit(self) -> None:
        text = self.query_one("#export-path", Input).value.strip()
        if not text:
            self.notify("give a path to write to", severity="warning")
            return
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = self.directory / path
        self.dismiss(ExportRequest(self.format, path))

    def action_cancel(self) -> None:
        self.dismiss(None)
