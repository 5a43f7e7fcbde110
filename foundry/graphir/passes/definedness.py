"""Which parameter bytes of a captured graph mean something.

torch's launchers pass structs whose unused slots (``TensorInfo`` sizes past
``dims``, lambda padding, ``OffsetCalculator`` strides) hold whatever the host
stack held: two processes capturing the same step disagree there, so the
fingerprint could never be stable. SAVE therefore captures each step twice —
the second time with the stack shifted down over bytes filled with a pattern — and
:func:`mark_undefined` compares the two. Bytes that differ are recorded as
``undefined`` on the kept graph: the fingerprint and ``diff`` ignore them and
LOAD still writes them as captured (the kernels never read them). A word the
first capture took for a pointer but the second did not is leftover stack data
that happened to point into memory; it is dropped from the manifest.

Leftovers that are the same in both captures of one process — return
addresses into shared libraries, pointers to long-lived heap objects — are
found by value instead (:func:`mark_host_words`): a parameter word holding an
address mapped in the host process is not something a kernel can use.
"""

from __future__ import annotations

from typing import Any

import msgspec

from foundry.errors import CaptureError
from foundry.graphir.graph import GraphIR
from foundry.graphir.nodes import KernelNode
from foundry.graphir.operands import WORD, Operand, OperandSite
from foundry.graphir.regions import AddressRanges


def _runs(differs: list[bool]) -> tuple[tuple[int, int], ...]:
    runs: list[tuple[int, int]] = []
    start = None
    for i, bad in enumerate([*differs, False]):
        if bad and start is None:
            start = i
        elif not bad and start is not None:
            runs.append((start, i - start))
            start = None
    return tuple(runs)


def _param_words(operands: tuple[Operand, ...]) -> dict[int, Operand]:
    return {o.offset: o for o in operands if o.site is OperandSite.PARAM}


def _set_marks(ir: GraphIR, node: KernelNode, marks: set[int]) -> None:
    """Replace ``node``'s undefined marks with the byte offsets in ``marks``."""
    flags = [i in marks for i in range(len(node.params))]
    ir.replace_node(msgspec.structs.replace(node, undefined=_runs(flags)))


def _compare(
    a: KernelNode, b: KernelNode, ops_a: dict[int, Operand], ops_b: dict[int, Operand]
) -> tuple[list[bool], set[int]]:
    """Per byte: does it differ outside words both captures call pointers; and
    the offsets of A's one-sided pointer words."""
    differs = [x != y for x, y in zip(a.params, b.params, strict=True)]
    one_sided = set()
    for offset, operand in ops_a.items():
        other = ops_b.get(offset)
        if other is not None and other.region == operand.region:
            differs[offset : offset + WORD] = [False] * WORD
        elif other is None and a.params[offset : offset + WORD] != b.params[offset : offset + WORD]:
            one_sided.add(offset)
    return differs, one_sided


def _whole_words(differs: list[bool]) -> list[bool]:
    """Widen each differing byte to its aligned 8-byte word. A leftover (a heap
    pointer's low bytes, the stack canary) spans several bytes, and two runs can
    agree on some of them by chance: the same leftover recurs in many nodes, so one
    such byte would make two SAVEs' fingerprints disagree everywhere it recurs (seen
    on the H200 test machine). Real data sharing the word then goes unfingerprinted;
    LOAD still writes it as captured."""
    widened = list(differs)
    for word in range(0, len(differs), WORD):
        if any(differs[word : word + WORD]):
            widened[word : word + WORD] = [True] * len(differs[word : word + WORD])
    return widened


