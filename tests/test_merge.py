"""Merging the runs of one SAVE (foundry/runtime/launch/merge.py), on the SAVE/SAVE2 pair
captured with the hook on the H200 (tests/fixtures/saveload-a and -b): what two SAVEs
agree on, the bytes they disagree on marked, runs that allocated differently refused."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from foundry.archive import Archive
from foundry.errors import CaptureError
from foundry.graphir.fingerprint import topology_key
from foundry.runtime.launch.merge import merge_saves

from .archive_tools import edit_json
from .conftest import SAVE_A, SAVE_B


def test_two_saves_made_the_same_allocations_and_graphs(pair):
    a, b = pair
    ra, rb = a.session(0).region, b.session(0).region
    assert (ra.base, ra.final_offset, ra.trace) == (rb.base, rb.final_offset, rb.trace)
    assert ra.warmup_allocations == 11 and ra.final_offset == 174_063_616
    for entry in a.entries(0):
        ga, gb = a.graph(0, entry), b.graph(0, entry.name)
        assert entry.topology == b.entry(0, entry.name).topology == topology_key(ga)
        assert [n.launch for n in ga.kernels()] == [n.launch for n in gb.kernels()]
        assert [(o.key, o.region, o.region_offset) for o in ga.operands] == [
            (o.key, o.region, o.region_offset) for o in gb.operands
        ]


def test_two_save_runs_merge_into_identical_fingerprints(tmp_path):
    """SAVE and SAVE2 from the H200 disagree on leftover bytes; merging each with the
    other marks exactly those, and then both fingerprint the same."""

    a, b, a2 = tmp_path / "a", tmp_path / "b", tmp_path / "a2"
    for src, dst in ((SAVE_A, a), (SAVE_B, b), (SAVE_A, a2)):
        shutil.copytree(src, dst)
    before = [e.fingerprint for e in Archive.open(a).entries(0)]
    assert before != [e.fingerprint for e in Archive.open(b).entries(0)]
    stats = merge_saves(a, b)
    merge_saves(b, a2)
    assert stats["graphs"] == 3 and stats["undefined_bytes"] > 0
    merged_a, merged_b = Archive.open(a), Archive.open(b)
    assert [e.fingerprint for e in merged_a.entries(0)] == [e.fingerprint for e in merged_b.entries(0)]
    verify = subprocess.run([sys.executable, "-m", "foundry", "archive", "verify", str(a)], capture_output=True,
                            text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    diff = subprocess.run([sys.executable, "-m", "foundry", "archive", "diff", str(a), str(b)], capture_output=True,
                          text=True)  # fmt: skip
    assert diff.returncode == 0, diff.stdout


def test_merging_refuses_runs_that_allocated_differently(tmp_path):

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(SAVE_A, a)
    shutil.copytree(SAVE_B, b)
    edit_json(b / "rank0" / "session.json", lambda s: s["region"].update(final_offset=1 << 30), root=b)
    with pytest.raises(CaptureError, match="allocated differently"):
        merge_saves(a, b)
    assert [e.fingerprint for e in Archive.open(a).entries(0)] == [
        e.fingerprint for e in Archive.open(SAVE_A).entries(0)
    ]
