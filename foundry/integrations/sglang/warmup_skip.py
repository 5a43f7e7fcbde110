"""Whether a LOAD may skip SGLang's eager warm-up forwards.

SGLang runs two eager forwards per shape before capturing it. A LOAD that skips
them (``--warmup restore``) gets instead the region's bytes as SAVE left them at
the end of its graph phase. Its caching allocator, though, never holds the blocks
those forwards allocated. The forwards allocate from a pool of their own
(``Session.warmup``), so the tensors SGLang's capture loop creates between
captures (an attention backend's per-shape buffers, say) land where they landed
at SAVE all the same, in torch's default pool; what the forwards kept lands
nowhere at such a LOAD.

SAVE therefore records torch's allocation history over the graph phase. At its end
the history gives the blocks allocated in that phase, outside the graph pools,
and still alive: the warm-ups' and the capture loop's. Every graph operand is
checked against them. One that points into a warm-up's block (or memory a
library took from the driver in a warm-up) makes the verdict ``unsafe``; the
capture loop's blocks that graphs read are recorded (``sglang.placed_blocks``),
and a LOAD skipping the warm-ups checks that each is allocated at SAVE's address
before any replay, and copies SAVE's bytes into it again. The archive records the
verdict under ``sglang.warmup_skip``; a LOAD that skips the warm-ups refuses an
archive whose verdict is not ``safe``. Servers with several model runners
(speculative decoding) and hybrid models are not judged (:func:`unjudged`): their
verdict is ``unknown``.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from foundry.errors import ArchiveError, DriftError
from foundry.graphir.graph import GraphIR
from foundry.graphir.regions import AddressRanges
from foundry.runtime.sessions.placement import BETWEEN, between_phase
from foundry.runtime.sessions.validate import WARMUP_VERDICT_SUFFIX

VERDICT = "sglang" + WARMUP_VERDICT_SUFFIX  # "sglang.warmup_skip": `foundry run` quotes it in its refusal
PLACED = "sglang.placed_blocks"
SAFE = "safe"
_PLACED_TEXT = 1 << 20  # characters of PLACED a LOAD reads: tens of thousands of blocks
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


def stop_recording(device: int, warmup_pool: tuple[int, int] | None) -> tuple[PhaseBlocks, list[int]] | str:
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
    blocks = live_phase_blocks(snapshot, device, warmup_pool)
    if isinstance(blocks, str):
        return blocks
    return blocks, sorted(int(s["address"]) for s in snapshot["segments"] if s.get("device", device) == device)


def foreign_allocations(
    trace: Iterable[Any], start: int, base: int, torch_segments: list[int], warmups: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Region allocations made in a warm-up of the phase (offset from ``start`` on, still
    mapped, not between captures outside ``warmups``) that are none of torch's segments:
    memory a library took from the driver itself, which a LOAD that skips the warm-ups
    would see that library take elsewhere. Allocations inside a capture are torch's graph
    pools, so they are torch's segments; those between captures outside a warm-up the
    LOAD makes again at SAVE's offset."""
    segments = set(torch_segments)
    return sorted(
        (base + a.offset, a.size)
        for a in trace
        if a.offset >= start
        and not a.freed
        and base + a.offset not in segments
        and between_phase(a.phase, a.order, warmups) != BETWEEN
    )


@dataclass(frozen=True)
class PhaseBlocks:
    """Torch's blocks the graph phase allocated outside the graph pools and kept, sorted
    ``(address, size)``: in the warm-ups' pool, or the program's own (the default pool)."""

    warmup: list[tuple[int, int]]
    program: list[tuple[int, int]]


def live_phase_blocks(snapshot: Mapping[str, Any], device: int, warmup_pool: tuple[int, int] | None = None
                      ) -> PhaseBlocks | str:  # fmt: skip
    """The blocks allocated during the recording and not freed by its end, outside the graph
    pools, by pool (``warmup_pool``: the warm-ups' pool id); or why the history cannot tell."""
    try:
        traces = snapshot["device_traces"][device]
        pools: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
        for s in snapshot["segments"]:
            if s.get("device", device) == device:
                pools[tuple(s.get("segment_pool_id", (0, 0)))].append((int(s["address"]), int(s["total_size"])))
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
    default = AddressRanges.of_blocks(pools[(0, 0)])
    warm = AddressRanges.of_blocks(pools[tuple(warmup_pool)] if warmup_pool is not None else [])
    kept = sorted(live.items())
    return PhaseBlocks([b for b in kept if b[0] in warm], [b for b in kept if b[0] in default])


