"""Pilot tests of the Foundry TUI: every screen driven by keys, asserting what it shows.

The archive builders here (one changed parameter byte, an unresolved operand)
are shared with ``test_tui_snapshots.py`` and ``test_tui_terminal.py``.
"""

from __future__ import annotations

import asyncio
import functools
import io
import re
import shutil
from pathlib import Path

import msgspec
import networkx as nx
import pytest
from foundry.tui.app import FoundryApp, main, open_archives
from foundry.tui.model import OpenedArchive, graph_groups, next_graph, next_id
from foundry.tui.screens.browse import BrowseScreen
from foundry.tui.screens.diff import DiffScreen
from foundry.tui.screens.export import ExportScreen
from foundry.tui.screens.help import HelpScreen
from foundry.tui.widgets.environment_diff import EnvironmentDiff
from foundry.tui.widgets.graph_diff_list import GraphDiffList
from foundry.tui.widgets.graph_tree import GraphTree, GroupItem
from foundry.tui.widgets.node_compare import NodeCompare
from foundry.tui.widgets.node_diff_table import NodeDiffTable
from foundry.tui.widgets.node_pane import NodePane
from foundry.tui.widgets.node_table import NodeTable
from foundry.tui.widgets.search_bar import SearchBar
from foundry.tui.widgets.status_line import StatusLine
from foundry.tui.widgets.summary_pane import SummaryPane
from rich.console import Console, RenderableType

from foundry.archive import Archive, ArchiveWriter
from foundry.archive.sample import sample_path
from foundry.graphir.graph import Edge, EdgeData, GraphIR
from foundry.graphir.nodes import EmptyNode, MemsetNode
from foundry.graphir.operands import Operand, OperandSite
from foundry.graphir.passes.diff import Status

from .archive_tools import edit_graph, graph_file
from .conftest import FIXTURES

SIZE = (120, 40)
UNRESOLVED_VALUE = 0xDEAD_0000_1000
UNRESOLVED_NODE = 3


# -- archive builders (shared with the snapshot and terminal tests) ----------------------


def edited_sample(root: Path) -> tuple[Path, dict]:
    """A copy of the sample under ``root/tiny-qwen3-edited`` whose ``decode.bs2`` has one
    scalar parameter byte changed; returns the path and what changed."""
    path = root / "tiny-qwen3-edited"
    shutil.copytree(FIXTURES / "tiny-qwen3", path)
    changed: dict = {}

    def bump(ir: GraphIR) -> None:
        for node in ir.kernels():
            pointers = {o.offset for o in ir.operands.of(node.id)}
            for index, slot in enumerate(node.layout.slots):
                if slot.size == 4 and slot.offset not in pointers:
                    old = node.params[slot.offset : slot.end]
                    new = bytes([old[0] ^ 0x01]) + old[1:]
                    params = node.params[: slot.offset] + new + node.params[slot.end :]
                    ir.replace_node(msgspec.structs.replace(node, params=params))
                    changed.update(node=node.id, param=index, offset=slot.offset, old=old[:1].hex(), new=new[:1].hex())
                    return

    edit_graph(path, "decode.bs2", bump)
    return path, changed


def unresolved_archive(root: Path) -> Path:
    """Two graphs built from the sample: ``a.clean`` and ``b.unresolved``, whose node 3 is
    a memset into an address no region holds (lint: one unresolved-pointer error)."""
    source = Archive.open(FIXTURES / "tiny-qwen3")
    template = source.graph(0, "decode.bs1")
    writer = ArchiveWriter(root / "unresolved", environment=source.catalog.environment, model={"model": "unresolved"})
    rank = writer.rank(0)
    for name, bad in (("a.clean", False), ("b.unresolved", True)):
        ir = GraphIR(name, regions=template.regions.values())
        kernels = [msgspec.structs.replace(n, id=i) for i, n in enumerate(template.nodes()[:6])]
        operands = [o for o in template.operands if o.node < 6]
        if bad:
            memset = MemsetNode(UNRESOLVED_NODE, UNRESOLVED_VALUE, 0, 4, 256)
            kernels[UNRESOLVED_NODE] = memset
            operands = [o for o in operands if o.node != UNRESOLVED_NODE]
            operands.append(Operand(UNRESOLVED_NODE, OperandSite.MEMSET_DST, -1, 0, UNRESOLVED_VALUE, "unresolved", 0))
        ir.add_nodes(kernels)
        ir.add_edges(Edge(i, i + 1) for i in range(5))
        ir.set_operands(operands)
        rank.add_graph(ir)
    rank.seal()
    return writer.commit()


