"""Philox random numbers in restored graphs.

torch's random kernels take an ``at::PhiloxCudaState``: inside a capture its
first two words point at the generator's seed and offset cells (int64 device
scalars), ``offset_intragraph_`` follows at byte 16 (uint32 or, in newer torch,
uint64) and then the ``captured_`` flag.
Before each replay torch writes the generator's seed and current offset into
those cells and advances the offset by the graph's whole increment.
A restored graph does exactly the same (:class:`PhiloxReplay`), so seeded
sampling gives the sequence a captured graph gives, replay after replay.
"""

from __future__ import annotations

from typing import Any

from foundry.archive.schema import RngRecord
from foundry.errors import CaptureError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import parameter_types
from foundry.graphir.operands import WORD, OperandSite

PHILOX_STATE = "at::PhiloxCudaState"
CAPTURED_BYTE = {24: 20, 32: 24}  # struct size -> offset of captured_


def philox_cells(ir: GraphIR) -> tuple[str, int, int] | None:
    """``(region, seed cell offset, offset cell offset)`` shared by every random
    kernel of ``ir``; None when the graph draws no random numbers."""
    cells: set[tuple[str, int, int]] = set()
    for node in ir.kernels():
        types = parameter_types(node.kernel.demangled)
        if not types or PHILOX_STATE not in types:
            continue
        slot = node.layout.slots[types.index(PHILOX_STATE)]
        if slot.size not in CAPTURED_BYTE:
            raise CaptureError(f"unknown PhiloxCudaState layout ({slot.size} bytes)", path=ir.name, node=node.id)
        if node.params[slot.offset + CAPTURED_BYTE[slot.size]] != 1:
            raise CaptureError("a random kernel was captured with a fixed seed", path=ir.name, node=node.id)
        words = {o.offset: o for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
        seed, offset = words.get(slot.offset), words.get(slot.offset + WORD)
        if seed is None or offset is None or seed.region != offset.region:
            raise CaptureError("the philox seed/offset cells are not in a known region", path=ir.name, node=node.id)
        cells.add((seed.region, seed.region_offset, offset.region_offset))
    if len(cells) > 1:
        raise CaptureError("random kernels of one graph use different generators", path=ir.name, found=sorted(cells))
    return cells.pop() if cells else None


def measure_increment(graph: Any) -> int:
    """How far one replay of a captured ``torch.cuda.CUDAGraph`` advances the default
    generator's philox offset. Replays it once and puts the generator back."""
    import torch

    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    before = generator.get_offset()
    graph.replay()
    torch.cuda.synchronize()
    increment = generator.get_offset() - before
    generator.set_offset(before)
    return increment


class PhiloxReplay:
    """Does for a restored graph what torch's replay prologue does for a captured one."""

    def __init__(self, record: RngRecord, base: int) -> None:
        import torch

        from foundry.runtime.graphs.tensors import tensor_at

        self.increment = record.increment
        self.generator = torch.cuda.default_generators[torch.cuda.current_device()]
        self.seed_cell = tensor_at(base + record.seed_offset, torch.int64, (1,))
        self.offset_cell = tensor_at(base + record.offset_offset, torch.int64, (1,))

    def prologue(self) -> None:
        offset = self.generator.get_offset()
        seed = self.generator.initial_seed()
        self.seed_cell.fill_(seed - (1 << 64) if seed >= 1 << 63 else seed)  # torch stores int64_t(seed)
        self.offset_cell.fill_(offset)
        self.generator.set_offset(offset + self.increment)
