"""Definedness marks (foundry/graphir/passes/definedness.py) on the graphs of the H200
SAVE pair: the bytes two captures disagree on, words holding host addresses, marks
pooled over each kernel's launches."""

from __future__ import annotations

import msgspec
import pytest

from foundry.archive import Archive
from foundry.errors import CaptureError
from foundry.graphir.fingerprint import fingerprint
from foundry.graphir.operands import OperandSite
from foundry.graphir.passes.definedness import mark_host_words, mark_undefined
from foundry.runtime.host_maps import host_ranges

from .conftest import FIXTURES


def test_mark_undefined_finds_differing_bytes_and_one_sided_pointers(pair):
    a, _ = pair
    kept, probe = a.graph(0, "sample.bs8"), a.graph(0, "sample.bs8")
    for ir in (kept, probe):  # start from no marks
        for n in ir.kernels():
            ir.replace_node(msgspec.structs.replace(n, undefined=()))
    node = kept.kernels()[0]
    changed = bytearray(node.params)
    words = {o.offset for o in probe.operands.of(node.id) if o.site is OperandSite.PARAM}
    scalar = next(i for i in range(len(changed)) if all(not w <= i < w + 8 for w in words))
    changed[scalar] ^= 0x5A
    probe.replace_node(msgspec.structs.replace(probe.node(node.id), params=bytes(changed)))
    pointer = next(iter(sorted(words)))  # the probe does not see this word as a pointer
    probe.set_operands(o for o in probe.operands if not (o.node == node.id and o.offset == pointer))
    raw = bytearray(changed)
    raw[pointer] ^= 0x10
    probe.replace_node(msgspec.structs.replace(probe.node(node.id), params=bytes(raw)))
    marked, count = mark_undefined(kept, probe)
    runs = marked.node(node.id).undefined
    marks = {i for o, n in runs for i in range(o, o + n)}
    word = scalar - scalar % 8  # a differing byte marks its whole aligned word
    assert set(range(word, word + 8)) <= marks and set(range(pointer, pointer + 8)) <= marks
    assert count == len(marks) and len(marks) == len({word, pointer}) * 8  # nothing else
    assert all(o.offset != pointer for o in marked.operands.of(node.id) if o.site is OperandSite.PARAM)


def test_a_byte_the_runs_agree_on_is_marked_with_its_word():
    """Two runs agreeing by chance on one byte of a leftover still mark all of it."""
    from foundry.graphir.passes.definedness import _whole_words

    differs = [False] * 20
    differs[9] = differs[11] = True  # bytes 9 and 11 of word 8..15 differ, byte 10 happened to agree
    assert _whole_words(differs) == [False] * 8 + [True] * 8 + [False] * 4
    tail = [False] * 18 + [True, False]  # a last, partial word
    assert _whole_words(tail) == [False] * 16 + [True] * 4


def test_mark_undefined_refuses_two_different_steps(pair):
    a, _ = pair
    with pytest.raises(CaptureError, match="node count"):
        mark_undefined(a.graph(0, "decode.bs1"), a.graph(0, "sample.bs8"))


def test_words_holding_host_addresses_are_undefined(pair):
    a, _ = pair
    ir = a.graph(0, "sample.bs8")
    node = ir.kernels()[0]
    operand_words = {o.offset for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
    free = next(w for w in range(0, len(node.params) - 7, 8) if w not in operand_words
                and all(not o <= w < o + n for o, n in node.undefined))  # fmt: skip
    raw = bytearray(node.params)
    raw[free : free + 8] = (0x7F00_0000_1234).to_bytes(8, "little")
    ir.replace_node(msgspec.structs.replace(node, params=bytes(raw)))
    ranges = host_ranges("7f0000000000-7f0000100000 r-xp 00000000 00:00 0 /lib/libexample.so\n")
    ir, words = mark_host_words(ir, ranges)
    assert words == 1 and any(o <= free and free + 8 <= o + n for o, n in ir.node(node.id).undefined)
    assert all(o.region == "vmm" for o in ir.operands.of(node.id))  # pointer words untouched


def test_pooled_marks_give_two_independent_saves_the_same_fingerprints():
    """tests/fixtures/merged-saves: decode.bs1, decode.bs8 and sample.bs8 of two
    independent two-run SAVEs of recipes/torch/run.py on the H200 (the same command
    line, each run pair merged with per-node marks). Per node, a slot that only
    sometimes holds a leftover was marked in one SAVE and not the other; pooled over
    each kernel's launches, the marks and so the fingerprints agree."""
    from foundry.graphir.passes.definedness import _pointer_words, mark_alike

    a, b = (Archive.open(FIXTURES / "merged-saves" / side) for side in "ab")
    saves = [[archive.graph(0, e) for e in archive.entries(0)] for archive in (a, b)]
    before = [fingerprint(x) == fingerprint(y) for x, y in zip(*saves, strict=True)]
    assert not all(before)  # per-node marks: the fingerprints differ
    added = [mark_alike(irs) for irs in saves]
    assert all(n > 0 for n in added)
    assert [fingerprint(x) for x in saves[0]] == [fingerprint(y) for y in saves[1]]
    for irs in saves:  # every launch of a kernel carries its kernel's marks, except on its own pointer words
        pooled: dict = {}
        for node in (n for ir in irs for n in ir.kernels()):
            pooled.setdefault((node.kernel.name, node.layout), set()).update(node.undefined_offsets())
        for ir in irs:
            for node in ir.kernels():
                pointers = _pointer_words(ir, node)
                expected = {i for i in pooled[(node.kernel.name, node.layout)] if i - i % 8 not in pointers}
                assert expected <= node.undefined_offsets()
                operands = {o.offset for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
                assert not any(i - i % 8 in operands for i in node.undefined_offsets())  # no operand hidden


def test_pooling_leaves_a_launchs_own_pointers_defined():
    """A slot one launch of a kernel leaves undefined is marked in its other launches,
    except where a launch holds an address inside a region there: that may be a pointer
    the manifest missed, which archive diff --relocations must still see."""
    from foundry.graphir.passes.definedness import mark_alike

    ir = Archive.open(FIXTURES / "merged-saves" / "a").graph(0, "decode.bs1")
    for node in ir.kernels():  # start from no marks
        ir.replace_node(msgspec.structs.replace(node, undefined=()))
    by_kernel: dict = {}
    for node in ir.kernels():
        by_kernel.setdefault((node.kernel.name, node.layout), []).append(node)
    first, second, *_ = next(nodes for nodes in by_kernel.values() if len(nodes) >= 3)
    operands = {o.offset for o in ir.operands.of(second.id) if o.site is OperandSite.PARAM}
    word = next(w for w in range(0, len(second.params) - 7, 8) if w not in operands)
    region = ir.regions["vmm"]
    params = bytearray(second.params)
    params[word : word + 8] = (region.base + 0x100).to_bytes(8, "little")  # a region address, not in the manifest
    ir.replace_node(msgspec.structs.replace(second, params=bytes(params)))
    ir.replace_node(msgspec.structs.replace(first, undefined=((word, 8),)))
    assert mark_alike([ir]) >= 8
    assert not set(range(word, word + 8)) & ir.node(second.id).undefined_offsets()
    others = by_kernel[(first.kernel.name, first.layout)][2:]
    assert others and all(set(range(word, word + 8)) <= ir.node(n.id).undefined_offsets() for n in others)
