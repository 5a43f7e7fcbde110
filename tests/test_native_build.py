"""The native graph builder's reader, on the CPU: real archived graphs packed by
foundry.runtime.graphs.native_build and parsed by the C library (building needs a GPU),
and malformed descriptions it must refuse without reading past them."""

from __future__ import annotations

import ctypes
import struct

import msgspec
import pytest

from foundry.archive import Archive
from foundry.errors import DriverError, IRError
from foundry.runtime.graphs.native_build import check as check_packed
from foundry.runtime.graphs.native_build import pack, supported

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


def test_a_graph_with_a_newer_launch_attribute_packs_at_version_2(lib):
    """Version 1 for every graph without them, so an older library still reads those plans."""
    from foundry.graphir.kernel import LaunchAttribute

    ir = Archive.open(FIXTURES / "tiny-qwen3").graph(0, "decode.bs4")
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    assert struct.unpack_from("<I", desc, 4) == (1,)
    node = ir.kernels()[0]
    launch = msgspec.structs.replace(node.launch, attributes=(LaunchAttribute("preferred_cluster_dim", (2, 1, 1)),))
    ir.replace_node(msgspec.structs.replace(node, launch=launch))
    desc = pack(ir, NumberedFunctions(), attribute_bytes=lambda name, value, operands: (11, bytes(64)))
    assert struct.unpack_from("<I", desc, 4) == (2,)
    assert check_packed(lib, desc) == (len(ir), ir.edge_count())


def test_malformed_descriptions_are_refused_with_a_reason(lib):
    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "sample.bs8")
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    cases = {
        "truncated": desc[: len(desc) // 2],
        "magic": b"XXXX" + desc[4:],
        "version": desc[:4] + struct.pack("<I", 3) + desc[8:],
        "trailing": desc + bytes(4),
        "node count": desc[:8] + struct.pack("<I", 1 << 30) + desc[12:],
        "edge": desc[:-12] + struct.pack("<IIBBBB", 0, 999, 0, 0, 0, 0),
        "kind": desc[:16] + struct.pack("<I", 9) + desc[20:],
        "edge kinds": (
            desc[:12]
            + struct.pack("<I", 33)
            + desc[16 : len(desc) - 7 * 12]
            + b"".join(struct.pack("<IIBBBB", 0, 1, port, 0, 0, 0) for port in range(33))
        ),
    }
    reasons = {}
    for name, bad in cases.items():
        with pytest.raises(IRError) as err:
            check_packed(lib, bad)
        reasons[name] = str(err.value)
    assert "magic" in reasons["magic"] and "reads 1 and 2" in reasons["version"]
    assert "truncated" in reasons["truncated"] and "after the last edge" in reasons["trailing"]
    assert "999" in reasons["edge"] and "unknown kind 9" in reasons["kind"]
    assert "larger than the description" in reasons["node count"]
    assert "edge 32: more than 32 kinds of edge" in reasons["edge kinds"]


def test_self_loops_and_cycles_are_refused_naming_a_node(lib):
    """A plan's edges must form a DAG, as the IR's must (the C reader is LOAD's last check)."""
    from foundry.archive.schema import LaunchPlan
    from foundry.runtime.graphs.launch_plan import check_plan

    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "sample.bs8")  # a chain 0 -> 1 -> ... -> 7
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    assert check_packed(lib, desc) == (8, 7)
    loop = desc[:-12] + struct.pack("<IIBBBB", 3, 3, 0, 0, 0, 0)
    cycle = desc[:-12] + struct.pack("<IIBBBB", 6, 0, 0, 0, 0, 0)  # 6 -> 7 becomes 6 -> 0: 0..6 go round
    with pytest.raises(IRError, match="3 -> 3 makes node 3 depend on itself"):
        check_packed(lib, loop)
    with pytest.raises(IRError, match=r"the edges form a cycle through node [0-6]"):
        check_packed(lib, cycle)
    plan = LaunchPlan("plans/sample.bs8.fgb", "0" * 64, len(cycle), ())
    policy = lambda name, value, operands: (5, bytes(64))  # noqa: E731 - CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_...
    indexed = pack(ir, _Index(), attribute_bytes=policy)[:-12] + struct.pack("<IIBBBB", 6, 0, 0, 0, 0, 0)
    with pytest.raises(IRError, match="launch plan refused: the edges form a cycle"):
        check_plan(lib, indexed, msgspec.structs.replace(plan, kernels=_Index.table(ir)))


class _Index:
    """Kernel funcs as indices into a plan's function table, as SAVE packs them."""

    @staticmethod
    def table(ir):
        from foundry.archive.schema import PlanKernel

        names = sorted({n.kernel.name for n in ir.kernels()})
        return tuple(PlanKernel("0" * 64, name) for name in names)

    def function(self, kernel) -> int:
        return 0


