"""Where a LOAD puts the region's memory (foundry.runtime.sessions.placement): the plan from
SAVE's trace, and the refusals when a LOAD's allocations between captures depart from it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from msgspec.structs import replace

from foundry.archive.schema import AllocationRecord
from foundry.errors import ArchiveError, DriftError
from foundry.runtime.sessions.placement import between_phase, check_followed, late_allocations, restore_plan

MiB = 1 << 20
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def trace(*entries: tuple[int, str]) -> list[AllocationRecord]:
    """Allocations of the given sizes (MiB) and phases, back to back from offset 0."""
    out, at = [], 0
    for order, (mib, phase) in enumerate(entries):
        out.append(AllocationRecord(order, at, mib * MiB, mib * MiB - 512, phase))
        at += mib * MiB
    return out


# warm-up, the first capture's pool, a shape's own memory between captures, the next pool, ...
SAVE = trace((4, "warmup"), (2, "warmup"), (20, "capture"), (2, "late"), (12, "capture"), (6, "late"), (8, "capture"))
START, FINAL = 6 * MiB, 54 * MiB


def covered(plan) -> list[tuple[int, int]]:
    return sorted([*plan.ranges, *((a.offset, a.size) for a in plan.late)])


def test_a_load_repeating_the_warmups_maps_around_saves_late_allocations():
    plan = restore_plan(SAVE, START, FINAL, warmups_repeated=True)
    assert [a.order for a in plan.late] == [3, 5]
    assert plan.ranges == ((6 * MiB, 20 * MiB), (28 * MiB, 12 * MiB), (46 * MiB, 8 * MiB))
    spans = covered(plan)  # ranges and holes tile [start, final) exactly
    assert spans[0][0] == START and all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))
    assert spans[-1][0] + spans[-1][1] == FINAL


def test_a_load_restoring_the_warmup_bytes_maps_everything():
    plan = restore_plan(SAVE, START, FINAL, warmups_repeated=False)
    assert plan.ranges == ((START, FINAL - START),) and plan.late == () and not plan.follow


def test_a_trace_without_late_allocations_maps_one_range_and_still_follows():
    plan = restore_plan(trace((4, "warmup"), (8, "capture")), 4 * MiB, 12 * MiB, warmups_repeated=True)
    assert plan.ranges == ((4 * MiB, 8 * MiB),) and plan.follow


def test_the_same_allocations_again_pass():
    plan = restore_plan(SAVE, START, FINAL, warmups_repeated=True)
    live = [replace(a, order=a.order + 40) for a in late_allocations(SAVE)]  # the LOAD's own ordinals
    check_followed(plan, live, complete=True)
    check_followed(plan, live[:1], complete=False)  # a prefix, mid-way through the warm-ups


def test_an_allocation_of_another_size_is_refused_naming_both():
    plan = restore_plan(SAVE, START, FINAL, warmups_repeated=True)
    live = late_allocations(SAVE)
    live = [live[0], replace(live[1], order=17, request=live[1].request + 4096, offset=FINAL)]
    with pytest.raises(DriftError, match=r"allocation #17, made between captures, diverges") as info:
        check_followed(plan, live, complete=False)
    assert info.value.field == "region.trace"
    assert info.value.expected == f"SAVE's #5: {6 * MiB - 512} bytes at offset {40 * MiB}"
    assert info.value.found == f"#17: {6 * MiB - 512 + 4096} bytes at offset {FINAL}"


def test_one_allocation_too_many_is_refused():
    plan = restore_plan(SAVE, START, FINAL, warmups_repeated=True)
    extra = AllocationRecord(9, FINAL, MiB, MiB, "late")
    with pytest.raises(DriftError, match=r"#9 of 1048576 bytes, made between captures, has no counterpart.*made 2"):
        check_followed(plan, [*late_allocations(SAVE), extra], complete=False)


def test_a_finished_load_that_made_fewer_is_refused_naming_the_first_missing():
    plan = restore_plan(SAVE, START, FINAL, warmups_repeated=True)
    with pytest.raises(DriftError, match=r"made 1 of the 2 allocations between captures it makes again") as info:
        check_followed(plan, late_allocations(SAVE)[:1], complete=True)
    assert info.value.expected == f"SAVE's #5: {6 * MiB - 512} bytes at offset {40 * MiB}"


# the same history with the program's own allocation between its warm-ups at offset 26 MiB
MIXED = [replace(a, phase="between") if a.order == 3 else a for a in SAVE]


def test_a_load_restoring_the_warmup_bytes_leaves_holes_for_the_programs_own_allocations_only():
    plan = restore_plan(MIXED, START, FINAL, warmups_repeated=False)
    assert [a.order for a in plan.late] == [3] and plan.follow  # the warm-ups' (#5) is mapped with the rest
    assert plan.ranges == ((6 * MiB, 20 * MiB), (28 * MiB, 26 * MiB))
    check_followed(plan, [replace(MIXED[3], order=12)], complete=True)
    with pytest.raises(DriftError, match=r"made 0 of the 1 allocations between captures it makes again"):
        check_followed(plan, [], complete=True)


def test_a_load_repeating_the_warmups_makes_both_kinds_again():
    plan = restore_plan(MIXED, START, FINAL, warmups_repeated=True)
    assert [a.order for a in plan.late] == [3, 5]


def test_a_late_allocation_outside_every_warmup_is_the_programs_own():
    warmups = [(3, 5), (7, 9)]  # [first, end) allocation numbers of two warm-ups between captures
    assert [between_phase("late", n, warmups) for n in (2, 3, 4, 5, 6, 8, 9)] == [
        "between", "late", "late", "between", "between", "late", "between"]  # fmt: skip
    assert between_phase("capture", 2, warmups) == "capture" and between_phase("warmup", 0, []) == "warmup"


def test_a_trace_out_of_order_is_refused():
    bad = [*SAVE[:3], SAVE[5], SAVE[3]]
    with pytest.raises(ArchiveError, match="ascending"):
        restore_plan(bad, START, FINAL, warmups_repeated=True)


def fixture_trace() -> tuple[dict, list[AllocationRecord]]:
    """SGLang's 36-graph history at the qwen3-8b shape, as SAVEd on the H200 test machine."""
    record = json.loads((FIXTURES / "traces" / "sglang-qwen3-8b-36.json").read_text())
    return record, [AllocationRecord(*row) for row in record["trace"]]


