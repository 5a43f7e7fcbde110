"""Launch plans: each graph packed for the native builder once, at SAVE.

A LOAD that decodes every graph's IR and packs it again spends most of its time
in Python (about 1 s to decode and 1.4 s to pack 37 graphs of 1,850 nodes on the
H200 test machine). A plan is the packed description SAVE made, with kernels
named by an index into the plan's function table instead of a live handle; LOAD
resolves the table, hands every plan to ``foundry_graph_build_many`` and is done.

Plans are written only for graphs whose operands all lie in the deterministic
region: a LOAD at SAVE's base then needs no pointer patched. Anything else
(relocation, backends, event nodes) builds from the IR as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

from foundry.archive.schema import LaunchPlan, PlanKernel
from foundry.errors import IRError
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity
from foundry.graphir.regions import RegionKind


class _FunctionTable:
    """Stands in for live functions while packing: kernel identity -> table index."""

    def __init__(self) -> None:
        self.index: dict[tuple[str | None, str], int] = {}
        self.kernels: list[PlanKernel] = []

    def add(self, kernel: KernelIdentity, attrs: tuple[tuple[str, int], ...]) -> None:
        key = (kernel.image, kernel.name)
        if key not in self.index:
            self.index[key] = len(self.kernels)
            self.kernels.append(PlanKernel(kernel.image, kernel.name, attrs))

    def function(self, kernel: KernelIdentity) -> int:
        return self.index[(kernel.image, kernel.name)]


def plannable(ir: GraphIR) -> bool:
    """Whether ``ir`` gets a plan: natively buildable, every operand in the region,
    every kernel's image known."""
    from foundry.runtime.graphs.native_build import supported

    return (
        supported(ir)
        and all(op.region == RegionKind.VMM for op in ir.operands)
        and all(node.kernel.image is not None for node in ir.kernels())
    )


def make_plan(ir: GraphIR) -> tuple[bytes, tuple[PlanKernel, ...]] | None:
    """The packed description of ``ir`` and its function table, or None (see :func:`plannable`)."""
    from foundry.runtime.graphs.native_build import pack

    if not plannable(ir):
        return None
    table = _FunctionTable()
    for node in ir.kernels():
        table.add(node.kernel, tuple((a.name, a.value) for a in node.func_attrs))
    return pack(ir, table), tuple(table.kernels)


def check_plan(lib: ctypes.CDLL, data: bytes, plan: LaunchPlan, bounds: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """Parse a plan with the native reader as LOAD would: function indices bounded by its
    table, known launch attributes only, copies and sets inside ``bounds`` (device
    addresses; (0, 0): unchecked). ``(nodes, edges)``, or IRError saying why not."""
    nodes, edges, err = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.create_string_buffer(256)
    status = lib.foundry_graph_check_indexed(data, ctypes.c_size_t(len(data)), ctypes.c_size_t(len(plan.kernels)),
                                             ctypes.c_uint64(bounds[0]), ctypes.c_uint64(bounds[1]),
                                             ctypes.byref(nodes), ctypes.byref(edges), err, 256)  # fmt: skip
    if status:
        raise IRError(f"launch plan refused: {err.value.decode(errors='replace')}", path=plan.file)
    return nodes.value, edges.value


def build_plans(lib: ctypes.CDLL, plans: Sequence[tuple[str, bytes, LaunchPlan]],
                function: Callable[[PlanKernel], int], bounds: tuple[int, int], *,
                threads: int = 1, instantiate: bool = True,
                flags: Sequence[int] = ()) -> list[tuple[Any, Any]]:  # fmt: skip
    """Build and instantiate every ``(name, data, plan)``: ``(CUgraph, CUgraphExec)`` each
    (the exec None when ``instantiate`` is false: the caller instantiates), plan ``i`` with
    instantiation flags ``flags[i]`` (none when ``flags`` is empty).
    ``function(kernel)`` returns the live handle with the kernel's attributes applied;
    every copy and set must lie in ``bounds``, the region SAVE used."""
    from foundry.graphir.cuda import driver

    if not plans:
        return []
    count = len(plans)
    tables = [(ctypes.c_uint64 * max(1, len(p.kernels)))(*(function(k) for k in p.kernels)) for _, _, p in plans]
    descs = (ctypes.c_char_p * count)(*(data for _, data, _ in plans))
    lens = (ctypes.c_size_t * count)(*(len(data) for _, data, _ in plans))
    funcs = (ctypes.POINTER(ctypes.c_uint64) * count)(
        *(ctypes.cast(t, ctypes.POINTER(ctypes.c_uint64)) for t in tables)
    )
    nfuncs = (ctypes.c_size_t * count)(*(len(p.kernels) for _, _, p in plans))
    graphs = (ctypes.c_uint64 * count)()
    execs = (ctypes.c_uint64 * count)() if instantiate else None
    flag_array = (ctypes.c_uint64 * count)(*flags) if flags else None
    err = ctypes.create_string_buffer(256)
    lo, hi = ctypes.c_uint64(bounds[0]), ctypes.c_uint64(bounds[1])
    status = lib.foundry_graph_build_many(descs, lens, ctypes.c_uint32(count), funcs, nfuncs, lo, hi, flag_array,
                                          ctypes.c_uint32(threads), graphs, execs, err, 256)  # fmt: skip
    if status:
        message = err.value.decode(errors="replace")
        index = _graph_index(message)
        raise IRError(f"native build failed: {message}", path=plans[index][0] if index is not None else None)
    drv = driver()
    return [(drv.CUgraph(graphs[i]), drv.CUgraphExec(execs[i]) if execs else None) for i in range(count)]


def _graph_index(message: str) -> int | None:
    """The graph a build error names (``graph N: ...``), if any."""
    head = message.split(":", 1)[0]
    return int(head.split()[1]) if head.startswith("graph ") and head.split()[1].isdigit() else None
