"""``foundry-tui`` on hostile archives (Pilot): names holding markup and terminal escapes are
shown as text in every pane, and a damaged archive is an error in the pane, never a crash."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
from foundry.tui.app import main
from foundry.tui.screens.browse import BrowseScreen
from foundry.tui.screens.diff import DiffScreen
from foundry.tui.widgets.environment_diff import EnvironmentDiff
from foundry.tui.widgets.graph_tree import GraphTree
from foundry.tui.widgets.node_compare import NodeCompare
from foundry.tui.widgets.node_diff_table import NodeDiffTable
from foundry.tui.widgets.node_pane import NodePane
from foundry.tui.widgets.node_table import NodeTable
from foundry.tui.widgets.status_line import StatusLine
from foundry.tui.widgets.summary_pane import SummaryPane
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.text import Text

from foundry.archive import Archive
from foundry.archive.sample import sample_path
from foundry.archive.schema import CATALOG_FILE
from foundry.errors import FoundryError

from .archive_tools import reseal
from .conftest import FIXTURES
from .hostile import CONTROL, HOSTILE, edit_document, hostile_names
from .test_fuzz import edit_tree
from .test_hostile import _window, _with_window
from .test_tui import SIZE, app_for, pilot_test, plain, press, settle

MARKUP = "[/][/bold]"
ESCAPED = "\\x1b[2J\\x1b]0;all ok\\x07\\u202e"


def shows_as_text(text: str) -> None:
    assert not CONTROL.search(text.replace("\n", "")), repr(text[:400])
    assert MARKUP in text and ESCAPED in text, text[:2000]


@pilot_test
async def test_browse_shows_hostile_names_as_text(tmp_path):
    app = app_for(hostile_names(tmp_path / "hostile"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)
        tree = screen.query_one(GraphTree)
        shows_as_text(str(tree.root.children[0].children[0].label))
        table = screen.query_one(NodeTable)
        assert table.row_count == 155
        shows_as_text(Text.from_markup(table.border_title).plain)  # the title reads back as markup
        await press(pilot, "enter", "enter")  # into the nodes; node 0 (its kernel renamed) in the pane
        pane = screen.query_one(NodePane)
        assert pane.node_id == 0 and pane.error is None
        shows_as_text(plain(pane.shown))
        await press(pilot, "s")
        summary = screen.query_one(SummaryPane)
        assert summary.summary is not None and summary.lint is not None
        shows_as_text(plain(summary.shown))
        await press(pilot, "/", *"bold", "enter")
        assert "match 1 of" in screen.query_one(StatusLine).text
        await press(pilot, "escape", "escape", "down")  # the next graph, its kernel renamed too
        assert table.graph.entry.name == "decode.bs2"
        assert isinstance(app.screen, BrowseScreen)


@pilot_test
async def test_diff_shows_hostile_names_as_text(tmp_path):
    app = app_for(hostile_names(tmp_path / "hostile"), sample_path())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DiffScreen) and screen.diff is not None
        environment = screen.query_one(EnvironmentDiff)
        assert environment.changes
        shows_as_text(plain(environment.content))
        nodes = screen.query_one(NodeDiffTable)
        while "decode.bs2" not in Text.from_markup(nodes.border_title or "").plain:  # its kernel was renamed
            await press(pilot, "n")
        assert nodes.row_count >= 1
        shows_as_text(plain(screen.query_one(NodeCompare).shown))
        shows_as_text(plain(nodes.get_row_at(0)[3], width=2000))


@pilot_test
async def test_a_nan_launch_attribute_is_an_error_in_the_pane(tmp_path):
    root = tmp_path / "nan"
    shutil.copytree(sample_path(), root)
    edit_document(root, "decode.bs1", _with_window(_window(base_ptr=float("nan"))))
    app = app_for(root)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "enter", "enter")
        screen = app.screen
        pane = screen.query_one(NodePane)
        assert pane.error is not None and "access_policy_window" in pane.error, pane.error
        assert "Cannot read graph 'decode.bs1' of rank 0" in plain(pane.shown)
        await press(pilot, "escape", "down")  # back in the tree: the other graphs still open
        assert screen.query_one(NodeTable).graph.entry.name == "decode.bs2"


# -- before the terminal is taken over ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["a", "b", "c"], "give one ARCHIVE to browse, or two"),
        (["/no/such/archive"], "no such archive"),
        (["CATALOG-FIELD"], r"unknown field `\\x1b\[2J"),
    ],
)
def test_an_archive_or_flag_the_tui_cannot_start_with_is_one_escaped_line(cli, tmp_path, argv, match):
    """``foundry-tui`` refuses as ``foundry`` does: one line on stderr, exit 2, the archive's
    escapes escaped (a catalog field named with a screen clear)."""
    if argv == ["CATALOG-FIELD"]:
        path = Path(shutil.copytree(sample_path(), tmp_path / "archive"))
        catalog = json.loads((path / CATALOG_FILE).read_text())
        catalog["\x1b[2J\x1b]0;all ok\x07x"] = 1
        (path / CATALOG_FILE).write_text(json.dumps(catalog))
        argv = [str(path)]
    outcome = cli.run(*argv, prog="foundry-tui")
    assert outcome.rc == 2 and not outcome.timed_out, str(outcome)
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("foundry-tui: error: ") and outcome.stdout == "", str(outcome)
    assert not CONTROL.search(outcome.stderr) and "Traceback" not in outcome.stderr, str(outcome)
    assert re.search(match, lines[0]), lines[0]


# -- tampered archives, generated (the CLI's generators: tests/test_fuzz.py) ----------------------


async def _browse_every_graph(root: Path) -> None:
    """Open ``root`` in the TUI, visit every graph and the summary: each graph shows its nodes
    or, in the pane, the one error that names what is wrong; never an internal error, never a crash."""
    archive = Archive.open(root)
    try:
        entries = archive.entries(0)
    except FoundryError as err:  # the session itself is refused: the tree says so where the graphs would be
        entries, refusal = (), str(err)
    app = app_for(root)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)
        if not entries:
            (leaf,) = screen.query_one(GraphTree).root.children[0].children
            assert str(leaf.label) == f"unreadable: {refusal}"
        for i, entry in enumerate(entries):
            if i:
                await press(pilot, "down")
            assert screen.wanted == (0, entry.name)
            table, pane = screen.query_one(NodeTable), screen.query_one(NodePane)
            if pane.error is not None:
                assert screen.loaded is None and "internal error" not in pane.error, pane.error
                assert f"Cannot read graph {entry.name!r}"[:40] in plain(pane.shown, width=400)
                with pytest.raises(FoundryError):  # the pane says what reading it here says
                    archive.graph(0, entry, deep=False)
            else:
                assert screen.loaded is not None and screen.loaded.entry.name == entry.name
                assert table.row_count == entry.nodes == len(archive.graph(0, entry, deep=False))
        await press(pilot, "s")
        summary = screen.query_one(SummaryPane)
        assert (summary.summary is not None) != ("summary" in summary.errors)
        assert (summary.lint is not None) != ("lint" in summary.errors)
        assert not any("internal error" in e for e in summary.errors.values()), summary.errors
        assert isinstance(app.screen, BrowseScreen)


def _make_a_string_hostile(data: st.DataObject, tree: object) -> None:
    """Append :data:`HOSTILE` (markup, a screen clear, an OSC title) to one name in ``tree``: a
    kernel's, a region's or a graph's, or a graph's runner (what the panes render)."""
    leaves: list[tuple[dict | list, object]] = []

    def walk(node: object) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, str) and key in ("name", "runner"):
                leaves.append((node, key))
            else:
                walk(value)

    walk(tree)
    if leaves:
        parent, key = leaves[data.draw(st.integers(0, len(leaves) - 1), label="string")]
        parent[key] += HOSTILE


@settings(max_examples=int(os.environ.get("FOUNDRY_FUZZ_EXAMPLES", "8")), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_the_tui_opens_tampered_archives_and_shows_their_errors_in_the_pane(data):
    """Graph documents and sessions tampered with as the CLI's fuzzing does, re-sealed."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(shutil.copytree(FIXTURES / "sglang-decode", Path(tmp) / "tampered"))
        graphs = sorted((root / "rank0" / "graphs").iterdir())
        for _ in range(data.draw(st.integers(1, 3), label="graphs edited")):
            target = graphs[data.draw(st.integers(0, len(graphs) - 1), label="graph")]
            document = msgspec.msgpack.decode(target.read_bytes())
            edit_tree(data, document, as_json=False)
            if data.draw(st.booleans(), label="a string made hostile"):  # what a pane renders: names, kernels
                _make_a_string_hostile(data, document)
            target.write_bytes(msgspec.msgpack.encode(document))
        reseal(root)
        if data.draw(st.booleans(), label="session edited"):
            session = json.loads((root / "rank0" / "session.json").read_text())
            edit_tree(data, session, as_json=True)
            if data.draw(st.booleans(), label="a name in the session made hostile"):  # what the tree shows
                _make_a_string_hostile(data, session)
            (root / "rank0" / "session.json").write_text(json.dumps(session))
            reseal(root, graphs=False)
        try:
            Archive.open(root)
        except FoundryError:  # the catalog is refused before the terminal is taken over: one line, exit 2
            assert main([str(root)]) == 2
            return
        asyncio.run(_browse_every_graph(root))