def test_a_parameter_outside_its_buffer_is_refused(lib):
    kernel = struct.pack("<IQ3I3III", 1, 0x1000, 1, 1, 1, 32, 1, 1, 0, 0)
    params = struct.pack("<III", 1, 0, 16) + struct.pack("<I", 8) + bytes(8) + struct.pack("<I", 0)
    desc = b"FGB1" + struct.pack("<III", 1, 1, 0) + kernel + params
    with pytest.raises(IRError, match="outside the 8-byte buffer"):
        check_packed(lib, desc)
    fits = b"FGB1" + struct.pack("<III", 1, 1, 0) + kernel + struct.pack("<III", 1, 0, 8) + params[12:]
    assert check_packed(lib, fits) == (1, 0)


def nccl_style(archive: str, graph: str):
    """A real captured graph with one kernel turned into a launch the way NCCL makes
    them: one packed ``extra`` buffer shorter than the kernel's parameter layout."""
    ir = Archive.open(FIXTURES / archive).graph(0, graph)
    for node in ir.kernels():
        ends = [o.offset + 8 for o in ir.operands.of(node.id)]
        packed = max([*ends, 8])
        if packed + 8 <= node.layout.size:
            params = node.params[:packed] + bytes(node.layout.size - packed)
            ir.replace_node(msgspec.structs.replace(node, arg_mode="extra", packed_size=packed, params=params,
                                                    undefined=()))  # fmt: skip
            return ir, ir.node(node.id)
    raise AssertionError("no kernel in the fixture leaves room for a shorter buffer")


def test_a_shorter_packed_buffer_is_passed_as_captured(lib):
    from foundry.graphir.build import relocated_params
    from foundry.graphir.fingerprint import fingerprint

    ir, node = nccl_style("saveload-a", "decode.bs8")
    ir.check()
    sent = relocated_params(node, ir.operands.of(node.id), None)
    assert len(sent) == node.packed_size < node.layout.size and sent == node.params[: node.packed_size]
    moved = relocated_params(node, ir.operands.of(node.id), lambda o: o.value + (1 << 34))
    assert len(moved) == node.packed_size
    desc = pack(ir, NumberedFunctions(), attribute_bytes=fake_attribute)
    assert check_packed(lib, desc) == (len(ir), ir.edge_count())  # the C reader takes the shorter buffer
    original = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs8")
    assert fingerprint(ir) != fingerprint(original)
    as_params = msgspec.structs.replace(node, arg_mode="params")
    ir.replace_node(as_params)
    with pytest.raises(IRError, match="shorter packed buffer"):
        ir.check()


def test_the_packed_buffer_of_an_extra_launch_is_read_at_its_own_size():
    from foundry.graphir.kernel import ParamLayout
    from foundry.graphir.lower import _packed_params

    layout = ParamLayout((0,), (4096,))
    data = ctypes.create_string_buffer(bytes(range(1, 145)), 144)
    size = ctypes.c_size_t(144)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(data), 2, ctypes.addressof(size), 0)
    params, packed = _packed_params(extra, layout)
    assert packed == 144 and len(params) == 4096
    assert params[:144] == bytes(range(1, 145)) and params[144:] == bytes(4096 - 144)
    size.value = 4096
    whole = ctypes.create_string_buffer(bytes(4096), 4096)
    extra[1] = ctypes.addressof(whole)
    assert _packed_params(extra, layout) == (bytes(4096), 0)
    size.value = 0
    with pytest.raises(DriverError, match="empty"):
        _packed_params(extra, layout)


def test_a_packed_buffer_may_end_inside_its_parameters_but_not_run_past_them(lib):
    kernel = struct.pack("<IQ3I3III", 1, 0x1000, 1, 1, 1, 32, 1, 1, 0, 1)  # arg mode 1: one packed buffer
    layout = struct.pack("<III", 1, 0, 4096)

    def desc(nbytes: int) -> bytes:
        return b"FGB1" + struct.pack("<III", 1, 1, 0) + kernel + layout + struct.pack("<I", nbytes) + bytes(nbytes) \
            + struct.pack("<I", 0)  # fmt: skip

    assert check_packed(lib, desc(144)) == (1, 0)  # as NCCL launches its 4 KiB argument
    assert check_packed(lib, desc(4096)) == (1, 0)
    with pytest.raises(IRError, match="runs past its last parameter"):
        check_packed(lib, desc(4104))


def test_a_graph_is_written_at_the_lowest_version_that_holds_it():
    from foundry.graphir.codec import GRAPH_VERSION, decode_graph, encode_graph

    plain = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs8")
    ir, node = nccl_style("saveload-a", "decode.bs8")
    assert msgspec.msgpack.decode(encode_graph(plain))["version"] == 1  # older Foundry still reads it
    document = msgspec.msgpack.decode(encode_graph(ir))
    assert document["version"] == 2
    assert decode_graph(encode_graph(ir)).node(node.id).packed_size == node.packed_size
    document["version"] = GRAPH_VERSION + 1
    with pytest.raises(IRError, match="not readable by this Foundry"):
        decode_graph(msgspec.msgpack.encode(document))
