"""Whether a LOAD may skip SGLang's eager warm-up forwards.

SGLang runs two eager forwards per shape before capturing it. A LOAD that skips
them (``--warmup restore``) gets instead the region's bytes as SAVE left them at
the end of its graph phase. Its caching allocator, though, never holds the blocks
those forwards and the capture loop allocated. Tensors the capture loop creates
between captures then land elsewhere than at SAVE. That is harmless unless a graph
points at such a tensor: SGLang would fill the tensor at its new address while the
graph reads SAVE's.

SAVE therefore records torch's allocation history over the graph phase. At its end
the history gives the blocks allocated in that phase, outside the graph pools,
and still alive. Every graph operand is checked against them, and the archive
records the verdict under ``sglang.warmup_skip``. A LOAD that skips the warm-ups
refuses an archive whose verdict is not ``safe``. Servers with several model
runners (speculative decoding) and hybrid models are not judged
(:func:`unjudged`): their verdict is ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from foundry.graphir.graph import GraphIR
from foundry.graphir.regions import AddressRanges

VERDICT = "sglang.warmup_skip"
SAFE = "safe"
_HISTORY_ENTRIES = 1_000_000  # allocation events kept; a graph phase that overflows them is not judged
_FREES = ("free_requested", "free_completed")


def start_recording() -> str | None:
    """Record the caching allocator's events from now on (no stack traces: cheap);
    return why it could not, if it could not."""
    import torch

    if torch._C._cuda_isHistoryEnabled():  # the program's own recording: neither disturbed nor trusted
        return "the program records torch's allocation history itself"
    try:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=_HISTORY_ENTRIES)  # fmt: skip
    except (RuntimeError, ValueError) as err:  # another allocator backend, say
        return f"torch's allocation history cannot be recorded ({err})"
    return None


def stop_recording(device: int) -> tuple[list[tuple[int, int]], list[int]] | str:
    """The live phase blocks (see :func:`live_phase_blocks`) and the start of every
    segment torch holds, or why they are unknown. Recording stops."""
    import torch

    try:
        if not torch._C._cuda_isHistoryEnabled():  # turned off meanwhile: its events are gone
            return "torch's allocation history was turned off during the graph phase"
        snapshot = torch.cuda.memory._snapshot()
    except (RuntimeError, ValueError) as err:
        return f"torch's allocation history cannot be read ({err})"
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    blocks = live_phase_blocks(snapshot, device)
    if isinstance(blocks, str):
        return blocks
    return blocks, sorted(int(s["address"]) for s in snapshot["segments"] if s.get("device", device) == device)


def foreign_allocations(
    trace: Iterable[Any], start: int, base: int, torch_segments: list[int]
) -> list[tuple[int, int]]:
    """Region allocations made in the phase (offset from ``start`` on, still mapped) that
    are none of torch's segments: memory a library took from the driver itself, which a
    LOAD that skips the warm-ups would see that library take elsewhere. Allocations
    inside a capture are torch's graph pools, so they are torch's segments."""
    segments = set(torch_segments)
    return sorted(
        (base + a.offset, a.size)
        for a in trace
        if a.offset >= start and not a.freed and base + a.offset not in segments
    )


def live_phase_blocks(snapshot: Mapping[str, Any], device: int) -> list[tuple[int, int]] | str:
    """``(address, size)`` of every block allocated during the recording, outside a graph
    pool, and not freed by its end, sorted; or why the history cannot tell."""
    try:
        traces = snapshot["device_traces"][device]
        graph_segments = AddressRanges.of_blocks(
            (int(s["address"]), int(s["total_size"]))
            for s in snapshot["segments"]
            if s.get("device", device) == device and tuple(s.get("segment_pool_id", (0, 0))) != (0, 0)
        )
        if len(traces) >= _HISTORY_ENTRIES:
            return f"the allocation history overflowed ({len(traces)} events kept)"
        live: dict[int, int] = {}
        for entry in traces:
            if entry["action"] == "alloc":
                live[int(entry["addr"])] = int(entry["size"])
            elif entry["action"] in _FREES:
                live.pop(int(entry["addr"]), None)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        return f"torch's allocator snapshot has another shape ({type(err).__name__}: {err})"
    return sorted((a, s) for a, s in live.items() if a not in graph_segments)


def unjudged(model_runners: Iterable[str], hybrid: bool) -> str | None:
    """Why SAVE does not judge a skipping LOAD at all, or None. Several model runners
    (speculative decoding): the draft model's graph runners allocate their buffers
    between the target's captures and their own, not in a warm-up, so a LOAD skipping
    the warm-ups makes them after the restored range, elsewhere than SAVE. A hybrid
    model: the warm-up forwards write its linear-attention state pool, allocated before
    the graph phase, whose bytes are not among those restored."""
    runners = sorted(model_runners)
    if len(runners) > 1:
        return f"not judged for several model runners ({', '.join(runners)}: speculative decoding)"
    if hybrid:
        return "not judged for a hybrid model (its linear-attention state pool is written by the warm-ups)"
    return None


def verdict(irs: Iterable[GraphIR], blocks: list[tuple[int, int]] | str) -> str:
    """``safe``, or the first reason a LOAD may not skip the warm-ups: a graph points into
    one of ``blocks`` (sorted ``(address, size)``), or they are unknown."""
    if isinstance(blocks, str):
        return f"unknown: {blocks}"
    kept = AddressRanges.of_blocks(blocks)
    hits = [(ir.name, operand) for ir in irs for operand in ir.operands if operand.value in kept]
    if not hits:
        return SAFE
    name, operand = hits[0]
    return (f"unsafe: {name} node {operand.node} points at 0x{operand.value:x}, in memory allocated during the "
            f"graph phase outside a capture and kept ({len(hits)} such operand(s))")  # fmt: skip
