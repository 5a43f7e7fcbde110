"""The later runs of a SAVE of several ranks (foundry/runtime/launch/rank_runs.py): every
rank's launcher runs its rank again, one merges, a failing rank stops the others."""

from __future__ import annotations

import shutil
import sys

import pytest

from foundry.archive import Archive
from foundry.errors import FoundryError
from foundry.runtime.launch import launcher
from foundry.runtime.launch.merge import merge_saves

from .conftest import SAVE_A, SAVE_B


def test_a_save_of_several_ranks_needs_a_fresh_save_id_before_it_starts(tmp_path, with_hook, monkeypatch):
    monkeypatch.delenv("FOUNDRY_SAVE_ID", raising=False)
    config = launcher.RunConfig("save", tmp_path / "a", rank=1, world_size=2)
    with pytest.raises(FoundryError, match="SAVE id is 1-64"):
        launcher.run(config, [sys.executable, "-c", "raise SystemExit('must not run')"])


# A rank's program standing in for the application: it writes its rank of a world-size-2
# SAVE from a real H200 SAVE, the first run from saveload-a, later runs from saveload-b.
RANK_SAVE = """
import os, sys, time
from foundry.archive import Archive
from foundry.archive.writer import ArchiveWriter
rank = int(os.environ["FOUNDRY_RANK"])
source = Archive.open(sys.argv[2] if os.environ.get("FOUNDRY_SAVE_FIRST_RUN") else sys.argv[1])
writer = ArchiveWriter(os.environ["FOUNDRY_ARCHIVE"], environment=source.catalog.environment, world_size=2,
                       save_id=os.environ["FOUNDRY_SAVE_ID"], overwrite=os.environ["FOUNDRY_OVERWRITE"] == "1")
part = writer.rank(rank)
part.set_region(source.session(0).region)
for entry in source.entries(0):
    part.add_graph(source.graph(0, entry.name))
part.seal()
writer.commit()
if os.environ.get("FOUNDRY_SAVE_FIRST_RUN") and os.environ.get("FAIL_RANK"):
    if rank == int(os.environ["FAIL_RANK"]):
        sys.exit(3)
    time.sleep(120)  # as a rank whose peer is gone: it would wait for it
"""


def test_a_save_of_two_ranks_runs_both_again_and_marks_them_once(tmp_path, with_hook, monkeypatch):
    """Two ranks' launchers (threads here, a process each in use) run their ranks twice;
    the second runs write one shared archive, and exactly one launcher merges it."""
    root = tmp_path / "a"
    codes, logs = two_launchers(root, monkeypatch, "two-ranks")
    assert codes == {0: 0, 1: 0}, logs
    merged = [line for r in (0, 1) for line in logs[r] if "merged run 2 of every rank" in line]
    found_done = [line for r in (0, 1) for line in logs[r] if "merged by another rank" in line]
    assert len(merged) == 1 and len(found_done) == 1, logs
    archive = Archive.open(root)
    assert archive.ranks == [0, 1] and not list(tmp_path.glob(".a.run*"))
    single = tmp_path / "single"  # the same pair merged in one process marks the same bytes
    shutil.copytree(SAVE_A, single)
    merge_saves(single, SAVE_B)
    expected = [e.fingerprint for e in Archive.open(single).entries(0)]
    assert expected != [e.fingerprint for e in Archive.open(SAVE_A).entries(0)]
    for r in (0, 1):
        assert [e.fingerprint for e in archive.entries(r)] == expected


def two_launchers(root, monkeypatch, save_id: str) -> tuple[dict[int, int], dict[int, list[str]]]:
    import threading

    monkeypatch.setenv("FOUNDRY_SAVE_ID", save_id)
    logs, codes = {0: [], 1: []}, {}

    def rank(r: int) -> None:
        config = launcher.RunConfig("save", root, rank=r, world_size=2)
        try:
            codes[r] = launcher.run(config, [sys.executable, "-c", RANK_SAVE, str(SAVE_A), str(SAVE_B)],
                                    log=logs[r].append)  # fmt: skip
        except FoundryError as err:
            codes[r], logs[r] = -1, [*logs[r], str(err)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return codes, logs


def test_a_rank_failing_its_second_run_stops_the_other_and_leaves_the_first_archive(tmp_path, with_hook,
                                                                                     monkeypatch):  # fmt: skip
    import time

    monkeypatch.setenv("FAIL_RANK", "1")
    started = time.monotonic()
    codes, logs = two_launchers(tmp_path / "a", monkeypatch, "fails")
    assert codes[1] == 3 and codes[0] != 0, logs
    assert time.monotonic() - started < 100  # rank 0's program (sleeping 120 s) was stopped
    assert (tmp_path / "a" / ".failed.fails").exists() and not list(tmp_path.glob(".a.run*"))
    first = Archive.open(tmp_path / "a")  # the first run's archive, unmarked
    assert [e.fingerprint for e in first.entries(1)] == [e.fingerprint for e in Archive.open(SAVE_A).entries(0)]
    config = launcher.RunConfig("save", tmp_path / "a", rank=0, world_size=2, overwrite=True)
    with pytest.raises(FoundryError, match="give the new SAVE a new FOUNDRY_SAVE_ID"):  # the id is spent
        launcher.run(config, [sys.executable, "-c", "raise SystemExit('must not run')"])


def test_an_id_too_long_for_the_later_runs_is_refused_before_anything_runs(tmp_path, with_hook, monkeypatch):
    monkeypatch.setenv("FOUNDRY_SAVE_ID", "x" * 62)
    config = launcher.RunConfig("save", tmp_path / "a", rank=0, world_size=2)
    with pytest.raises(FoundryError, match="1-64"):
        launcher.run(config, [sys.executable, "-c", "raise SystemExit('must not run')"])
    assert not (tmp_path / "a").exists()
