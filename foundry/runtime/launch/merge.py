"""Merging the runs of one SAVE: the parameter bytes two processes disagree on.

A SAVE runs its program more than once, in fresh processes (:mod:`.launcher`, and
:mod:`.rank_runs` with several ranks): leftovers that one process's probes
reproduce exactly (heap values of that process) differ between two. Merging marks
them undefined in the first run's archive
(:func:`foundry.graphir.passes.definedness.mark_undefined`), then pools the marks
over each kernel's launches (:func:`~foundry.graphir.passes.definedness.mark_alike`).
"""

from __future__ import annotations

from pathlib import Path

from foundry.archive.reader import Archive
from foundry.archive.rewrite import rewrite_rank_graphs
from foundry.errors import CaptureError
from foundry.graphir.graph import GraphIR
from foundry.graphir.passes.definedness import mark_alike, mark_undefined


def merge_saves(primary: Path, other: Path) -> dict[str, int]:
    """Mark in ``primary`` every parameter byte that differs from ``other``, an archive
    of the same program saved by another process: leftovers that one process's
    probes reproduce exactly (heap values of that process) differ between two.
    Both archives must agree on ranks, graphs, topology and allocation trace."""
    a, b = Archive.open(primary), Archive.open(other)
    if a.ranks != b.ranks:
        raise CaptureError("the two SAVE runs wrote different ranks", expected=a.ranks, found=b.ranks)
    for rank in a.ranks:
        ra, rb = a.session(rank).region, b.session(rank).region
        if ra is None or rb is None or (ra.base, ra.final_offset, ra.trace) != (rb.base, rb.final_offset, rb.trace):
            raise CaptureError("the two SAVE runs allocated differently; the program is not deterministic",
                               field=f"rank{rank}.region")  # fmt: skip
        names_a, names_b = [e.name for e in a.entries(rank)], [e.name for e in b.entries(rank)]
        if names_a != names_b:
            raise CaptureError("the two SAVE runs captured different graphs", field=f"rank{rank}.graphs",
                               expected=names_a[:8], found=names_b[:8])  # fmt: skip
    stats = {"graphs": 0, "undefined_bytes": 0}

    def merge(rank: int, graphs: list[GraphIR]) -> list[GraphIR]:
        irs = [mark_undefined(ir, b.graph(rank, ir.name))[0] for ir in graphs]
        mark_alike(irs)
        stats["graphs"] += len(irs)
        stats["undefined_bytes"] += sum(len(n.undefined_offsets()) for ir in irs for n in ir.kernels())
        return irs

    rewrite_rank_graphs(a, merge, keep_plans=True)  # only undefined marks change
    return stats
