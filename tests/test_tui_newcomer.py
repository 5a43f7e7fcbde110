"""The TUI's rough edges a newcomer meets, each checked on what the screen shows (Pilot,
real archives): Home/End, a kernel column that uses the terminal's width, the diff's
environment pane and subtitle, search messages, counts in the right number, the footer
at 80x24, and a standard output that is not a terminal."""

from __future__ import annotations

import html
import re
import shlex
import subprocess
import sys
from collections import defaultdict

import pexpect
import pytest
from foundry.tui.model import counted
from foundry.tui.screens.browse import BrowseScreen
from foundry.tui.screens.diff import DiffScreen
from foundry.tui.widgets.environment_diff import EnvironmentDiff
from foundry.tui.widgets.graph_diff_list import GraphDiffList
from foundry.tui.widgets.graph_tree import GraphTree
from foundry.tui.widgets.node_diff_table import NodeDiffTable
from foundry.tui.widgets.node_table import KERNEL, NodeTable

from .conftest import FIXTURES
from .test_tui import app_for, edited_sample, pilot_test, plain, press, settle, status

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="([\d.]+)" '
                   r'clip-path="url\(#[\w-]+-line-(\d+)\)">(.*?)</text>')  # fmt: skip


def screen_lines(app) -> list[str]:
    """The screen as text, line by line, read back from Textual's own screenshot (what is seen)."""
    found = _TEXT.findall(app.export_screenshot())
    x, length, _, first = found[0]
    cell = float(length) / len(html.unescape(first))  # the width of one character cell
    lines: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for x, _, line, text in found:
        lines[int(line)].append((float(x), html.unescape(text).replace("\xa0", " ")))
    out = []
    for number in range(max(lines, default=-1) + 1):
        row = ""
        for x, text in sorted(lines.get(number, [])):
            row = row.ljust(round(x / cell)) + text
        out.append(row)
    return out


# -- Home and End ------------------------------------------------------------------------------


@pilot_test
async def test_home_and_end_move_in_the_node_table_and_the_tree():
    app = app_for("@sample")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = app.screen
        tree = screen.query_one(GraphTree)
        await press(pilot, "end")
        assert tree.current is not None and tree.current.entry.name == "decode.bs4"
        await press(pilot, "home")
        assert tree.cursor_line == 0
        await press(pilot, "down", "enter")
        table = screen.query_one(NodeTable)
        assert screen.focused is table and table.cursor_row == 0
        await press(pilot, "end")
        assert table.cursor_row == 154 and screen.node_pane.node_id == 154
        await press(pilot, "home")
        assert table.cursor_row == 0 and screen.node_pane.node_id == 0


@pilot_test
async def test_home_and_end_move_in_the_diff_tables(tmp_path):
    app = app_for(FIXTURES / "saveload-a", FIXTURES / "tiny-qwen3")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        graphs = app.screen.query_one(GraphDiffList)
        await press(pilot, "end")
        assert graphs.cursor_row == graphs.row_count - 1 > 0
        await press(pilot, "home", "enter")
        nodes = app.screen.query_one(NodeDiffTable)
        assert app.screen.focused is nodes and nodes.row_count > 2
        await press(pilot, "end")
        assert nodes.cursor_row == nodes.row_count - 1
        await press(pilot, "home")
        assert nodes.cursor_row == 0


# -- the node table uses the width it has ----------------------------------------------------------


@pilot_test
async def test_the_kernel_column_takes_the_width_the_other_columns_leave():
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(NodeTable)
        assert table.columns[KERNEL].width > 60  # type: ignore[index]
        shown = "\n".join(screen_lines(app))
        for node in table.graph.ir.kernels():  # every kernel name fits at 160 columns: none is cut
            assert node.kernel.short_name in shown, node.kernel.short_name
        assert "…" not in shown.split("Node  Summary")[0]
        await pilot.resize_terminal(100, 40)
        await settle(pilot)
        narrow = table.columns[KERNEL].width  # type: ignore[index]
        assert narrow < 60 and "…" in "\n".join(screen_lines(app)).split("Node  Summary")[0]


