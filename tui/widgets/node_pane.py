"""The node pane: everything the archive records about the node under the cursor."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from foundry.text import printable


class NodePane(VerticalScroll, can_focus=True):
    """Shows one node's description (:func:`foundry.tui.describe.describe_node`),
    a message, or an error (a graph that cannot be read)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.node_id: int | None = None
        self.error: str | None = None
        self.shown: RenderableType = ""

    def compose(self):
        yield Static(id="node-body")

    def _set(self, renderable: RenderableType) -> None:
        self.shown = renderable
        self.query_one("#node-body", Static).update(renderable)
        self.scroll_home(animate=False)

    def show_node(self, node_id: int, renderable: RenderableType) -> None:
        self.node_id, self.error = node_id, None
        self._set(renderable)

    def show_message(self, text: str) -> None:
        self.node_id, self.error = None, None
        self._set(Text(text, style="dim"))

    def show_error(self, title: str, message: str) -> None:
        """A readable error in place of the node (never a traceback)."""
        self.node_id, self.error = None, message
        self._set(Text.assemble((printable(title), "bold red"), "\n\n", (printable(message), "red")))
