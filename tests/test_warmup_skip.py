"""SAVE's verdict on skipping SGLang's warm-up forwards at LOAD, from torch's allocation
history. A CUDA build of torch cannot run here, so the snapshots are written out in
the shape ``torch.cuda.memory._snapshot()`` returns (segments, device_traces); the
graph is a real one from the committed fixtures."""

from __future__ import annotations

from foundry.archive import Archive
from foundry.integrations.sglang.warmup_skip import SAFE, live_phase_blocks, verdict

from .conftest import FIXTURES

GRAPH_POOL = {"device": 0, "address": 0x7F0000000000, "total_size": 1 << 21, "segment_pool_id": (0, 1)}
DEFAULT_POOL = {"device": 0, "address": 0x7F0000200000, "total_size": 1 << 21, "segment_pool_id": (0, 0)}


def snapshot(*events: tuple[str, int, int]) -> dict:
    trace = [{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": i}
             for i, (action, addr, size) in enumerate(events)]  # fmt: skip
    return {"segments": [GRAPH_POOL, DEFAULT_POOL], "device_traces": [trace]}


def test_blocks_the_phase_allocated_and_kept_outside_graph_pools():
    events = (
        ("alloc", 0x7F0000200000, 512),  # a warm-up temporary, freed
        ("free_requested", 0x7F0000200000, 512),
        ("free_completed", 0x7F0000200000, 512),
        ("alloc", 0x7F0000000000, 4096),  # inside the capture: the graph pool's
        ("alloc", 0x7F0000200400, 1024),  # allocated between captures and kept
    )
    assert live_phase_blocks(snapshot(*events), 0) == [(0x7F0000200400, 1024)]


def test_an_address_freed_and_allocated_again_counts_once_and_a_requested_free_frees():
    events = (
        ("alloc", 0x7F0000200000, 512),
        ("free_requested", 0x7F0000200000, 512),  # freed on its stream's side: not live any more
        ("alloc", 0x7F0000200000, 256),  # the same address again, kept
        ("alloc", 0x7F0000200800, 64),
        ("free_requested", 0x7F0000200800, 64),
    )
    assert live_phase_blocks(snapshot(*events), 0) == [(0x7F0000200000, 256)]


def test_a_history_that_cannot_tell_gives_a_reason():
    assert "another shape" in live_phase_blocks({"segments": []}, 0)
    assert "another shape" in live_phase_blocks(snapshot(("alloc", "x", 1)), 0)
    overflowing = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 1}] * 1_000_000]}
    assert "overflowed" in live_phase_blocks(overflowing, 0)


def test_a_graph_pointing_into_a_kept_block_is_unsafe_naming_graph_and_node():
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs8")
    operand = next(iter(ir.operands))
    assert verdict([ir], [(operand.value - 16, 64)]).startswith(f"unsafe: decode.bs8 node {operand.node} points at")
    assert verdict([ir], [(1 << 20, 64)]) == SAFE  # no operand there
    assert verdict([ir], "the allocation history overflowed") == "unknown: the allocation history overflowed"
