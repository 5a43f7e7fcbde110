"""SAVE's verdict on skipping SGLang's warm-up forwards at LOAD, from torch's allocation
history. A CUDA build of torch cannot run here, so the snapshots are written out in
the shape ``torch.cuda.memory._snapshot()`` returns (segments, device_traces); the
graph is a real one from the committed fixtures."""

from __future__ import annotations

import pytest

from foundry.archive import Archive
from foundry.errors import ArchiveError, DriftError
from foundry.integrations.sglang.warmup_skip import (
    PLACED,
    SAFE,
    PhaseBlocks,
    check_placed,
    decode_placed,
    encode_placed,
    foreign_allocations,
    live_phase_blocks,
    read_blocks,
    verdict,
)
from foundry.runtime.native.hook import Allocation

from .conftest import FIXTURES

# torch numbers graph pools (n, 0) and pools made with torch.cuda.MemPool() (0, n)
GRAPH_POOL = {"device": 0, "address": 0x7F0000000000, "total_size": 1 << 21, "segment_pool_id": (1, 0)}
DEFAULT_POOL = {"device": 0, "address": 0x7F0000200000, "total_size": 1 << 21, "segment_pool_id": (0, 0)}
WARMUP = (0, 1)  # the warm-ups' MemPool
WARMUP_POOL = {"device": 0, "address": 0x7F0000400000, "total_size": 1 << 21, "segment_pool_id": WARMUP}


def snapshot(*events: tuple[str, int, int]) -> dict:
    trace = [{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": i}
             for i, (action, addr, size) in enumerate(events)]  # fmt: skip
    return {"segments": [GRAPH_POOL, DEFAULT_POOL, WARMUP_POOL], "device_traces": [trace]}


def test_blocks_the_phase_allocated_and_kept_outside_graph_pools():
    events = (
        ("alloc", 0x7F0000200000, 512),  # a warm-up temporary, freed
        ("free_requested", 0x7F0000200000, 512),
        ("free_completed", 0x7F0000200000, 512),
        ("alloc", 0x7F0000000000, 4096),  # inside the capture: the graph pool's
        ("alloc", 0x7F0000200400, 1024),  # allocated between captures and kept
        ("alloc", 0x7F0000400000, 2048),  # a warm-up's, kept
    )
    blocks = live_phase_blocks(snapshot(*events), 0, WARMUP)
    assert blocks == PhaseBlocks(warmup=[(0x7F0000400000, 2048)], program=[(0x7F0000200400, 1024)])


def test_an_address_freed_and_allocated_again_counts_once_and_a_requested_free_frees():
    events = (
        ("alloc", 0x7F0000200000, 512),
        ("free_requested", 0x7F0000200000, 512),  # freed on its stream's side: not live any more
        ("alloc", 0x7F0000200000, 256),  # the same address again, kept
        ("alloc", 0x7F0000200800, 64),
        ("free_requested", 0x7F0000200800, 64),
    )
    assert live_phase_blocks(snapshot(*events), 0, WARMUP).program == [(0x7F0000200000, 256)]


def test_a_history_that_cannot_tell_gives_a_reason():
    assert "another shape" in live_phase_blocks({"segments": []}, 0)
    assert "another shape" in live_phase_blocks(snapshot(("alloc", "x", 1)), 0)
    overflowing = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 1}] * 1_000_000]}
    assert "overflowed" in live_phase_blocks(overflowing, 0)


def test_a_graph_pointing_into_a_kept_block_is_unsafe_naming_graph_and_node():
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs8")
    operand = next(iter(ir.operands))
    said = verdict([ir], [(operand.value - 16, 64)])
    assert said.startswith(f"unsafe: decode.bs8 node {operand.node} points at") and "a warm-up allocated" in said
    assert said.endswith("in 1 graph(s))")
    assert "taken from the driver" in verdict([ir], [], [(operand.value - 16, 64)])
    assert verdict([ir], [(1 << 20, 64)]) == SAFE  # no operand there
    assert verdict([ir], "the allocation history overflowed") == "unknown: the allocation history overflowed"


def test_the_capture_loops_blocks_a_graph_reads_are_placed_and_kept_through_the_archive():
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs8")
    operand = next(iter(ir.operands))
    read, unread = (operand.value - 16, 64), (operand.value + (1 << 30), 64)
    assert read_blocks([ir], sorted([read, unread])) == [read]
    base = operand.value - (1 << 20)
    text = encode_placed([read], base)
    assert decode_placed({PLACED: text}) == [((1 << 20) - 16, 64)] and decode_placed({}) == []


@pytest.mark.parametrize("text, says", [
    ("[[1, 2], ", "unreadable"), ('[["0x10", 64]]', "unreadable"), ("[[-1, 64]]", "negative offset"),
    ("[[16, 0]]", "no size"), ("[[1, 2]]" + " " * (1 << 20), "too many"),
])  # fmt: skip
def test_hostile_placed_blocks_are_refused_by_field(text, says):
    with pytest.raises(ArchiveError, match=says) as info:
        decode_placed({PLACED: text})
    assert info.value.field == PLACED


def segment(address: int, *blocks: tuple[int, str]) -> dict:
    """A segment of ``torch.cuda.memory_snapshot()``: its blocks' sizes and states, back to back."""
    return {"address": address, "blocks": [{"size": size, "state": state} for size, state in blocks]}


def test_a_load_finds_each_placed_block_where_save_had_it_or_refuses_naming_it():
    base = 0x600000000000
    segments = [segment(base + 4096, (512, "active_allocated"), (1024, "inactive"), (2048, "active_allocated"))]
    check_placed([(4096, 512), (4096 + 1536, 2048)], base, segments)
    with pytest.raises(DriftError, match=r"block #1 of those SAVE's graphs read.*not where SAVE had it") as info:
        check_placed([(4096, 512), (4096 + 512, 1024)], base, segments)  # that block is free at this LOAD
    assert info.value.field == PLACED and info.value.expected == f"1024 bytes at offset {4096 + 512}"
    assert info.value.found == "no block of torch's starts there"
    with pytest.raises(DriftError) as info:
        check_placed([(4096, 256)], base, segments)
    assert info.value.found == "a block of 512 bytes"


def test_driver_memory_taken_between_captures_outside_a_warmup_is_not_unsafe():
    base, mib = 0x600000000000, 1 << 20
    trace = [Allocation(n, n * mib, mib, mib, False, phase=phase)
             for n, phase in enumerate(("warmup", "warmup", "capture", "late", "late", "capture"))]  # fmt: skip
    # the first warm-up began at allocation 1; the later one made #4, the program #3
    assert foreign_allocations(trace, mib, base, [], [(4, 5)]) == [(base + n * mib, mib) for n in (1, 2, 4, 5)]
    assert foreign_allocations(trace, mib, base, [base + 2 * mib, base + 5 * mib], [(4, 5)]) == [
        (base + mib, mib), (base + 4 * mib, mib)]  # fmt: skip
