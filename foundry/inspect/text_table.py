"""Tables of short text drawn as rich draws its default table, but by padding alone.

Rich lays out every cell of a table in turn (about 0.1 ms a cell on a 2-core machine), so
the graph table of an archive with thousands of graphs took longer to print than its graphs
took to read. Here each row is one line: columns as wide as their widest cell, the header in
bold, a cell's own style where it has one. It draws only a table that fits the console's
width; a wider one is left to rich, which wraps cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

#: A cell: its text, or its text and a rich style.
Cell = str | tuple[str, str]


@dataclass(frozen=True)
class Column:
    """A column's heading, and whether its cells align right (numbers)."""

    name: str
    right: bool = False


def _text(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell[0]


def widths(columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[int]:
    """Each column's width in terminal cells: its widest cell or its heading."""
    out = [cell_len(c.name) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            out[i] = max(out[i], cell_len(_text(cell)))
    return out


def _pad(value: str, size: int, right: bool) -> str:
    gap = " " * (size - cell_len(value))  # wide characters take two cells
    return gap + value if right else value + gap


def print_table(console: Console, title: str, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> bool:
    """Print the table on ``console`` and return True, or return False (printing nothing) when
    it is wider than the console, its title wider than it, or a cell holds a line break."""
    sizes = widths(columns, rows)
    width = sum(sizes) + 3 * len(sizes) + 1
    if width > console.width or cell_len(title) > width or any("\n" in _text(c) for row in rows for c in row):
        return False  # rich shrinks the cells to the console, and wraps a title to the table
    text = Text(no_wrap=True, overflow="ignore", end="")
    text.append(f"{title}\n", style="italic")
    text.append("┏" + "┳".join("━" * (w + 2) for w in sizes) + "┓\n")
    text.append("┃")
    for column, size in zip(columns, sizes, strict=True):
        text.append(" ")
        text.append(_pad(column.name, size, column.right), style="bold")
        text.append(" ┃")
    text.append("\n┡" + "╇".join("━" * (w + 2) for w in sizes) + "┩\n")
    for row in rows:
        if all(isinstance(cell, str) for cell in row):  # most rows: one piece of text, not three per cell
            padded = (_pad(cell, size, column.right) for column, size, cell in zip(columns, sizes, row, strict=True))
            text.append("│ " + " │ ".join(padded) + " │\n")
            continue
        text.append("│")
        for column, size, cell in zip(columns, sizes, row, strict=True):
            value, style = (cell, "") if isinstance(cell, str) else cell
            text.append(" ")
            text.append(_pad(value, size, column.right), style=style)
            text.append(" │")
        text.append("\n")
    text.append("└" + "┴".join("─" * (w + 2) for w in sizes) + "┘")
    console.print(text, crop=False)
    return True
