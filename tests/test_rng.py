"""Philox cells in captured graphs (foundry/runtime/graphs/rng.py), found from the
signatures of the kernels that draw random numbers."""

from __future__ import annotations

from foundry.runtime.graphs.rng import philox_cells


def test_philox_cells_are_found_from_the_kernel_signature(pair):
    a, _ = pair
    entry = a.entry(0, "sample.bs8")
    region, seed, offset = philox_cells(a.graph(0, entry))
    assert region == "vmm" and (seed, offset) == (entry.rng.seed_offset, entry.rng.offset_offset)
    assert entry.rng.increment > 0
    assert philox_cells(a.graph(0, "decode.bs1")) is None
