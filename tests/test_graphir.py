"""The IR on real captured graphs: round trips, invariants, fingerprints, exact lowering."""

from __future__ import annotations

import itertools
from collections import Counter

import msgspec
import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundry.archive import Archive
from foundry.errors import IRError
from foundry.graphir.codec import decode_graph, encode_graph
from foundry.graphir.fingerprint import fingerprint
from foundry.graphir.graph import EDGE_KEY, NODE_KEY, Edge, EdgeData, GraphIR
from foundry.graphir.kernel import KernelIdentity, LaunchConfig, ParamLayout, ParamSlot, template_args
from foundry.graphir.kinds import NodeKind
from foundry.graphir.nodes import EmptyNode, KernelNode, MemsetNode, merged_ranges, ranges_minus, ranges_size
from foundry.graphir.operands import Operand, OperandManifest, OperandSite
from foundry.graphir.regions import UNRESOLVED, Region, RegionKind

from .conftest import ARCHIVES, FIXTURES


def all_fixture_graphs():
    for name in ARCHIVES:
        archive = Archive.open(FIXTURES / name)
        for rank, entry in archive.select():
            yield pytest.param(archive, rank, entry, id=f"{name}:{entry.name}")


def tiny_graph() -> GraphIR:
    """Two nodes: a kernel reading one pointer, and a memset into the same region."""
    region = Region("alloc.0", RegionKind.ALLOC, 0x7F00_0000_0000, 4096)
    ir = GraphIR("tiny", regions=[region])
    params = (0x7F00_0000_0010).to_bytes(8, "little") + (7).to_bytes(4, "little")
    kernel = KernelNode(
        0,
        KernelIdentity("_Z3fooPfi"),
        LaunchConfig((1, 1, 1), (32, 1, 1)),
        ParamLayout.of([ParamSlot(0, 8), ParamSlot(8, 4)]),
        params,
    )
    memset = MemsetNode(1, 0x7F00_0000_0100, 0, 4, 16)
    ir.add_nodes([kernel, memset])
    ir.add_edges([Edge(0, 1)])
    ir.set_operands(
        [
            Operand(0, OperandSite.PARAM, 0, 0, 0x7F00_0000_0010, "alloc.0", 0x10),
            Operand(1, OperandSite.MEMSET_DST, -1, 0, 0x7F00_0000_0100, "alloc.0", 0x100),
        ]
    )
    ir.check()
    return ir


@pytest.mark.parametrize(("archive", "rank", "entry"), list(all_fixture_graphs()))
def test_archive_ir_archive_is_byte_stable(archive, rank, entry):
    data = archive.graph_bytes(rank, entry)
    ir = decode_graph(data)
    assert encode_graph(ir) == data
    assert fingerprint(ir) == entry.fingerprint


@pytest.mark.parametrize(("archive", "rank", "entry"), list(all_fixture_graphs()))
def test_a_manifest_read_by_region_index_counts_as_one_built_from_operands(archive, rank, entry):
    read = archive.graph(rank, entry, deep=False).operands  # regions kept as the file's indices
    uses, unresolved = read.region_uses(), read.count_unresolved()
    built = OperandManifest(read)  # regions by name
    assert uses == built.region_uses() == dict(Counter(o.region for o in built))
    assert unresolved == built.count_unresolved() == uses.get(UNRESOLVED, 0)
    assert read.region_names() == built.region_names() and list(read.rows()) == list(built.rows())


def test_a_manifest_built_from_operands_maps_its_regions_onto_the_file_s_list():
    operands = [Operand(0, OperandSite.PARAM, 0, 0, 0x10, "weights", 0x10),
                Operand(1, OperandSite.PARAM, 0, 8, 0x99, UNRESOLVED, 0),
                Operand(2, OperandSite.PARAM, 0, 0, 0x20, "kv", 0x20)]  # fmt: skip
    built = OperandManifest(operands)
    columns = built.to_columns(["a-first", "kv", "weights"])  # more names, in another order, than it uses
    assert columns.region == [2, -1, 1]
    assert OperandManifest.from_columns(columns, ["a-first", "kv", "weights"]).as_tuple() == built.as_tuple()
    with pytest.raises(IRError, match="region the graph does not list") as err:
        built.to_columns(["weights"])
    assert err.value.found == "kv"


