"""LOAD's region on the CPU (foundry/runtime/sessions/load_region.py): the warm-up bytes
read and checked on a thread from the session's start. The hook and the GPU are not here:
the parts below touch neither (``hook`` is None)."""

from __future__ import annotations

import pytest

from foundry.archive import Archive
from foundry.errors import ArchiveError
from foundry.runtime.sessions.load_region import RegionRestore

from .hostile import WARMUP, saved_archive


def restore_of(root, warmup: str = "restore") -> tuple[RegionRestore, dict]:
    archive = Archive.open(root)
    report: dict = {}
    return RegionRestore(None, archive, 0, 0, archive.session(0).region, warmup, report), report


def test_the_warmup_bytes_are_read_on_a_thread_once_and_taken_once(tmp_path):
    region, report = restore_of(saved_archive(tmp_path / "a"))
    region.prefetch()
    reading = region._read
    region.prefetch()  # a second call starts nothing more
    assert reading is not None and region._read is reading
    assert region.warmup_data() == WARMUP and report["warmup_read_s"] >= 0
    assert region._read is None  # handed over: the restore's copy is the last holder
    assert region.warmup_data() == WARMUP  # asked again, read again


def test_a_damaged_warmup_file_read_ahead_is_refused_when_the_restore_takes_it(tmp_path):
    root = saved_archive(tmp_path / "a")
    region, report = restore_of(root)
    (root / "rank0" / "warmup.bin").write_bytes(b"\xff" + WARMUP[1:])  # the same size, one byte changed
    region.prefetch()
    with pytest.raises(ArchiveError, match="warm-up bytes does not match its record") as err:
        region.warmup_data()
    assert err.value.field == "sha256" and "warmup_read_s" not in report


def test_only_a_load_restoring_the_warmup_reads_its_bytes_ahead(tmp_path):
    region, _ = restore_of(saved_archive(tmp_path / "a"), warmup="replay")
    region.prefetch()
    assert region._read is None
