"""Text that came from an archive, made safe to show people.

Archives are input: a graph, kernel or region name, a catalog field or a field
name in an error may hold terminal control sequences (``ESC[2J`` clears the
screen, an OSC sequence retitles the window) or rich markup (``[/bold]``).
Every human-readable output passes such text through :func:`printable`, which
writes each control character as an escape, and renders it as text, never as
markup (:func:`plain` gives a rich ``Text``). Machine output (``--json``) keeps
the text as it is: JSON escapes control characters itself.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# C0 (tab and newline too: one name is one line), DEL, C1, and the Unicode controls that
# reorder or break lines on a terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every control character written as an escape (``\\x1b``, ``\\u202e``)."""
    text = str(text)
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def plain(text: object, style: str = "") -> Text:
    """``text`` as a rich ``Text``: shown as it is written, never parsed as markup."""
    from rich.text import Text  # here: the runtime imports this module and never renders

    return Text(printable(text), style=style)
