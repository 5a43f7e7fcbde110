"""One archive written by two processes, a rank each: the catalog is written once,
by whichever completes the set, only from parts of the same SAVE that agree."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from foundry.archive import Archive
from foundry.archive.rank_parts import RankPart, commit_when_complete, write_part
from foundry.archive.schema import CATALOG_FILE
from foundry.archive.writer import ArchiveWriter
from foundry.errors import ArchiveError, FoundryError

from .conftest import FIXTURES

SAVE_A = FIXTURES / "saveload-a"
GRAPHS = {0: "decode.bs1", 1: "decode.bs8"}

# A rank's process: its graph from a real H200 SAVE, written under the shared SAVE id.
CHILD = """
import json, sys
from foundry.archive import Archive
from foundry.archive.writer import ArchiveWriter
root, rank, save_id, graph = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
source = Archive.open(sys.argv[5])
writer = ArchiveWriter(root, environment=source.catalog.environment, world_size=2, save_id=save_id,
                       model={"recipe": "tiny"})
writer.rank(rank).add_graph(source.graph(0, graph))
writer.rank(rank).seal()
print(json.dumps({"committed": writer.commit() is not None}))
"""


def run_rank(root, rank: int, save_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(rank), save_id, GRAPHS[rank], str(SAVE_A)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_two_processes_write_one_archive_and_exactly_one_commits(tmp_path):
    root = tmp_path / "a"
    procs = [run_rank(root, rank, "save-1") for rank in (0, 1)]  # concurrently
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert sorted(r["committed"] for r in results) == [False, True]
    archive = Archive.open(root)
    assert archive.ranks == [0, 1] and archive.catalog.world_size == 2 and archive.catalog.model == {"recipe": "tiny"}
    for rank, graph in GRAPHS.items():
        assert archive.graph(rank, graph).name == graph


def test_a_rank_that_never_finished_leaves_no_archive(tmp_path):
    root = tmp_path / "a"
    proc = run_rank(root, 0, "save-1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and json.loads(out) == {"committed": False}, err
    assert not (root / CATALOG_FILE).exists()
    with pytest.raises(FoundryError):
        Archive.open(root)


def test_a_part_left_by_an_earlier_save_does_not_complete_the_set(tmp_path):
    root = tmp_path / "a"
    for rank in (0, 1):
        assert run_rank(root, rank, "save-1").wait(timeout=120) == 0
    (root / CATALOG_FILE).unlink()  # a new SAVE into the same directory: rank 1 has not finished yet
    out, _ = run_rank(root, 0, "save-2").communicate(timeout=120)
    assert json.loads(out) == {"committed": False} and not (root / CATALOG_FILE).exists()


def test_ranks_saved_in_different_environments_are_refused(tmp_path):
    root = tmp_path / "a"
    source = Archive.open(SAVE_A)
    for rank in (0, 1):
        env = source.catalog.environment
        if rank == 1:
            env = msgspec.structs.replace(env, gpu_name="another GPU")
        writer = ArchiveWriter(root, environment=env, world_size=2, save_id="s")
        writer.rank(rank).add_graph(source.graph(0, GRAPHS[rank]))
        sealed = writer.rank(rank).seal()
        write_part(root, RankPart("s", 2, sealed, env))
    with pytest.raises(ArchiveError, match="different environments"):
        commit_when_complete(root, 2, "s")
    assert not (root / CATALOG_FILE).exists()


def test_a_save_id_is_used_once_and_stays_inside_the_archive(tmp_path):
    root = tmp_path / "a"
    for rank in (0, 1):
        assert run_rank(root, rank, "save-1").wait(timeout=120) == 0
    again = run_rank(root, 0, "save-1")
    _, err = again.communicate(timeout=120)
    assert again.returncode != 0 and "committed here already" in err
    source = Archive.open(SAVE_A)
    with pytest.raises(ArchiveError, match="SAVE id is 1-64") as refused:
        ArchiveWriter(tmp_path / "b", environment=source.catalog.environment, world_size=2, save_id="../x")
    assert refused.value.field == "FOUNDRY_SAVE_ID"


def test_an_id_that_failed_or_was_committed_is_refused(tmp_path):
    from foundry.archive.rank_parts import check_save_id

    check_save_id(tmp_path, "fresh")
    (tmp_path / ".failed.broken").write_bytes(b"")
    (tmp_path / ".committed.done").write_bytes(b"")
    with pytest.raises(ArchiveError, match="failed here before"):
        check_save_id(tmp_path, "broken")
    with pytest.raises(ArchiveError, match="committed here already"):
        check_save_id(tmp_path, "done")