VLLM_NAMES = [f"piecewise.t{size}.p{piece}" for size in range(1, 26) for piece in range(10)]


def many_graphs_archive(root: Path, names: list[str] = VLLM_NAMES) -> Path:
    """Graphs of six nodes under ``names``; by default 250 named as vLLM names its piecewise
    graphs (``piecewise.t<size>.p<piece>``: 25 sizes of 10 pieces), more than a rank lists flat."""
    source = Archive.open(FIXTURES / "tiny-qwen3")
    template = source.graph(0, "decode.bs1")
    writer = ArchiveWriter(root / "many", environment=source.catalog.environment, model={"model": "many"})
    rank = writer.rank(0)
    for name in names:
        ir = GraphIR(name, regions=template.regions.values())
        ir.add_nodes(msgspec.structs.replace(n, id=i) for i, n in enumerate(template.nodes()[:6]))
        ir.add_edges(Edge(i, i + 1) for i in range(5))
        ir.set_operands(o for o in template.operands if o.node < 6)
        rank.add_graph(ir)
    rank.seal()
    return writer.commit()


# -- helpers -------------------------------------------------------------------------------


def pilot_test(fn):
    """Run an ``async def`` test with asyncio (no async plugin needed); fixtures pass through."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        asyncio.run(fn(*args, **kwargs))

    return run


def plain(renderable: RenderableType, width: int = 200) -> str:
    """What a rich renderable shows, as plain text."""
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def app_for(*paths: str | Path) -> FoundryApp:
    return FoundryApp(*open_archives([str(p) for p in paths]))


async def settle(pilot) -> None:
    """Let workers finish and their messages land (a message may start another worker)."""
    await pilot.pause()
    for _ in range(20):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if all(worker.is_finished for worker in pilot.app.workers):
            return


async def press(pilot, *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


def status(app: FoundryApp) -> str:
    return app.screen.query_one(StatusLine).text


# -- the model -------------------------------------------------------------------------------


def test_next_id_wraps_and_steps_backward():
    ids = [2, 5, 9]
    assert next_id(ids, None) == 2
    assert next_id(ids, 2) == 5
    assert next_id(ids, 9) == 2
    assert next_id(ids, 9, wrap=False) is None
    assert next_id(ids, 5, backward=True) == 2
    assert next_id(ids, 2, backward=True) == 9
    assert next_id([], 3) is None


def test_next_graph_follows_archive_order_and_wraps():
    order = [(0, "a"), (0, "b"), (0, "c")]
    assert next_graph(order, [(0, "c"), (0, "a")], (0, "a")) == (0, "c")
    assert next_graph(order, [(0, "a")], (0, "b")) == (0, "a")
    assert next_graph(order, [], (0, "a")) is None


# -- browse ------------------------------------------------------------------------------------


@pilot_test
async def test_browse_sample_shows_ranks_graphs_and_nodes():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)
        assert screen.sub_title == "@sample (tiny-qwen3)"
        tree = screen.query_one(GraphTree)
        assert [str(child.label) for child in tree.root.children[0].children] == [
            "decode.bs1 155",
            "decode.bs2 155",
            "decode.bs4 155",
        ]
        table = screen.query_one(NodeTable)
        assert table.row_count == 155 and table.graph.entry.name == "decode.bs1"
        assert table.border_subtitle == "155 nodes · 154 edges"
        # down in the tree opens the next graph; enter moves into its nodes
        await press(pilot, "down", "enter")
        assert table.graph.entry.name == "decode.bs2" and screen.focused is table
        await press(pilot, "down", "down")
        pane = screen.query_one(NodePane)
        assert pane.node_id == 2
        await press(pilot, "enter")
        assert screen.focused is pane
        text = plain(pane.shown)
        node = table.graph.ir.node(2)
        assert "node 2 · kernel · rank 0 decode.bs2" in text
        squashed = "".join(text.split())  # long names fold over several lines
        assert node.kernel.name in squashed and "".join(node.kernel.demangled.split()) in squashed
        assert "demangled" in text and "grid" in text and "block" in text and "shared mem" in text
        for index, slot in enumerate(node.layout.slots):
            assert f" {index} " in text and node.params[slot.offset : slot.end][:4].hex() in text
        for operand in table.graph.ir.operands.of(2):
            assert operand.location() in text  # region and offset of every pointer parameter


def test_many_graphs_are_grouped_by_name_and_runs_of_unrelated_names_by_count():
    assert graph_groups([f"decode.bs{i}" for i in range(36)]) is None  # few enough: listed flat
    vllm = [f"piecewise.t{t}.p{p}" for t in (1, 2, 4) for p in range(80)] + ["full.t1.r0.u1", "full.t2.r0.u1"]
    groups = graph_groups(vllm)
    labels = ["piecewise.t1", "piecewise.t2", "piecewise.t4", "full.t1.r0", "full.t2.r0"]
    assert [label for label, _ in groups] == labels
    assert [vllm[i] for i in groups[1][1]] == [f"piecewise.t2.p{p}" for p in range(80)]
    flat = [f"graph{i:04}" for i in range(250)]  # no shared prefix: runs of 100 in archive order
    assert [(label, len(members)) for label, members in graph_groups(flat)] == [
        ("graph0000 .. graph0099", 100), ("graph0100 .. graph0199", 100), ("graph0200 .. graph0249", 50)]  # fmt: skip
    one = [f"decode.g{i:03}" for i in range(230)]  # one prefix, too many for a group: its runs
    assert [label for label, _ in graph_groups(one)] == [
        "decode.g000 .. decode.g099", "decode.g100 .. decode.g199", "decode.g200 .. decode.g229"]  # fmt: skip


@pilot_test
async def test_a_rank_of_many_graphs_opens_with_its_first_group_and_reaches_any_graph(tmp_path):
    app = app_for(many_graphs_archive(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        tree = screen.query_one(GraphTree)
        rank = tree.root.children[0]
        assert str(rank.label) == "rank 0 250 graphs"
        groups = rank.children
        assert [str(g.label) for g in groups[:2]] == ["piecewise.t1 10 graphs", "piecewise.t2 10 graphs"]
        assert len(groups) == 25 and groups[0].is_expanded and not groups[1].children  # filled when opened
        assert [str(leaf.label) for leaf in groups[0].children][:2] == ["piecewise.t1.p0 6", "piecewise.t1.p1 6"]
        assert screen.query_one(NodeTable).graph.entry.name == "piecewise.t1.p0"
        assert tree.show_graph(0, "piecewise.t25.p9")
        await settle(pilot)
        assert groups[24].is_expanded and tree.current.entry.name == "piecewise.t25.p9"
        assert screen.query_one(NodeTable).graph.entry.name == "piecewise.t25.p9"
        assert tree.order()[-1] == (0, "piecewise.t25.p9") and len(tree.order()) == 250


@pilot_test
async def test_grouped_graphs_are_visited_in_the_order_the_tree_lists_them(tmp_path):
    names = [f"{phase}.bs{i}" for i in range(111) for phase in ("decode", "prefill")] + ["full.t1.r0.u1"]
    app = app_for(many_graphs_archive(tmp_path, names))  # the phases interleaved in the archive
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tree = app.screen.query_one(GraphTree)
        listed = [str(node.label).rsplit(" ", 2)[0] for node in tree.root.children[0].children]
        assert listed == ["decode.bs0 .. decode.bs99", "decode.bs100 .. decode.bs110", "prefill.bs0 .. prefill.bs99",
                          "prefill.bs100 .. prefill.bs110", "full.t1.r0.u1"]  # fmt: skip
        shown = []
        for node in tree.root.children[0].children:  # a group's graphs, or a graph of its own
            members = node.data.entries if isinstance(node.data, GroupItem) else (node.data.entry,)
            shown += [(0, entry.name) for entry in members]
        assert tree.order() == shown and len(shown) == len(names)


@pilot_test
async def test_enter_on_a_graph_whose_nodes_are_loading_moves_into_them_once_loaded():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        table, tree = screen.query_one(NodeTable), screen.query_one(GraphTree)
        entry = app.screen.archive.entries(0)[2]  # decode.bs4
        screen._open_graph(0, entry)  # its nodes loading, as right after the cursor reached it
        screen.on_graph_tree_graph_chosen(GraphTree.GraphChosen(0, entry, opened=True))  # Enter, meanwhile
        assert table.loading and screen.focused is tree  # a loading table takes no focus
        await settle(pilot)
        assert table.graph.entry.name == "decode.bs4" and screen.focused is table


@pilot_test
async def test_node_pane_shows_launch_attributes_and_backend_abi():
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "enter", "down", "down", "enter")
        text = plain(app.screen.query_one(NodePane).shown)
        assert "one_shot_all_reduce_kernel" in text
        assert "backend    torch-symm-mem: symm-allreduce" in text
        assert "attributes  cluster_scheduling_policy=1" in text
        assert "symm.buffer_ptrs+0x0" in text and "buffer_ptrs" in text and "= 4096" in text


@pilot_test
async def test_summary_pane_shows_histogram_collectives_regions_and_lint():
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "s")
        screen = app.screen
        assert screen.query_one("#details").active == "summary-tab"
        pane = screen.query_one(SummaryPane)
        assert pane.summary is not None and pane.lint is not None
        text = plain(pane.shown)
        assert "Kernel histogram: 3 launches of 3 kernels" in text
        assert "(anon)::one_shot_all_reduce_kernel<...>" in text
        assert "Collectives by kind" in text and "symm-allreduce" in text
        assert "symm.signal_pad" in text and "9.0 KiB" in text  # a region with its size
        assert "Lint: 1 graphs checked, 0 error(s), 1 warning(s)" in text  # no images recorded
        assert "missing-module-image" in text


@pilot_test
async def test_search_finds_kernels_and_steps_through_matches():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await press(pilot, "enter", "slash")
        bar = screen.query_one(SearchBar)
        assert bar.is_open and screen.focused is bar
        await pilot.press(*"reduce_kernel")  # typing 'c', 'e', 'l' goes into the bar, not to the jump keys
        assert bar.value == "reduce_kernel"
        await press(pilot, "enter")
        table = screen.query_one(NodeTable)
        ir = table.graph.ir
        matches = [n.id for n in ir.kernels() if "reduce_kernel" in n.kernel.demangled]
        assert len(matches) == 9 and not bar.is_open
        assert table.cursor_row == matches[0]
        assert status(app) == f"'reduce_kernel': match 1 of 9 (node {matches[0]}; n/N for more)"
        await press(pilot, "n")
        assert table.cursor_row == matches[1]
        await press(pilot, "N", "N")
        assert table.cursor_row == matches[-1]
        await press(pilot, "slash")
        await pilot.press(*"no_such_kernel")
        await press(pilot, "enter")
        assert status(app) == "no kernel in decode.bs1 matches 'no_such_kernel'"
        assert table.cursor_row == matches[-1]
        # the app's own keys (q quits, ? helps) are text while the bar is open; escape closes it
        await press(pilot, "slash")
        await pilot.press("q", "question_mark")
        assert bar.value == "q?" and isinstance(app.screen, BrowseScreen) and app.is_running
        await press(pilot, "escape")
        assert not bar.is_open and screen.focused is table


@pilot_test
async def test_next_collective_on_symm_mem():
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.screen.query_one(NodeTable)
        assert table.cursor_row == 0
        await press(pilot, "c")
        assert table.cursor_row == 2
        assert status(app) == "collective at node 2 of symm.allreduce (1/2)"
        assert "symm-allreduce" in plain(app.screen.query_one(NodePane).shown)
        await press(pilot, "c")
        assert table.cursor_row == 3
        await press(pilot, "c")  # one graph only: wraps to the first collective
        assert table.cursor_row == 2 and "wrapped" in status(app)


@pilot_test
async def test_next_collective_when_there_is_none():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "c")
        assert status(app) == "no collective in this archive"
        assert app.screen.query_one(NodeTable).cursor_row == 0


@pilot_test
async def test_next_unresolved_operand_crosses_graphs(tmp_path):
    app = app_for(unresolved_archive(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        table = screen.query_one(NodeTable)
        assert table.graph.entry.name == "a.clean"
        await press(pilot, "u")  # none here: the summary says b.unresolved has one
        assert table.graph.entry.name == "b.unresolved"
        assert table.cursor_row == UNRESOLVED_NODE
        text = plain(screen.query_one(NodePane).shown)
        assert f"unresolved 0x{UNRESOLVED_VALUE:x}" in text
        assert "unresolved-pointer" in text  # the node's lint finding, in the node pane
        assert "unresolved" in plain(table.get_row_at(UNRESOLVED_NODE)[-1])


@pilot_test
async def test_next_lint_finding_visits_findings_in_order(tmp_path):
    app = app_for(unresolved_archive(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        findings = screen.lint.findings
        assert [(f.rule, f.graph, f.node) for f in findings] == [
            ("missing-module-image", "a.clean", None),
            ("unresolved-pointer", "b.unresolved", UNRESOLVED_NODE),
            ("missing-module-image", "b.unresolved", None),
        ]
        table = screen.query_one(NodeTable)
        await press(pilot, "l")
        assert status(app).startswith("lint 1/3: warning missing-module-image: rank 0 a.clean:")
        assert table.graph.entry.name == "a.clean"
        await press(pilot, "l")
        assert status(app).startswith("lint 2/3: error unresolved-pointer: rank 0 b.unresolved node 3:")
        assert table.graph.entry.name == "b.unresolved" and table.cursor_row == UNRESOLVED_NODE
        await press(pilot, "l", "l")
        assert status(app).startswith("lint 1/3:") and table.graph.entry.name == "a.clean"


@pilot_test
async def test_export_graphml_and_dot(tmp_path):
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "e")
        assert isinstance(app.screen, ExportScreen)
        target = tmp_path / "out" / "symm.graphml"
        path_input = app.screen.query_one("#export-path")
        assert path_input.value.endswith("symm.allreduce.graphml")
        path_input.value = str(target)
        await press(pilot, "enter")
        assert isinstance(app.screen, BrowseScreen)
        assert status(app) == f"wrote {target}"
        graph = nx.read_graphml(target, node_type=int)
        assert graph.number_of_nodes() == 4 and graph.number_of_edges() == 3
        assert graph.nodes[2]["label"] == "(anon)::one_shot_all_reduce_kernel<...>"
        # DOT: choosing the format changes the extension
        await press(pilot, "e")
        await pilot.click("#format-dot")
        await settle(pilot)
        path_input = app.screen.query_one("#export-path")
        assert path_input.value.endswith("symm.allreduce.dot")
        path_input.value = str(tmp_path / "symm.dot")
        await pilot.click("#export-ok")
        await settle(pilot)
        dot = (tmp_path / "symm.dot").read_text()
        assert dot.startswith('digraph "symm.allreduce" {') and dot.count("->") == 3
        # escape cancels without writing
        await press(pilot, "e", "escape")
        assert isinstance(app.screen, BrowseScreen)


@pilot_test
async def test_export_to_an_unwritable_path_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    app = app_for(FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "e")
        app.screen.query_one("#export-path").value = str(blocker / "x.graphml")
        await press(pilot, "enter")
        assert isinstance(app.screen, BrowseScreen)
        assert status(app).startswith(f"cannot write {blocker / 'x.graphml'}")


@pilot_test
async def test_help_lists_the_keys_and_closes():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = dict(app.screen.rows)
        assert keys["/"] == "Search kernel names in this graph"
        assert keys["c"] == "Next collective kernel"
        assert keys["u"] == "Next node with an unresolved operand"
        assert keys["l"] == "Next lint finding"
        assert keys["e"] == "Export this graph as GraphML or DOT"
        assert keys["q"] == "Quit" and keys["?"] == "Show every key"
        await press(pilot, "question_mark")
        assert isinstance(app.screen, BrowseScreen)
        await press(pilot, "question_mark", "escape")
        assert isinstance(app.screen, BrowseScreen)


@pilot_test
async def test_footer_shows_the_main_keys():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        footer_keys = {key for key, active in app.active_bindings.items() if active.binding.show}
        assert {"slash", "c", "u", "l", "e", "s", "question_mark", "q"} <= footer_keys
        assert not {"n", "N", "d", "escape"} & footer_keys  # secondary keys are in the help screen only


@pilot_test
async def test_mouse_click_opens_a_graph():
    app = app_for("@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tree = app.screen.query_one(GraphTree)
        await pilot.click(GraphTree, offset=(4, 4))  # border, rank 0, bs1, bs2, bs4
        await settle(pilot)
        assert tree.current is not None and tree.current.entry.name == "decode.bs4"
        assert app.screen.query_one(NodeTable).graph.entry.name == "decode.bs4"


@pilot_test
async def test_damaged_graph_shows_the_error_in_the_pane(tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(FIXTURES / "tiny-qwen3", root)
    path = graph_file(root, "decode.bs2")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes: the sha256 check fails
    path.write_bytes(bytes(data))
    app = app_for(root)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await press(pilot, "down")
        screen = app.screen
        pane = screen.query_one(NodePane)
        assert pane.error is not None and "graph does not match its sha256 (altered or damaged)" in pane.error
        assert "Cannot read graph 'decode.bs2' of rank 0" in plain(pane.shown)
        assert screen.query_one(NodeTable).row_count == 0
        assert "Summary unavailable" in plain(screen.query_one(SummaryPane).shown)
        await press(pilot, "down")  # the app is still alive and reads the next graph
        assert screen.query_one(NodeTable).graph.entry.name == "decode.bs4"


@pilot_test
async def test_damaged_session_is_shown_in_the_tree(tmp_path):
    root = tmp_path / "damaged"
    shutil.copytree(FIXTURES / "tiny-qwen3", root)
    session = root / "rank0" / "session.json"
    session.write_text(session.read_text() + " ")  # no longer the sha256 the catalog records
    app = app_for(root)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        (leaf,) = screen.query_one(GraphTree).root.children[0].children
        assert "unreadable:" in str(leaf.label) and "session does not match the catalog's sha256" in str(leaf.label)
        assert screen.query_one(NodeTable).row_count == 0
        summary = plain(screen.query_one(SummaryPane).shown)
        assert "Summary unavailable:" in summary and "Lint unavailable:" in summary
        await press(pilot, "c", "e")  # keys that need a graph say so instead of failing
        assert status(app) == "no graph is open to export" and isinstance(app.screen, BrowseScreen)


# -- diff ----------------------------------------------------------------------------------------


@pilot_test
async def test_diff_shows_status_the_changed_byte_and_environment(tmp_path):
    edited, change = edited_sample(tmp_path)
    app = app_for(FIXTURES / "tiny-qwen3", edited)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DiffScreen)
        assert screen.sub_title == "A tiny-qwen3  vs  B tiny-qwen3-edited"
        graphs = screen.query_one(GraphDiffList)
        assert [(g.name, g.status) for g in graphs.graphs] == [
            ("decode.bs1", Status.SAME),
            ("decode.bs2", Status.CHANGED),
            ("decode.bs4", Status.SAME),
        ]
        assert graphs.cursor_row == 1  # the first changed graph
        assert [plain(graphs.get_row_at(i)[0]).strip() for i in range(3)] == ["same", "changed", "same"]
        nodes = screen.query_one(NodeDiffTable)
        assert nodes.row_count == 1
        row = nodes.get_row_at(0)
        assert plain(row[1]).strip() == plain(row[2]).strip() == str(change["node"])
        assert plain(row[4]).strip() == f"param[{change['param']}]"
        compare = screen.query_one(NodeCompare)
        differing = [r for r in compare.rows if r.differs]
        assert [r.label for r in differing] == [f"param[{change['param']}]"]
        assert differing[0].a.startswith(change["old"]) and differing[0].b.startswith(change["new"])
        text = plain(compare.shown)
        start = change["offset"]
        assert f"param[{change['param']}] bytes {start}..{start}" in text
        assert f"{change['old']} -> {change['new']}" in text
        assert screen.query_one(EnvironmentDiff).changes == []
        assert status(app).startswith("archives differ: 3 graphs (2 same, 1 changed, 0 only in A, 0 only in B)")
        # enter goes graph -> differing nodes -> side by side; escape comes back
        assert screen.focused is graphs
        await press(pilot, "enter")
        assert screen.focused is nodes
        await press(pilot, "enter")
        assert screen.focused is compare
        await press(pilot, "escape", "escape")
        assert screen.focused is graphs
        await press(pilot, "up")  # a graph that is the same in both
        assert nodes.row_count == 0 and "The graph is the same in A and B" in plain(compare.shown)


@pilot_test
async def test_diff_lists_an_edge_of_another_kind_with_both_kinds(tmp_path):
    path = tmp_path / "tiny-qwen3-edge"
    shutil.copytree(FIXTURES / "tiny-qwen3", path)

    def make_programmatic(ir: GraphIR) -> None:
        ir._edges[(5, 6)] = EdgeData(from_port=1, to_port=0, type=1)

    edit_graph(path, "decode.bs2", make_programmatic)
    app = app_for(FIXTURES / "tiny-qwen3", path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nodes = app.screen.query_one(NodeDiffTable)
        assert nodes.row_count == 1 and nodes.border_subtitle == "0 nodes differ · 1 edge differs"
        row = [plain(cell).strip() for cell in nodes.get_row_at(0)]
        assert row == ["~", "5->6", "5->6", "edge", "plain -> programmatic from the programmatic port"]
        assert "of another kind in B" in plain(app.screen.query_one(NodeCompare).shown)


@pilot_test
async def test_diff_graph_sets_environment_and_keys(tmp_path):
    app = app_for(FIXTURES / "compiled-triton", FIXTURES / "symm-mem-ws1")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        graphs = screen.query_one(GraphDiffList)
        assert {(g.name, g.status) for g in graphs.graphs} == {
            ("compiled.fused", Status.ONLY_A),
            ("symm.allreduce", Status.ONLY_B),
        }
        env = screen.query_one(EnvironmentDiff)
        assert ("model.model", "gelu-mm-rowsum", "mm-symm-allreduce") in {(c.field, c.a, c.b) for c in env.changes}
        first = graphs.cursor_row
        await press(pilot, "n")
        assert graphs.cursor_row == 1 - first
        compare = screen.query_one(NodeCompare)
        side = "A" if graphs.current.status is Status.ONLY_A else "B"
        assert plain(compare.shown).strip() == f"The graph is only in {side}."
        await press(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen) and dict(app.screen.rows)["n"] == "Next graph that differs"
        await press(pilot, "escape", "q")
    assert app.return_code == 0


@pilot_test
async def test_identical_archives_diff_says_so():
    app = app_for(FIXTURES / "tiny-qwen3", "@sample")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert status(app).startswith("identical: 3 graphs (3 same")
        await press(pilot, "n")
        assert status(app) == "no graph differs"


@pilot_test
async def test_a_graph_instantiated_otherwise_makes_the_diff_say_the_archives_differ(tmp_path):
    from .archive_tools import flag_first_graph

    copy = tmp_path / "flagged"
    shutil.copytree(FIXTURES / "tiny-qwen3", copy)
    flag_first_graph(copy, 9)
    app = app_for(FIXTURES / "tiny-qwen3", copy)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert status(app).startswith("archives differ: 3 graphs (3 same")
        assert status(app).endswith("environment matches; 1 graph entry difference")
        env = app.screen.query_one(EnvironmentDiff)
        assert [(c.field, c.a, c.b) for c in env.changes] == [("rank 0 decode.bs1: instantiate_flags", "0x0", "0x9")]


# -- the command line ------------------------------------------------------------------------------


def test_missing_archive_is_one_line_and_exit_2(capsys):
    assert main(["/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err == "foundry-tui: error: /nonexistent: no such archive\n"


def test_bad_catalog_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "foundry-archive.json").write_text('{"format": "foundry-archive", "format_version": 99}')
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("foundry-tui: error: ") and "written by a newer Foundry" in err
    assert err.count("\n") == 1


def test_too_many_arguments_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["a", "b", "c"])
    assert exit_info.value.code == 2
    assert "give one ARCHIVE to browse, or two (A B) to diff" in capsys.readouterr().err


def test_no_argument_opens_the_sample():
    (opened,) = open_archives([])
    assert opened.archive.root == sample_path() and opened.label == "@sample (tiny-qwen3)"
    assert OpenedArchive.open(FIXTURES / "symm-mem-ws1").label == "symm-mem-ws1"


def test_node_pane_marks_undefined_parameter_bytes():
    from foundry.tui.describe import describe_node

    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs1")
    node = next(n for n in ir.kernels() if n.undefined)
    text = plain(describe_node(ir, node, rank=0))
    total = sum(length for _, length in node.undefined)
    assert f"{total} undefined bytes ignored by fingerprints" in text and "undefined +" in text
    clean = next(n for n in ir.kernels() if not n.undefined)
    assert "undefined" not in plain(describe_node(ir, clean, rank=0))


def test_node_pane_lists_the_nodes_dependencies_with_their_kinds():
    """SGLang's graphs mix plain edges and programmatic ones (the consumer may start before
    its producer ends): the pane names each neighbour and a programmatic edge's kind."""
    from foundry.tui.describe import DEPENDENCIES_LISTED, describe_node

    ir = Archive.open(FIXTURES / "sglang-decode").graph(0, "decode.bs1")
    (edge,) = [e for e in ir.edges() if e.src == 2]
    assert edge.data.kind == "programmatic from the programmatic port"
    text = plain(describe_node(ir, ir.node(2), rank=0))
    assert re.search(r"after   1 *\n", text) and f"before  {edge.dst} (programmatic from the programmatic port)" in text
    assert "after   none" in plain(describe_node(ir, ir.node(0), rank=0))  # the graph's first node
    fan = GraphIR("fan")
    fan.add_nodes([EmptyNode(i) for i in range(DEPENDENCIES_LISTED + 4)])
    fan.add_edges(Edge(i, DEPENDENCIES_LISTED + 3) for i in range(DEPENDENCIES_LISTED + 3))
    listed = plain(describe_node(fan, fan.node(DEPENDENCIES_LISTED + 3), rank=0))
    assert "after   0, 1, 2, 3, 4, 5, 6, 7, and 3 more" in listed
