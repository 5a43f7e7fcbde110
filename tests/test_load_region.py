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


def test_the_first_copy_leaves_out_the_holes_the_program_fills_later():
    from foundry.runtime.sessions.load_region import outside

    assert outside(0, 100, [(10, 5), (50, 10)]) == [(0, 10), (15, 35), (60, 40)]
    assert outside(10, 10, [(0, 12), (18, 5)]) == [(12, 6)]  # holes reaching over either end
    assert outside(0, 100, [(0, 100)]) == [] and outside(0, 10, [(20, 5)]) == [(0, 10)]


def test_at_finish_saves_bytes_go_again_into_the_holes_and_the_named_ranges_within_the_warmup_bytes(tmp_path):
    import types

    from foundry.archive.schema import AllocationRecord
    from foundry.runtime.native.hook import Allocation
    from foundry.runtime.sessions.placement import restore_plan

    region, report = restore_of(saved_archive(tmp_path / "a"))
    warm = region.record.warmup_bytes
    start, end = warm.offset, warm.offset + warm.size
    hole = Allocation(7, start + 512, 256, 256, False, phase="late")  # as the live trace has it after the restore
    freed = Allocation(8, start + 2048, 256, 256, True, phase="late")  # made again, then freed: not copied into
    saved = [AllocationRecord(a.order, a.offset, a.size, a.request, "between") for a in (hole, freed)]
    region.placement = restore_plan(saved, start, end, warmups_repeated=False)
    region.again = [(start - 64, 128), (start + 1024, 64), (end + 4096, 64)]  # below, inside, beyond the bytes
    copied: list[tuple[int, int]] = []
    region._copy_back = lambda data, offset, size: copied.append((offset, size))
    region.hook = types.SimpleNamespace(trace=lambda: [hole, freed])
    region._kept = WARMUP
    region.restore_again()
    assert copied == [(start + 512, 256), (start, 64), (start + 1024, 64)] and report["restored_again"] == 4
    assert region._kept is None  # the bytes freed
    region.restore_again()  # a second call copies nothing
    assert len(copied) == 3
