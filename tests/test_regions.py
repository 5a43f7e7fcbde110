"""Regions (foundry/graphir/regions.py): the sorted-range type every address lookup
uses, and region kinds spelled in one place, their enum."""

from __future__ import annotations

import pytest

from foundry.errors import IRError
from foundry.graphir.regions import AddressRanges, Region, RegionKind

from .test_env import ROOT, python_literals

KINDS = {kind.value for kind in RegionKind}

#: Words spelled like a region kind that mean something else where they appear.
NOT_REGION_KINDS = {
    ("foundry/archive/files.py", "host"): "the fallback for this machine's name in a temporary file's name",
    ("foundry/archive/outputs.py", "tensor"): "the tag of an output tensor's record",
    ("foundry/backends/deepep_abi.py", "tensor"): "the memory a DeepEP pointer parameter names",
    ("foundry/graphir/build.py", "host"): "a CUmemorytype of a memcpy",
    ("foundry/graphir/lower.py", "host"): "a CUmemorytype of a memcpy",
    ("foundry/graphir/kinds.py", "host"): "the host-function node kind",
    ("foundry/graphir/nodes.py", "host"): "a memcpy's memory type",
    ("foundry/inspect/summary.py", "rng"): "a graph's philox cells, a key of the JSON summary",
    ("foundry/integrations/sglang/plugin.py", "backend"): "an attribute of SGLang's graph configuration",
    ("foundry/integrations/sglang/warmup_skip.py", "alloc"): "an action of torch's allocator history",
    ("foundry/integrations/vllm/engine_config.py", "backend"): "a field of vLLM's compilation and attention configs",
    ("foundry/runtime/sessions/load_relocation.py", "backend"): "a key of LOAD's relocation report",
    ("foundry/runtime/sessions/save.py", "rng"): "a graph entry's philox record",
    ("tui/describe.py", "backend"): "the label of a kernel's claim",
}


def test_address_ranges_hold_their_starts_and_not_their_ends():
    ranges = AddressRanges([(0x3000, 0x4000), (0x1000, 0x2000)])  # given unsorted
    assert ranges.ranges == [(0x1000, 0x2000), (0x3000, 0x4000)]
    assert [a in ranges for a in (0xFFF, 0x1000, 0x1FFF, 0x2000, 0x3000, 0x3FFF, 0x4000)] == [
        False, True, True, False, True, True, False]  # fmt: skip
    assert 0x1000 not in AddressRanges()
    blocks = AddressRanges.of_blocks([(0x5000, 0x10), (0x100, 0x8)])
    assert blocks.ranges == [(0x100, 0x108), (0x5000, 0x5010)] and 0x107 in blocks and 0x108 not in blocks


def test_address_ranges_find_the_region_holding_an_address_and_refuse_overlaps():
    vmm = Region(RegionKind.VMM.value, RegionKind.VMM, 0x600000000000, 1 << 30)
    alloc = Region("alloc.0", RegionKind.ALLOC, 0x7F0000000000, 4096)
    ranges = AddressRanges.of_regions([alloc, vmm])
    assert ranges.regions() == [vmm, alloc] and len(ranges) == 2
    assert ranges.find(0x600000000000 + 5) is vmm and ranges.find(0x7F0000000FFF) is alloc
    assert ranges.find(0x7F0000001000) is None and 0x7F0000001000 not in ranges
    with pytest.raises(IRError, match="overlaps region 'vmm'"):
        ranges.add(Region("alloc.1", RegionKind.ALLOC, 0x600000000000 + (1 << 29), 4096))
    with pytest.raises(IRError, match="already used"):
        ranges.add(Region("alloc.0", RegionKind.ALLOC, 0x100000, 4096))
    with pytest.raises(IRError, match="reserved"):
        ranges.add(Region("unresolved", RegionKind.ALLOC, 0x100000, 4096))
    with pytest.raises(IRError, match="has size 0"):
        ranges.add(Region("alloc.2", RegionKind.ALLOC, 0x100000, 0))
    ranges.add(Region("alloc.3", RegionKind.ALLOC, 0x7F0000001000, 4096))  # adjacent is no overlap
    assert ranges.find(0x7F0000001000).name == "alloc.3"


def test_region_kinds_are_spelled_only_in_their_enum():
    spelled = python_literals(_region_kind_word(), (ROOT / "foundry", ROOT / "tui"))
    assert spelled.pop("foundry/graphir/regions.py") == KINDS
    found = {(path, word) for path, words in spelled.items() for word in words}
    assert found - set(NOT_REGION_KINDS) == set()
    assert set(NOT_REGION_KINDS) - found == set()  # the exceptions are still there and still needed


def _region_kind_word():
    import re

    words = "|".join(sorted(KINDS))
    return re.compile(rf"^(?:{words})$|^(?:{words})\.")