def test_unresolved_operands_read_by_region_index_are_counted():
    archive = Archive.open(FIXTURES / "tiny-qwen3")
    document = msgspec.msgpack.decode(archive.graph_bytes(0, archive.entries(0)[0]))
    document["operands"]["region"][:5] = [-1] * 5
    read = decode_graph(msgspec.msgpack.encode(document), deep=False).operands
    assert read.count_unresolved() == 5 and read.region_uses()[UNRESOLVED] == 5
    assert read.region_uses() == OperandManifest(read).region_uses()
    assert [o.region for o in read.unresolved()] == [UNRESOLVED] * 5


@pytest.mark.parametrize(("archive", "rank", "entry"), list(all_fixture_graphs()))
def test_networkx_view_carries_typed_nodes_and_edge_data(archive, rank, entry):
    ir = archive.graph(rank, entry)
    g = ir.nx
    assert isinstance(g, nx.DiGraph)
    assert g.number_of_nodes() == len(ir) == entry.nodes
    assert all(g.nodes[i][NODE_KEY].id == i for i in g.nodes)
    assert all(isinstance(d[EDGE_KEY], EdgeData) for _, _, d in g.edges(data=True))
    assert nx.is_directed_acyclic_graph(g)


def test_tiny_qwen3_lowering_is_exact():
    """Every model weight's address is an operand (at offset 0 of its region) and nothing is unresolved."""
    archive = Archive.open(FIXTURES / "tiny-qwen3")
    for entry in archive.entries(0):
        ir = archive.graph(0, entry)
        weights = {name for name, r in ir.regions.items() if r.kind is RegionKind.TENSOR and name.startswith("weight.")}
        assert len(weights) == ir.meta["weights"] == 25  # Qwen3 2 layers: 11 per layer + embed, norm, lm_head
        starts = {o.region for o in ir.operands if o.region in weights and o.region_offset == 0}
        assert starts == weights
        assert ir.operands.count_unresolved() == 0
        assert len(ir.operands) > 500


def test_symm_fixture_resolves_backend_regions():
    ir = Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce")
    targets = {(o.node, o.param): o.region for o in ir.operands if o.site == OperandSite.PARAM}
    one_shot, two_shot = (n.id for n in ir.kernels() if "all_reduce" in n.kernel.name)
    assert targets[(one_shot, 0)] == "symm.buffer_ptrs"
    assert targets[(one_shot, 5)] == "symm.signal_pad_ptrs"
    assert targets[(two_shot, 0)] == "symm.buffer_ptrs"
    assert targets[(two_shot, 3)] == "symm.signal_pad_ptrs"
    memcpy = next(n for n in ir.nodes() if n.kind is NodeKind.MEMCPY)
    assert {o.site: o.region for o in ir.operands.of(memcpy.id)}[OperandSite.MEMCPY_DST] == "symm.buffer"


def test_fingerprint_ignores_addresses_but_not_meaning():
    """Shifting every region (a SAVE at another base) keeps the fingerprint; a scalar byte changes it."""
    ir = tiny_graph()
    base = fingerprint(ir)
    delta = 16 << 30
    shifted = GraphIR("tiny", regions=[msgspec.structs.replace(r, base=r.base + delta) for r in ir.regions.values()])
    kernel, memset = ir.nodes()
    params = (int.from_bytes(kernel.params[:8], "little") + delta).to_bytes(8, "little") + kernel.params[8:]
    shifted.add_nodes(
        [msgspec.structs.replace(kernel, params=params), msgspec.structs.replace(memset, dst=memset.dst + delta)]
    )
    shifted.add_edges(ir.edges())
    shifted.set_operands([msgspec.structs.replace(o, value=o.value + delta) for o in ir.operands])
    shifted.check()
    assert fingerprint(shifted) == base

    ir.replace_node(msgspec.structs.replace(kernel, params=kernel.params[:8] + (8).to_bytes(4, "little")))
    assert fingerprint(ir) != base


def test_fingerprint_sees_operand_target_and_edges():
    ir = tiny_graph()
    base = fingerprint(ir)
    moved = GraphIR("tiny", regions=ir.regions.values())
    moved.add_nodes(ir.nodes())
    moved.set_operands(ir.operands)
    assert fingerprint(moved) != base  # edge missing
    moved.add_edges([Edge(0, 1, EdgeData(type=1))])
    assert fingerprint(moved) != base  # programmatic instead of full dependency


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda ir: ir.add_nodes([EmptyNode(0)]), "node id used twice"),
        (lambda ir: ir.add_edges([Edge(0, 9)]), "names a node the graph does not have"),
        (lambda ir: ir.add_edges([Edge(0, 1)]), "duplicate edge"),
    ],
)
def test_mutations_refuse_broken_structure(mutate, message):
    with pytest.raises(IRError, match=message):
        mutate(tiny_graph())


