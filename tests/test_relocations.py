"""Relocation on the CPU, on the SAVE captured on the H200 (tests/fixtures/saveload-a):
the rebasing arithmetic LOAD applies, and `foundry archive diff --relocations`, which
proves that only operand words move between two SAVEs at different bases."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from foundry.archive import Archive
from foundry.backends.vmm import VmmBackend
from foundry.errors import BackendError
from foundry.graphir.build import relocated_params
from foundry.graphir.operands import WORD, OperandSite
from foundry.inspect.relocations import check_relocations, rebase

from .archive_tools import write_archive
from .conftest import FIXTURES

SAVE = FIXTURES / "saveload-a"
SHIFT = 16 << 30


def write(path, graphs) -> Archive:
    return write_archive(path, graphs, like=SAVE)


@pytest.fixture
def pair(tmp_path):
    source = Archive.open(SAVE)
    graphs = [source.graph(0, e) for e in source.entries(0)]
    return write(tmp_path / "a", graphs), graphs


def test_rebasing_moves_every_operand_word_and_nothing_else():
    ir = Archive.open(SAVE).graph(0, "decode.bs8")
    moved = rebase(ir, {"vmm": SHIFT})
    moved.check()  # operands still agree with the bytes they name
    for node in ir.kernels():
        words = {o.offset for o in ir.operands.of(node.id) if o.site is OperandSite.PARAM}
        other = moved.node(node.id)
        for i, (x, y) in enumerate(zip(node.params, other.params, strict=True)):
            assert (x != y) <= any(w <= i < w + WORD for w in words)
    # LOAD's relocation of the saved graph gives exactly the rebased parameters
    for node in ir.kernels():
        assert relocated_params(node, ir.operands.of(node.id), lambda o: o.value + SHIFT) == moved.node(node.id).params


class Live:
    rank, world_size = 0, 1

    def __init__(self, base: int) -> None:
        self.base = base

    def backend_facts(self, backend: str) -> dict:
        return {"base": self.base}


def test_the_vmm_backend_rebases_its_operands_and_refuses_others():
    ir = Archive.open(SAVE).graph(0, "sample.bs8")
    operand = next(iter(ir.operands))
    backend = VmmBackend()
    assert backend.relocate(operand, Live(0x700000000000)) == 0x700000000000 + operand.region_offset
    assert "relocate" in backend.implements()
    with pytest.raises(BackendError, match="vmm"):
        backend.relocate(msgspec.structs.replace(operand, region="symm.buffer"), Live(0))


def test_a_clean_pair_proves_every_operand(pair, tmp_path):
    a, graphs = pair
    b = write(tmp_path / "b", [rebase(ir, {"vmm": SHIFT}) for ir in graphs])
    report = check_relocations(a, b)
    assert report.findings == [] and report.deltas == {"vmm": SHIFT}
    assert report.operands_moved == sum(len(ir.operands) for ir in graphs) and report.graphs == 3


def test_a_word_that_moved_but_is_no_operand_is_a_finding(pair, tmp_path):
    a, graphs = pair
    moved = [rebase(ir, {"vmm": SHIFT}) for ir in graphs]
    ir = moved[0]
    node = next(n for n in ir.kernels() if not n.undefined and len(n.params) > 16)
    words = {o.offset for o in ir.operands.of(node.id)}
    scalar = next(w for w in range(0, len(node.params) - WORD + 1, WORD) if w not in words)
    params = bytearray(node.params)
    params[scalar] ^= 0x01  # as if a packed address (a TMA descriptor, say) had moved unseen
    ir.replace_node(msgspec.structs.replace(node, params=bytes(params)))
    report = check_relocations(a, write(tmp_path / "b", moved))
    assert len(report.findings) == 1
    finding = report.findings[0]
    assert finding.node == node.id and f"parameter byte {scalar} changed but is no operand" in finding.what


def test_an_operand_that_moved_by_another_delta_is_a_finding(pair, tmp_path):
    a, graphs = pair
    moved = [rebase(ir, {"vmm": SHIFT}) for ir in graphs]
    ir = moved[2]
    target = next(iter(ir.operands))
    wrong = rebase(ir, {})  # a copy to edit
    wrong.set_operands(msgspec.structs.replace(o, value=o.value + 0x100, region_offset=o.region_offset + 0x100)
                       if o == target else o for o in ir.operands)  # fmt: skip
    node = wrong.node(target.node)
    params = bytearray(node.params)
    params[target.offset : target.offset + WORD] = (target.value + 0x100).to_bytes(WORD, "little")
    wrong.replace_node(msgspec.structs.replace(node, params=bytes(params)))
    moved[2] = wrong
    report = check_relocations(a, write(tmp_path / "b", moved))
    assert [f.node for f in report.findings] == [target.node]
    assert "moved by 0x400000100" in report.findings[0].what


def test_the_command_line(pair, tmp_path):
    _, graphs = pair
    write(tmp_path / "b", [rebase(ir, {"vmm": SHIFT}) for ir in graphs])

    def run(*args):
        return subprocess.run([sys.executable, "-m", "foundry", "archive", "diff", "--relocations", *args],
                              capture_output=True, text=True)  # fmt: skip

    ok = run(str(tmp_path / "a"), str(tmp_path / "b"))
    assert ok.returncode == 0 and "every change is a relocation" in ok.stdout and "vmm by 0x400000000" in ok.stdout
    same = run(str(tmp_path / "a"), str(tmp_path / "a"), "--json")
    assert same.returncode == 1 and "nothing proven" in json.loads(same.stdout)["findings"][0]["what"]


def test_a_copy_address_that_moved_without_an_operand_is_a_finding(tmp_path):
    source = Archive.open(FIXTURES / "symm-mem-ws1")
    ir = source.graph(0, "symm.allreduce")
    memcpy = next(n for n in ir.nodes() if n.kind == "memcpy")
    ir.set_operands(o for o in ir.operands if o.node != memcpy.id)  # the manifest misses the copy's addresses
    moved = rebase(ir, {name: SHIFT for name in ir.regions})
    moved.replace_node(msgspec.structs.replace(moved.node(memcpy.id), dst=memcpy.dst + SHIFT))
    report = check_relocations(write(tmp_path / "a", [ir]), write(tmp_path / "b", [moved]))
    assert [(f.node, f.what) for f in report.findings] == [(memcpy.id, "memcpy.dst address changed but is no operand")]