def read_blocks(irs: Iterable[GraphIR], blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of ``blocks`` (sorted ``(address, size)``) that a graph operand points into."""
    hit: set[tuple[int, int]] = set()
    starts = [address for address, _ in blocks]
    for ir in irs:
        for operand in ir.operands:
            index = bisect.bisect_right(starts, operand.value) - 1  # the block starting at or below it
            if index >= 0 and operand.value < blocks[index][0] + blocks[index][1]:  # blocks are disjoint
                hit.add(blocks[index])
    return sorted(hit)


def encode_placed(blocks: list[tuple[int, int]], base: int) -> str:
    """``PLACED``'s value: each block as ``[region offset, size]``."""
    return msgspec.json.encode([[address - base, size] for address, size in blocks]).decode()


def decode_placed(model: Mapping[str, str]) -> list[tuple[int, int]]:
    """``(region offset, size)`` of each block SAVE's graphs read that the capture loop
    allocated (none where the archive names none); hostile text is refused by field."""
    text = model.get(PLACED)
    if text is None:
        return []
    if len(text) > _PLACED_TEXT:
        raise ArchiveError("too many placed blocks", field=PLACED, expected=f"at most {_PLACED_TEXT} characters",
                           found=len(text))  # fmt: skip
    try:
        blocks = msgspec.json.decode(text, type=list[tuple[int, int]])
    except msgspec.DecodeError as err:
        raise ArchiveError(f"placed blocks unreadable ({err})", field=PLACED) from None
    if any(offset < 0 or size <= 0 for offset, size in blocks):
        raise ArchiveError("a placed block with a negative offset or no size", field=PLACED)
    return blocks


def check_placed(placed: list[tuple[int, int]], base: int, segments: Iterable[Mapping[str, Any]]) -> None:
    """Refuse a LOAD in which a block SAVE's graphs read is not an allocated block of torch
    at SAVE's address with SAVE's size (``segments``: ``torch.cuda.memory_snapshot()``)."""
    allocated: dict[int, int] = {}
    for segment in segments:
        at = int(segment["address"])
        for block in segment.get("blocks", ()):
            if block.get("state") == "active_allocated":
                allocated[int(block.get("address", at))] = int(block["size"])
            at += int(block["size"])
    for index, (offset, size) in enumerate(placed):
        found = allocated.get(base + offset)
        if found != size:
            raise DriftError(
                f"block #{index} of those SAVE's graphs read, which SGLang allocated between captures, is not where "
                "SAVE had it",
                field=PLACED,
                expected=f"{size} bytes at offset {offset}",
                found="no block of torch's starts there" if found is None else f"a block of {found} bytes",
            )


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


def verdict(irs: Iterable[GraphIR], blocks: list[tuple[int, int]] | str,
            foreign: list[tuple[int, int]] = ()) -> str:  # fmt: skip
    """``safe``, or the first reason a LOAD may not skip the warm-ups: a graph points into
    one of ``blocks`` (sorted ``(address, size)``: torch's, kept from a warm-up) or of
    ``foreign`` (driver memory a library took in a warm-up), or they are unknown."""
    if isinstance(blocks, str):
        return f"unknown: {blocks}"
    kept = AddressRanges.of_blocks(sorted([*blocks, *foreign]))
    hits = [(ir.name, operand) for ir in irs for operand in ir.operands if operand.value in kept]
    if not hits:
        return SAFE
    name, operand = hits[0]
    torch_block = operand.value in AddressRanges.of_blocks(blocks)
    where = ("a block of torch's that a warm-up allocated during the graph phase and kept" if torch_block
             else "memory taken from the driver during a warm-up of the graph phase, not torch's")  # fmt: skip
    graphs = len({graph for graph, _ in hits})
    return (f"unsafe: {name} node {operand.node} points at 0x{operand.value:x}, in {where} "
            f"({len(hits)} such operand(s) in {graphs} graph(s))")  # fmt: skip