def test_check_names_operand_that_disagrees_with_bytes():
    ir = tiny_graph()
    ops = list(ir.operands)
    ops[0] = msgspec.structs.replace(ops[0], value=ops[0].value + 8, region_offset=ops[0].region_offset + 8)
    ir.set_operands(ops)
    with pytest.raises(IRError, match="disagrees with the node's bytes") as err:
        ir.check()
    assert err.value.node == 0
    ir.check_structure()  # structure alone is fine: offline passes can still read it


def test_check_names_region_offset_mismatch_and_unknown_region():
    ir = tiny_graph()
    ops = list(ir.operands)
    ir.set_operands([msgspec.structs.replace(ops[0], region_offset=0x18), ops[1]])
    with pytest.raises(IRError, match=r"offset in alloc\.0 does not match"):
        ir.check()
    ir.set_operands([msgspec.structs.replace(ops[0], region="alloc.7"), ops[1]])
    with pytest.raises(IRError, match=r"unknown region 'alloc\.7'"):
        ir.check_structure()


def test_unresolved_operand_is_kept_and_checked():
    ir = tiny_graph()
    ops = list(ir.operands)
    ir.set_operands([ops[0], msgspec.structs.replace(ops[1], region=UNRESOLVED, region_offset=0)])
    ir.check()
    assert [o.node for o in ir.operands.unresolved()] == [1]
    assert ir.operands.unresolved()[0].location() == "unresolved 0x7f0000000100"


def test_kernel_layout_must_match_parameter_bytes():
    ir = tiny_graph()
    kernel = ir.node(0)
    ir.replace_node(msgspec.structs.replace(kernel, params=kernel.params + b"\x00"))
    with pytest.raises(IRError, match="parameter bytes do not match the layout"):
        ir.check()


def test_a_kernel_is_refused_however_many_alike_passed_before_it():
    ir = tiny_graph()
    kernel = ir.node(0)
    ir.add_nodes(msgspec.structs.replace(kernel, id=i) for i in range(2, 6))  # the same launch, again and again
    ir.check_structure()
    ir.replace_node(msgspec.structs.replace(kernel, id=4, undefined=((8, 8),)))  # past the 12 parameter bytes
    ir.replace_node(msgspec.structs.replace(kernel, id=5, undefined=((8, 8),)))
    with pytest.raises(IRError, match="undefined bytes must be ordered runs") as err:
        ir.check_structure()
    assert err.value.node == 4
    ir.replace_node(msgspec.structs.replace(kernel, id=3, params=kernel.params + b"\x00"))
    with pytest.raises(IRError, match="parameter bytes do not match the layout") as err:
        ir.check_structure()
    assert err.value.node == 3


def test_demangled_and_short_names():
    one_shot = Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce").kernels()[1].kernel
    assert one_shot.demangled.startswith(
        "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, -1>("
    )
    assert one_shot.short_name == "(anon)::one_shot_all_reduce_kernel<...>"
    assert template_args(one_shot.demangled) == ["c10::BFloat16", "16", "-1"]
    triton = KernelIdentity("triton_per_fused_add_gelu_mul_sum_0")
    assert triton.demangled == triton.short_name == "triton_per_fused_add_gelu_mul_sum_0"


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    a=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=12),
    b=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=12),
)
def test_byte_ranges_count_what_byte_sets_would(a, b):
    """Undefined bytes are compared as ranges; these are the sets they stand for."""
    runs_a, runs_b = merged_ranges((o, o + n) for o, n in a), merged_ranges((o, o + n) for o, n in b)
    set_a = {i for o, n in a for i in range(o, o + n)}
    set_b = {i for o, n in b for i in range(o, o + n)}
    assert ranges_size(runs_a) == len(set_a)
    assert ranges_minus(runs_a, runs_b) == len(set_a - set_b) and ranges_minus(runs_b, runs_a) == len(set_b - set_a)
    assert all(x[1] < y[0] for x, y in itertools.pairwise(runs_a))  # sorted, disjoint, not touching


