"""Snapshot tests: what the main screens look like at 120x40 (pytest-textual-snapshot).

Update after an intended change with ``pytest tests/test_tui_snapshots.py --snapshot-update``
and review the SVGs under ``tests/__snapshots__/`` before committing them. Labels
never include absolute paths (archives are named by their directory), so the
snapshots do not depend on where the repository or the temporary directory is.
"""

from __future__ import annotations

from .conftest import FIXTURES
from .test_tui import app_for, edited_sample, settle

SIZE = (120, 40)


def steps(*keys: str):
    """A ``run_before`` that lets workers finish, then presses ``keys`` one by one, settling after each."""

    async def run(pilot) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run


def test_browse_sample(snap_compare):
    """The first screen a new user sees: the sample's graphs, the nodes of decode.bs1, node 0."""
    assert snap_compare(app_for("@sample"), terminal_size=SIZE, run_before=steps())


def test_node_pane_collective(snap_compare):
    """A symmetric-memory all-reduce node: identity, launch, parameters with regions and ABI roles."""
    app = app_for(FIXTURES / "symm-mem-ws1")
    assert snap_compare(app, terminal_size=SIZE, run_before=steps("enter", "c", "enter"))


def test_summary_pane(snap_compare):
    """Kernel histogram, collectives by kind, regions with sizes and lint findings."""
    app = app_for(FIXTURES / "symm-mem-ws1")
    assert snap_compare(app, terminal_size=SIZE, run_before=steps("s"))


def test_diff_one_changed_byte(snap_compare, tmp_path):
    """Diff mode: graph statuses, the one differing node, the changed parameter highlighted."""
    edited, _ = edited_sample(tmp_path)
    app = app_for(FIXTURES / "tiny-qwen3", edited)
    assert snap_compare(app, terminal_size=SIZE, run_before=steps())


def test_diff_environment(snap_compare):
    """Diff mode with different models: graphs only in A / only in B and the environment diff."""
    app = app_for(FIXTURES / "compiled-triton", FIXTURES / "symm-mem-ws1")
    assert snap_compare(app, terminal_size=SIZE, run_before=steps())


def test_help_screen(snap_compare):
    """The help screen over the browse screen."""
    assert snap_compare(app_for("@sample"), terminal_size=SIZE, run_before=steps("question_mark"))
