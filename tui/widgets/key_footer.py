"""The footer of keys: compact where the terminal is narrow, so every key stays on screen."""

from __future__ import annotations

from textual import events
from textual.widgets import Footer

COMPACT_BELOW = 100  # columns; at 80 the browse screen's keys fit only without the spacing


class KeyFooter(Footer):
    """Textual's footer, dropping the spacing around its keys below :data:`COMPACT_BELOW` columns."""

    def on_resize(self, event: events.Resize) -> None:
        self.compact = event.size.width < COMPACT_BELOW