def mark_undefined(kept: GraphIR, probe: GraphIR) -> tuple[GraphIR, int]:
    """Return ``kept`` with undefined bytes marked (added to those already marked)
    and one-sided pointer words dropped, and the number of undefined bytes. Refuses when the two captures
    are not the same step (node kinds, kernels or layouts differ)."""
    if len(kept) != len(probe):
        raise CaptureError("the two captures of a step differ in node count", path=kept.name)
    dropped: set[tuple[int, int]] = set()
    undefined_bytes = 0
    for a in kept.nodes():
        b = probe.node(a.id)
        if type(a) is not type(b):
            raise CaptureError("the two captures of a step differ in node kind", path=kept.name, node=a.id)
        if not isinstance(a, KernelNode):
            continue
        if (a.kernel.name, a.layout, a.launch, a.arg_mode, a.packed_size) != (
            b.kernel.name,
            b.layout,
            b.launch,
            b.arg_mode,
            b.packed_size,
        ):
            raise CaptureError(
                "the two captures of a step launch different kernels", path=kept.name, node=a.id, kernel=a.kernel.name
            )
        differs, one_sided = _compare(a, b, _param_words(kept.operands.of(a.id)), _param_words(probe.operands.of(a.id)))
        differs = _whole_words(differs)
        for offset, length in (*a.undefined, *b.undefined):  # what either capture already knew
            differs[offset : offset + length] = [True] * length
        dropped.update((a.id, offset) for offset in one_sided)
        runs = _runs(differs)
        undefined_bytes += sum(length for _, length in runs)
        if runs != a.undefined:
            kept.replace_node(msgspec.structs.replace(a, undefined=runs))
    if dropped:
        kept.set_operands(
            o for o in kept.operands if not (o.site is OperandSite.PARAM and (o.node, o.offset) in dropped)
        )
    return kept, undefined_bytes


def mark_host_words(ir: GraphIR, host: AddressRanges) -> tuple[GraphIR, int]:
    """Mark as undefined every 8-byte-aligned parameter word that is not an operand
    and holds an address mapped in the host process (``host``, see
    :func:`foundry.runtime.host_maps.host_ranges`): a return address or heap pointer
    the launcher left behind. Kernels cannot use host addresses the
    driver does not know; the ones it knows are operands already. Returns the words
    marked."""
    marked = 0
    for node in ir.kernels():
        words = _param_words(ir.operands.of(node.id))
        undefined = node.undefined_offsets()
        hits = []
        for offset in range(0, len(node.params) - WORD + 1, WORD):
            if offset in words or all(i in undefined for i in range(offset, offset + WORD)):
                continue
            value = int.from_bytes(node.params[offset : offset + WORD], "little")
            if value and value in host:
                hits.append(offset)
        if hits:
            marked += len(hits)
            for offset in hits:
                undefined.update(range(offset, offset + WORD))
            _set_marks(ir, node, undefined)
    return ir, marked


def mark_alike(irs: list[GraphIR]) -> int:
    """Give every launch of one kernel (name and parameter layout) the union of the
    undefined marks its launches got, across ``irs`` (one rank's graphs). Whether a
    slot that sometimes holds a leftover differed between two runs is chance, so
    per-node marks vary from SAVE to SAVE; pooled over the many launches of a kernel
    they vary much less (two SAVEs on the H200 test machine: 6 of 7 fingerprints
    differed with per-node marks, none once pooled afterwards; two later SAVEs that
    pooled: 1 of 7). Returns the bytes newly marked."""

    def kernel_of(node: KernelNode) -> tuple[str, str | None, Any]:
        return (node.kernel.name, node.kernel.image, node.layout)

    pooled: dict[tuple[str, str | None, Any], set[int]] = {}
    for ir in irs:
        for node in ir.kernels():
            pooled.setdefault(kernel_of(node), set()).update(node.undefined_offsets())
    added = 0
    for ir in irs:
        for node in ir.kernels():
            own = node.undefined_offsets()
            extra = pooled[kernel_of(node)] - own
            if not extra:  # most launches gain nothing: their pointer words need not be found
                continue
            kept = _pointer_words(ir, node)  # this launch's pointers stay defined, missed ones included
            extra = {i for i in extra if i - i % WORD not in kept}
            if extra:
                added += len(extra)
                _set_marks(ir, node, own | extra)
    return added


def _pointer_words(ir: GraphIR, node: KernelNode) -> set[int]:
    """Offsets of ``node``'s aligned parameter words that are operands or hold an address
    inside one of the graph's regions: pooling must not hide a pointer, and one the
    manifest missed is what ``archive diff --relocations`` exists to find."""
    words = set(_param_words(ir.operands.of(node.id)))
    spans = [(r.base, r.base + r.size) for r in ir.regions.values() if r.size]
    for offset in range(0, len(node.params) - WORD + 1, WORD):
        value = int.from_bytes(node.params[offset : offset + WORD], "little")
        if any(lo <= value < hi for lo, hi in spans):
            words.add(offset)
    return words
