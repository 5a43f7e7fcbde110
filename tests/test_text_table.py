"""The graph table drawn by padding looks as rich draws it, and leaves wide tables to rich."""

from __future__ import annotations

from io import StringIO

from rich.console import Console
from rich.table import Table

from foundry.archive import Archive
from foundry.backends import BackendRegistry
from foundry.inspect.render import GRAPH_COLUMNS, REGION_COLUMNS, render_summary
from foundry.inspect.summary import summarize
from foundry.inspect.text_table import Column, print_table

from .conftest import FIXTURES


def _console(width: int = 120, color: bool = False) -> Console:
    return Console(file=StringIO(), width=width, markup=False, highlight=False, soft_wrap=False,
                   color_system="standard" if color else None, force_terminal=color)  # fmt: skip


def _rich(title: str, columns: list[Column], rows: list[tuple]) -> list[str]:
    console = _console()
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column.name, justify="right" if column.right else "left")
    for row in rows:
        table.add_row(*(c if isinstance(c, str) else c[0] for c in row))
    console.print(table)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def test_the_padded_table_is_rich_s_table_line_for_line():
    columns = [Column("rank", right=True), Column("graph"), Column("kinds"), Column("unresolved", right=True)]
    rows = [("0", "decode.bs1", "kernel 155", "0"), ("12", "名前.bs2", "kernel 3, memcpy 1", ("7", "red"))]
    console = _console()
    assert print_table(console, "Graphs", columns, rows)
    assert console.file.getvalue().splitlines() == _rich("Graphs", columns, rows)


def test_inspect_s_graph_table_of_a_real_archive_matches_rich_s():
    summary = summarize(Archive.open(FIXTURES / "tiny-qwen3"), BackendRegistry.discover())
    console = _console()
    render_summary(console, summary)
    lines = console.file.getvalue().splitlines()
    start = lines.index("Graphs")
    drawn = lines[start : start + 4 + len(summary.graphs) + 1]
    cells = [line.split("│")[1:-1] for line in drawn[4:-1]]
    assert [c[1].strip() for c in cells] == [g.name for g in summary.graphs]
    rows = [tuple(c.strip() for c in row) for row in cells]
    assert drawn == _rich("Graphs", list(GRAPH_COLUMNS), rows)


def test_inspect_s_region_table_of_a_real_archive_matches_rich_s():
    summary = summarize(Archive.open(FIXTURES / "tiny-qwen3"), BackendRegistry.discover())
    console = _console()
    render_summary(console, summary)
    lines = console.file.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Regions ("))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    drawn = lines[start : end + 1]
    rows = [tuple(c.strip() for c in line.split("│")[1:-1]) for line in drawn[4:-1]]
    assert len(rows) == 16 and rows[-1][0] == "... 15 more (--json lists all)"
    assert drawn == _rich(lines[start], list(REGION_COLUMNS), rows)


def test_a_title_wider_than_its_table_is_left_to_rich():
    assert not print_table(_console(), "Kernel histogram: 465 launches", [Column("kernel")], [("gemm",)])


def test_a_table_wider_than_the_console_is_left_to_rich():
    console = _console(width=30)
    assert not print_table(console, "Graphs", [Column("graph")], [("x" * 40,)])
    assert console.file.getvalue() == ""
    assert not print_table(_console(), "Graphs", [Column("graph")], [("two\nlines",)])


def test_a_cell_keeps_its_style():
    console = _console(color=True)
    assert print_table(console, "Graphs", [Column("unresolved", right=True)], [(("3", "red"),), ("0",)])
    out = console.file.getvalue()
    assert "\x1b[31m" in out and out.count("\x1b[31m") == 1
