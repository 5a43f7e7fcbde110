"""The native graph builder's reader, on the CPU: real archived graphs packed by
foundry.runtime.native_build and parsed by the C library (building needs a GPU),
and malformed descriptions it must refuse without reading past them."""

from __future__ import annotations

import ctypes
import struct

import pytest

from foundry.archive import Archive
from foundry.errors import IRError
from foundry.runtime.native_build import check as check_packed
from foundry.runtime.native_build import pack, supported

from .conftest import FIXTURES


class NumberedFunctions:
    """Stands in for the live CUfunction handles, which only a GPU process has."""

    def __init__(self) -> None:
        self.handles: dict[str, int] = {}

    def function(self, kernel) -> int:
        return self.handles.setdefault(kernel.name, 0x1000 + len(self.handles))


def fake_attribute(name, value, operands):
    return 7, bytes(64)


@pytest.fixture(scope="module")
def lib(hook_library) -> ctypes.CDLL:
    return ctypes.CDLL(str(hook_library))


GRAPHS = [("saveload-a", "decode.bs8"), ("saveload-a", "sample.bs8"), ("symm-mem-ws1", "symm.allreduce"),
          ("tiny-qwen3", "decode.bs4")]  # fmt: skip


@pytest.mark.parametrize(("archive", "graph"), GRAPHS)
def test_real_graphs_pack_and_parse(lib, archive, graph):
    ir = Archive.open(FIXTURES / archive).graph(0, graph)
    assert supported(ir)
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    assert check_packed(lib, desc) == (len(ir), ir.edge_count())


def test_malformed_descriptions_are_refused_with_a_reason(lib):
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "sample.bs8")
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    cases = {
        "truncated": desc[: len(desc) // 2],
        "magic": b"XXXX" + desc[4:],
        "version": desc[:4] + struct.pack("<I", 2) + desc[8:],
        "trailing": desc + bytes(4),
        "node count": desc[:8] + struct.pack("<I", 1 << 30) + desc[12:],
        "edge": desc[:-12] + struct.pack("<IIBBBB", 0, 999, 0, 0, 0, 0),
        "kind": desc[:16] + struct.pack("<I", 9) + desc[20:],
    }
    reasons = {}
    for name, bad in cases.items():
        with pytest.raises(IRError) as err:
            check_packed(lib, bad)
        reasons[name] = str(err.value)
    assert "magic" in reasons["magic"] and "version 2" in reasons["version"]
    assert "truncated" in reasons["truncated"] and "after the last edge" in reasons["trailing"]
    assert "999" in reasons["edge"] and "unknown kind 9" in reasons["kind"]
    assert "larger than the description" in reasons["node count"]


def test_a_parameter_outside_its_buffer_is_refused(lib):
    kernel = struct.pack("<IQ3I3III", 1, 0x1000, 1, 1, 1, 32, 1, 1, 0, 0)
    params = struct.pack("<III", 1, 0, 16) + struct.pack("<I", 8) + bytes(8) + struct.pack("<I", 0)
    desc = b"FGB1" + struct.pack("<III", 1, 1, 0) + kernel + params
    with pytest.raises(IRError, match="outside the 8-byte buffer"):
        check_packed(lib, desc)
    fits = b"FGB1" + struct.pack("<III", 1, 1, 0) + kernel + struct.pack("<III", 1, 0, 8) + params[12:]
    assert check_packed(lib, fits) == (1, 0)