def test_node_ids_must_be_every_number_below_the_count_in_any_order():
    """The structure check's fast path (ids in capture order) and its slow one (in another order)."""
    archive = Archive.open(FIXTURES / "saveload-a")
    entry = archive.entries(0)[0]
    document = msgspec.msgpack.decode(archive.graph_bytes(0, entry))
    nodes = document["nodes"]
    shuffled = {**document, "nodes": [nodes[-1], *nodes[:-1]]}
    assert len(decode_graph(msgspec.msgpack.encode(shuffled), deep=False)) == len(nodes)
    gap = {**document, "nodes": [*nodes[:-1], {**nodes[-1], "id": len(nodes) + 5}]}
    gap["edges"] = [e for e in document["edges"] if len(nodes) - 1 not in e[:2]]
    with pytest.raises(IRError, match=rf"node ids must be 0..{len(nodes) - 1} in capture order"):
        decode_graph(msgspec.msgpack.encode(gap), deep=False)


@pytest.mark.parametrize(
    ("param", "offset", "packed"),
    [(1, 0, None), (0, 4, None), (1, 8, None), (2, 8, None), (-1, 0, None), (0, 0, 4)],
    ids=["another-parameter", "misaligned", "past-its-parameter", "no-such-parameter", "negative", "past-the-launch"],
)
def test_a_param_operand_must_name_a_whole_word_of_its_parameter_that_the_launch_passes(param, offset, packed):
    """Each way a recorded operand can name no word of the bytes the driver gets: refused, never read as one."""
    ir = tiny_graph()
    if packed is not None:
        ir.replace_node(msgspec.structs.replace(ir.node(0), packed_size=packed, arg_mode="extra"))
    ops = list(ir.operands)
    ops[0] = msgspec.structs.replace(ops[0], param=param, offset=offset)
    ir.set_operands(ops)
    with pytest.raises(IRError, match="disagrees with the node's bytes") as err:
        ir.check()
    assert err.value.node == 0 and err.value.found is None


def test_a_graph_with_a_cache_preference_is_format_3_and_an_older_claim_is_refused():
    """An older Foundry does not know the attribute: the document says version 3, and one that
    claims less is refused rather than misread."""
    from foundry.graphir.codec import graph_version, to_document
    from foundry.graphir.kernel import FuncAttribute

    ir = tiny_graph()
    assert graph_version(ir) == 1
    ir.replace_node(msgspec.structs.replace(ir.node(0), func_attrs=(FuncAttribute("cache_config", 1),)))
    assert graph_version(ir) == 3 and decode_graph(encode_graph(ir)).node(0).func_attrs == ir.node(0).func_attrs
    claimed = msgspec.structs.replace(to_document(ir), version=2)
    with pytest.raises(IRError, match="holds fields of format version 3") as err:
        decode_graph(msgspec.msgpack.encode(claimed))
    assert err.value.field == "version"


@pytest.mark.parametrize(
    ("name", "value"), [("preferred_cluster_dim", (8, 1, 1)), ("nvlink_util_centric_scheduling", 1)]
)
def test_a_graph_with_a_newer_launch_attribute_is_format_4_and_an_older_claim_is_refused(name, value):
    from foundry.graphir.codec import graph_version, to_document
    from foundry.graphir.kernel import LaunchAttribute

    ir = tiny_graph()
    node = ir.node(0)
    launch = msgspec.structs.replace(node.launch, attributes=(LaunchAttribute(name, value),))
    ir.replace_node(msgspec.structs.replace(node, launch=launch))
    assert graph_version(ir) == 4 and decode_graph(encode_graph(ir)).node(0).launch == launch
    claimed = msgspec.structs.replace(to_document(ir), version=3)
    with pytest.raises(IRError, match="holds fields of format version 4") as err:
        decode_graph(msgspec.msgpack.encode(claimed))
    assert err.value.field == "version"


def test_an_edge_names_its_kind():
    assert EdgeData().kind == "plain"
    assert EdgeData(from_port=1, type=1).kind == "programmatic from the programmatic port"
    assert EdgeData(from_port=2, type=1).kind == "programmatic from the launch-order port"
    assert EdgeData(from_port=0, type=1).kind == "programmatic from the default port"
    ir = GraphIR("kinds")
    ir.add_nodes([EmptyNode(i) for i in range(4)])
    ir.add_edges([Edge(0, 1), Edge(1, 2, EdgeData(1, 0, 1)), Edge(2, 3, EdgeData(1, 0, 1))])
    assert ir.edge_kinds() == {"plain": 1, "programmatic from the programmatic port": 2}
