"""The footer of keys: compact where the terminal is narrow, so every key stays on screen."""

from __future__ import annotations

from textual import events
from textual.widgets import Footer

COMPACT_BELOW = 100  # columns; at 80 the browse screen's keys fit only without the spacing


class KeyFooter(Footer):
    """Textual's footer, dropping the spacing around its keys in a terminal narrower than
    :data:`COMPACT_BELOW` columns (judged by the terminal's width, set only when that changes
    the style: re-laying the keys is not free)."""

    def on_mount(self) -> None:
        self._fit()

    def on_resize(self, event: events.Resize) -> None:
        self._fit()

    def _fit(self) -> None:
        compact = self.app.size.width < COMPACT_BELOW
        if compact != self.compact:
            self.compact = compact