# -- diff mode ----------------------------------------------------------------------------------------


@pilot_test
async def test_the_environment_pane_keeps_every_field_name_whole():
    app = app_for(FIXTURES / "saveload-a", FIXTURES / "tiny-qwen3")
    async with app.run_test(size=(120, 60)) as pilot:
        await settle(pilot)
        env = app.screen.query_one(EnvironmentDiff)
        fields = [c.field.removeprefix("environment.") for c in env.changes]
        assert "model.intermediate_size" in fields and len(fields) > 5
        env.focus()
        shown = "\n".join(screen_lines(app))
        for _ in range(len(fields)):  # the pane scrolls: every field whole on some screen
            await press(pilot, "pagedown")
            shown += "\n" + "\n".join(screen_lines(app))
        for field in fields:
            assert re.search(rf"│ {re.escape(field)} ", shown), field  # whole, then blank (or the scrollbar)


@pilot_test
async def test_the_diff_subtitle_says_what_it_counts(tmp_path):
    edited, _ = edited_sample(tmp_path)
    app = app_for(FIXTURES / "tiny-qwen3", edited)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(NodeDiffTable)
        assert table.border_subtitle == "1 node differs · 0 edges differ"
        assert isinstance(app.screen, DiffScreen)


# -- messages -------------------------------------------------------------------------------------------


@pilot_test
async def test_next_match_after_a_search_without_match_names_the_search():
    app = app_for("@sample")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "n")
        assert status(app).startswith("no search yet")
        await press(pilot, "slash", *"nosuchkernel", "enter")
        assert "matches 'nosuchkernel'" in status(app)
        await press(pilot, "n")
        assert status(app).startswith("no kernel in decode.bs1 matches 'nosuchkernel'"), status(app)
        await press(pilot, "slash", *"elementwise", "enter")
        assert "match 1 of" in status(app)


@pilot_test
async def test_counts_are_in_the_right_number():
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        shown = "\n".join(screen_lines(app))
        assert "rank 0 1 graph " in shown and "1 graphs" not in shown
    app = app_for("@sample")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await press(pilot, "enter", "down")  # node 1 of decode.bs1: one pointer word
        screen = app.screen
        assert screen.node_pane.node_id == 1 and len(screen.loaded.ir.operands.of(1)) == 1
        assert "1 pointer word)" in plain(screen.node_pane.shown)
    assert counted(1, "graph") == "1 graph" and counted(3, "graph") == "3 graphs"


FOOTERS = {
    BrowseScreen: ("Search", "Collective", "Unresolved", "Lint", "Export", "Summary", "Help", "Quit"),
    DiffScreen: ("Next change", "Previous change", "Help", "Quit"),
}


@pytest.mark.parametrize("archives", [("@sample",), (FIXTURES / "saveload-a", FIXTURES / "tiny-qwen3")])
def test_at_80x24_the_footer_shows_every_key(archives):
    @pilot_test
    async def run() -> None:
        app = app_for(*archives)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            footer = screen_lines(app)[-1]
            words = FOOTERS[type(app.screen)]
            assert all(word in footer for word in words), footer
            assert footer.rstrip().endswith("Quit") and len(footer.rstrip()) <= 80

    run()


# -- not a terminal -----------------------------------------------------------------------------------------


def test_without_a_terminal_for_output_the_tui_refuses_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "foundry.tui.app", "@sample"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("foundry-tui: error: stdout is not a terminal") and proc.stderr.count("\n") == 1


def test_without_a_terminal_for_keys_the_tui_refuses_in_one_line():
    command = f"{shlex.quote(sys.executable)} -m foundry.tui.app @sample < /dev/null"
    child = pexpect.spawn("/bin/sh", ["-c", command], encoding="utf-8", timeout=60, dimensions=(24, 80))
    text = child.read()
    child.close()
    assert child.exitstatus == 2 and "\x1b" not in text
    assert text.strip().startswith("foundry-tui: error: stdin is not a terminal") and text.strip().count("\n") == 0
