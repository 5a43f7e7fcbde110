"""The search line: opened with ``/``, closed by enter (search) or escape."""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class SearchBar(Input):
    """An input docked at the bottom; posts :class:`SearchBar.Search` with the query."""

    BINDINGS = [Binding("escape", "close", "Close search", show=False)]

    class Search(Message):
        """Search kernel names for ``query``."""

        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    class Closed(Message):
        """The bar closed without a search."""

    def __init__(self, **kwargs) -> None:
        super().__init__(placeholder="search kernel names (mangled or demangled); enter to search", **kwargs)

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def open(self) -> None:
        self.add_class("-open")
        self.focus()

    def action_close(self) -> None:
        self.remove_class("-open")
        self.post_message(self.Closed())

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.remove_class("-open")
        query = event.value.strip()
        if query:
            self.post_message(self.Search(query))
        else:
            self.post_message(self.Closed())