def test_sglangs_36_graph_history_leaves_holes_for_its_two_late_allocations():
    record, saved = fixture_trace()
    plan = restore_plan(saved, record["warmup_offset"], record["final_offset"], warmups_repeated=True)
    assert [(a.order, a.request) for a in plan.late] == [(242, 2 * MiB), (243, 2 * MiB)]
    spans = covered(plan)
    assert spans[0][0] == record["warmup_offset"] and sum(size for _, size in spans) == (
        record["final_offset"] - record["warmup_offset"]
    )
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))
    check_followed(plan, late_allocations(saved), complete=True)  # the same warm-ups again
    fast = restore_plan(saved, record["warmup_offset"], record["final_offset"], warmups_repeated=False)
    assert fast.ranges == ((record["warmup_offset"], record["final_offset"] - record["warmup_offset"]),)


def test_sglangs_history_with_another_bs128_warmup_is_refused_naming_saves_allocation():
    record, saved = fixture_trace()
    plan = restore_plan(saved, record["warmup_offset"], record["final_offset"], warmups_repeated=True)
    first, second = late_allocations(saved)
    grown = replace(second, order=250, request=4 * MiB, offset=record["final_offset"])
    with pytest.raises(DriftError, match=r"allocation #250, made between captures, diverges") as info:
        check_followed(plan, [first, grown], complete=False)
    assert info.value.expected == f"SAVE's #243: {2 * MiB} bytes at offset {second.offset}"


def test_a_session_holding_the_programs_own_allocations_is_format_5_and_an_older_claim_is_refused(tmp_path):
    import shutil

    from foundry.archive import Archive
    from foundry.archive.schema import RegionRecord, session_version

    from .archive_tools import edit_json

    region = RegionRecord(0, 64 * MiB, 54 * MiB, len(MIXED), "0" * 64, 2, 6 * MiB, tuple(MIXED))
    assert session_version([], region=region) == 5 and session_version([], region=replace(region, trace=SAVE)) == 1
    root = tmp_path / "a"
    shutil.copytree(FIXTURES / "saveload-a", root)

    def between(session: dict) -> None:  # version 1 kept, as an older Foundry would read it
        session["region"]["trace"][-1][4] = "between"

    edit_json(root / "rank0" / "session.json", between, root=root)
    with pytest.raises(ArchiveError, match="fields of format version 5") as info:
        Archive.open(root).session(0)
    assert info.value.field == "format_version"
