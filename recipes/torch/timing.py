"""Replay timing with CUDA events, shared by the recipe's ``--bench`` and bench/."""

from __future__ import annotations

import statistics
from collections.abc import Callable

# ~2 ms at the H200's 1980 MHz: longer than the host takes to launch a 2,000-node graph
SLEEP_CYCLES = 4_000_000


def median_ms(launch: Callable[[], object], *, busy: bool, repeats: int, sleep_cycles: int = SLEEP_CYCLES) -> float:
    """Median milliseconds between CUDA events around one ``launch()``.

    On an idle stream the start event fires at once, so the host's launch of the
    graph is counted; ``busy`` queues a sleep kernel of ``sleep_cycles`` first, so
    that the launch is queued while the GPU still sleeps and only the execution is
    timed."""
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if busy:
            torch.cuda._sleep(sleep_cycles)
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
