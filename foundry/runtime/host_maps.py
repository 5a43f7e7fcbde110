"""What this process maps on the host (``/proc/self/maps``).

An address mapped here is this process's own (a return address, a heap pointer, a
pinned buffer) and means nothing in another process: SAVE marks kernel parameter
words that hold one undefined (:func:`foundry.graphir.passes.definedness.mark_host_words`),
and device globals that hold one are recorded as the process's own
(:mod:`foundry.runtime.code.module_globals`).
"""

from __future__ import annotations

from foundry.graphir.regions import AddressRanges


def host_ranges(maps: str | None = None, *, accessible: bool = False) -> AddressRanges:
    """The address ranges mapped in this process (``/proc/self/maps``); with
    ``accessible``, only those the host can read, write or execute: the CUDA driver
    keeps device addresses out of host use with inaccessible (``---p``) reservations."""
    if maps is None:
        with open("/proc/self/maps") as f:
            maps = f.read()
    ranges = []
    for line in maps.splitlines():
        span, _, rest = line.partition(" ")
        if accessible and rest[:3] == "---":
            continue
        start, _, end = span.partition("-")
        ranges.append((int(start, 16), int(end, 16)))
    return AddressRanges(ranges)
