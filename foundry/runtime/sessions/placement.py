"""Where a LOAD puts the region's memory, read from SAVE's allocation trace.

SAVE's region is a cursor that only moves forward, so the same requests in the
same order give the same addresses. Engines warm each shape up right before
capturing it, and at a production graph set some allocations take new memory
after the first capture began, between the graph pool's (``capture``): those of
the eager warm-ups (``late``), and the program's own between its warm-ups, say a
buffer an attention backend creates for the next shape (``between``). Warm-ups
allocate from a pool of their own (``Session.warmup``), so the program's own
allocations land alike whether the warm-ups ran or not. A LOAD never captures,
so the captures' memory is mapped for it, and what it allocates again must land
where SAVE's trace put it:

- a LOAD that repeats the warm-ups maps every range the captures used at once
  and leaves a hole for each late and between allocation; its warm-ups and its
  own code then make them again, and the hook places each in its hole, provided
  it asks for the same bytes in the same order (the first that does not is a
  divergence, refused naming both allocations);
- a LOAD that restores the warm-up's bytes instead maps the late allocations
  too (nothing of it makes them) and leaves holes for the between ones only.

Everything here is pure: the hook executes the plan (``Hook.restore``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from foundry.errors import ArchiveError, DriftError

LATE = "late"  # between captures, in a warm-up
BETWEEN = "between"  # between captures, outside the warm-ups: the program's own


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
    """SAVE's allocations between captures (the warm-ups' and the program's), in call order."""
    return [a for a in trace if a.phase in (LATE, BETWEEN)]


def between_phase(phase: str, order: int, warmups: Sequence[tuple[int, int]]) -> str:
    """The phase SAVE records for the hook's allocation number ``order``: a late one outside
    every warm-up (``warmups``: their ``[first, end)`` allocation numbers) is ``between``."""
    if phase != LATE or any(first <= order < end for first, end in warmups):
        return phase
    return BETWEEN


def restore_plan(trace: Sequence[TraceEntry], start: int, final_offset: int, *, warmups_repeated: bool) -> RestorePlan:
    """The plan for a LOAD whose cursor stands at ``start``: SAVE's allocations at or above
    ``start`` that the LOAD makes again (all between captures when it repeats the
    warm-ups, else the program's own) are left for it; everything else up to
    ``final_offset`` is mapped. It follows SAVE's trace when it makes any again."""
    again = (LATE, BETWEEN) if warmups_repeated else (BETWEEN,)
    late = [a for a in trace if a.phase in again and a.offset >= start]
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
    return RestorePlan(start, max(final_offset, start), tuple(ranges), tuple(late), warmups_repeated or bool(late))


def check_followed(plan: RestorePlan, live: Sequence[TraceEntry], *, complete: bool) -> None:
    """Refuse, naming both allocations, a LOAD whose allocations since the restore
    (``live``: the live trace's late entries) left SAVE's late allocations; with
    ``complete`` (the session finished) also one that made fewer of them."""
    for index, made in enumerate(live):
        want = plan.late[index] if index < len(plan.late) else None
        if want is None:
            raise DriftError(
                f"allocation #{made.order} of {made.request} bytes, made between captures, has no counterpart in "
                f"SAVE's trace: SAVE made {len(plan.late)} allocations between its captures that this LOAD makes again",
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
            f"the LOAD made {len(live)} of the {len(plan.late)} allocations between captures it makes again",
            field="region.trace",
            expected=f"SAVE's #{want.order}: {want.request} bytes at offset {want.offset}",
            found="none",
        )
