"""One line above the footer saying what the last key did (match 2/14, no collectives, ...)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from foundry.text import printable


class StatusLine(Static):
    """The last outcome of a search, jump or export; ``text`` holds it as plain text."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.text = ""
        self.is_hint = False

    def say(self, text: str, *, style: str = "", hint: bool = False) -> None:
        """Show ``text``; a ``hint`` may be replaced by a later hint, never an outcome by a hint."""
        self.text = text
        self.is_hint = hint
        self.update(Text(printable(text), style=style or ("dim" if hint else "")))  # names from archives inside

    def hint(self, text: str) -> None:
        """Show ``text`` unless the line holds the outcome of something the user did."""
        if self.is_hint or not self.text:
            self.say(text, hint=True)
