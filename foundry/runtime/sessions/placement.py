"""Where a LOAD puts the region's memory, read from SAVE's allocation trace.

SAVE's region is a cursor that only moves forward, so the same requests in the
same order give the same addresses. Engines warm each shape up right before
capturing it, and at a production graph set some of those eager warm-ups take
new memory after the first capture began: SAVE's trace marks them ``late``,
between the graph pool's allocations (``capture``). A LOAD never captures, so
the captures' memory must be mapped for it, and the late allocations must land
where SAVE's trace put them:

- a LOAD that repeats the warm-ups maps every range the captures used at once
  and leaves a hole for each late allocation; its own warm-ups then make them
  again, and the hook places each in its hole, provided it asks for the same
  bytes in the same order (the first that does not is a divergence, refused
  naming both allocations);
- a LOAD that restores the warm-up's bytes instead maps the late allocations
  too: nothing of it allocates them again.

Everything here is pure: the hook executes the plan (``Hook.restore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from foundry.errors import ArchiveError, DriftError

LATE = "late"


class TraceEntry(Protocol):
    """One allocation of a trace: SAVE's (``AllocationRecord``) or the live hook's (``Allocation``)."""

    order: int
    offset: int
    size: int
    request: int
    phase: str


@dataclass(frozen=True)
class RestorePlan:
    """What a LOAD maps itself (``ranges``, ``(offset, size)``) and which of SAVE's late
    allocations it makes again (``late``): together they tile ``[start, final_offset)``.
    ``follow``: the program's allocations until the session finishes must be exactly
    those (a LOAD repeating the warm-ups); otherwise they are the program's own."""

    start: int
    final_offset: int
    ranges: tuple[tuple[int, int], ...]
    late: tuple[TraceEntry, ...]
    follow: bool


def late_allocations(trace: Sequence[TraceEntry]) -> list[TraceEntry]:
    """SAVE's allocations between captures, in call order."""
    return [a for a in trace if a.phase == LATE]


def restore_plan(trace: Sequence[TraceEntry], start: int, final_offset: int, *, follow: bool) -> RestorePlan:
    """The plan for a LOAD whose cursor stands at ``start``: with ``follow`` (the warm-ups
    repeated) SAVE's late allocations at or above ``start`` are left for the program to
    make again; without it everything up to ``final_offset`` is mapped."""
    late = [a for a in late_allocations(trace) if a.offset >= start] if follow else []
    ranges: list[tuple[int, int]] = []
    at = start
    for a in late:  # the cursor only moved forward: ascending, never overlapping
        if a.offset < at or a.size <= 0 or a.offset + a.size > final_offset:
            raise ArchiveError("the region's allocation trace is not in ascending order", field="region.trace",
                               found=f"#{a.order}: {a.size} bytes at offset {a.offset}")  # fmt: skip
        if a.offset > at:
            ranges.append((at, a.offset - at))
        at = a.offset + a.size
    if at < final_offset:
        ranges.append((at, final_offset - at))
    return RestorePlan(start, max(final_offset, start), tuple(ranges), tuple(late), follow)


def check_followed(plan: RestorePlan, live: Sequence[TraceEntry], *, complete: bool) -> None:
    """Refuse, naming both allocations, a LOAD whose allocations since the restore
    (``live``: the live trace's late entries) left SAVE's late allocations; with
    ``complete`` (the session finished) also one that made fewer of them."""
    for index, made in enumerate(live):
        want = plan.late[index] if index < len(plan.late) else None
        if want is None:
            raise DriftError(
                f"allocation #{made.order} of {made.request} bytes, made between captures, has no counterpart in "
                f"SAVE's trace: SAVE made {len(plan.late)} allocations between its captures",
                field="region.trace",
                found=f"#{made.order}: {made.request} bytes",
            )
        if made.request != want.request or made.offset != want.offset:
            raise DriftError(
                f"allocation #{made.order}, made between captures, diverges from SAVE's trace",
                field="region.trace",
                expected=f"SAVE's #{want.order}: {want.request} bytes at offset {want.offset}",
                found=f"#{made.order}: {made.request} bytes at offset {made.offset}",
            )
    if complete and len(live) < len(plan.late):
        want = plan.late[len(live)]
        raise DriftError(
            f"the LOAD made {len(live)} of SAVE's {len(plan.late)} allocations between captures",
            field="region.trace",
            expected=f"SAVE's #{want.order}: {want.request} bytes at offset {want.offset}",
            found="none",
        )
