"""``foundry archive diff``: identical archives, one changed parameter, one inserted node, one
edge of another kind."""

from __future__ import annotations

import json
import shutil

import msgspec
from click.testing import CliRunner

from foundry.archive import Archive
from foundry.cli import main
from foundry.graphir.graph import Edge, EdgeData
from foundry.graphir.nodes import KernelNode
from foundry.graphir.passes.diff import EdgeChange, Status, node_label
from foundry.inspect.archive_diff import diff_archives

from .archive_tools import edit_graph, edit_json, flag_first_graph
from .conftest import FIXTURES


def changed(d):
    return [g for g in d.graphs if g.status is not Status.SAME]


def test_identical_archives(archive_copy):
    copy = archive_copy("tiny-qwen3")
    d = diff_archives(Archive.open(FIXTURES / "tiny-qwen3"), Archive.open(copy))
    assert d.identical and not d.environment
    assert [g.status for g in d.graphs] == [Status.SAME] * 3
    result = CliRunner().invoke(main, ["archive", "diff", str(FIXTURES / "tiny-qwen3"), str(copy)])
    assert result.exit_code == 0 and result.stdout.rstrip().endswith("identical")


def test_one_changed_kernel_parameter_is_exactly_that_change(archive_copy):
    path = archive_copy("tiny-qwen3")
    target = {}

    def change_scalar(ir):
        # the first kernel with a 4-byte scalar parameter: bump it
        for node in ir.kernels():
            ops = {o.offset for o in ir.operands.of(node.id)}
            for index, slot in enumerate(node.layout.slots):
                if slot.size == 4 and slot.offset not in ops:
                    old = node.params[slot.offset : slot.end]
                    new = (int.from_bytes(old, "little") + 1).to_bytes(4, "little")
                    ir.replace_node(
                        msgspec.structs.replace(node, params=node.params[: slot.offset] + new + node.params[slot.end :])
                    )
                    differ = [i for i in range(4) if old[i] != new[i]]
                    lo, hi = differ[0], differ[-1] + 1
                    target.update(node=node.id, index=index, start=slot.offset + lo, end=slot.offset + hi - 1,
                                  old=old[lo:hi].hex(), new=new[lo:hi].hex())  # fmt: skip
                    return

    edit_graph(path, "decode.bs2", change_scalar)
    d = diff_archives(Archive.open(FIXTURES / "tiny-qwen3"), Archive.open(path))
    (graph,) = changed(d)
    assert graph.name == "decode.bs2" and graph.status is Status.CHANGED
    (node,) = graph.nodes
    assert (node.status, node.a, node.b) == (Status.CHANGED, target["node"], target["node"])
    assert len(node.changes) == 1
    change = node.changes[0]
    assert change.field == f"param[{target['index']}] bytes {target['start']}..{target['end']}"
    assert (change.a, change.b) == (target["old"], target["new"])
    assert change.subject == f"param[{target['index']}]"
    assert not graph.edges_only_a and not graph.edges_only_b


def test_one_inserted_node_is_one_node_only_in_b(archive_copy):
    path = archive_copy("tiny-qwen3")
    inserted_at = 40

    def insert(ir):
        nodes = ir.nodes()
        extra = msgspec.structs.replace(nodes[10], id=inserted_at)
        shifted = [msgspec.structs.replace(n, id=n.id + 1) if n.id >= inserted_at else n for n in nodes]
        ops = [msgspec.structs.replace(o, node=o.node + 1) if o.node >= inserted_at else o for o in ir.operands]
        ops += [msgspec.structs.replace(o, node=inserted_at) for o in ir.operands.of(10)]
        edges = [
            Edge(s + (s >= inserted_at), d + (d >= inserted_at), e.data)
            for e in ir.edges()
            for s, d in [(e.src, e.dst)]
        ]
        edges = [e for e in edges if (e.src, e.dst) != (inserted_at - 1, inserted_at + 1)]
        edges += [Edge(inserted_at - 1, inserted_at), Edge(inserted_at, inserted_at + 1)]
        ir._nodes, ir._edges = {}, {}
        ir.add_nodes(sorted([*shifted, extra], key=lambda n: n.id))
        ir.add_edges(edges)
        ir.set_operands(ops)

    edit_graph(path, "decode.bs4", insert)
    d = diff_archives(Archive.open(FIXTURES / "tiny-qwen3"), Archive.open(path))
    (graph,) = changed(d)
    assert graph.name == "decode.bs4"
    assert [(n.status, n.a, n.b) for n in graph.nodes] == [(Status.ONLY_B, None, inserted_at)]
    assert isinstance(Archive.open(path).graph(0, "decode.bs4").node(inserted_at), KernelNode)
    assert sorted(graph.edges_only_b) == [(inserted_at - 1, inserted_at), (inserted_at, inserted_at + 1)]
    assert graph.edges_only_a == [(inserted_at - 1, inserted_at)]  # A's edge 39->40 now ends at the moved node


def test_an_edge_of_another_kind_is_one_changed_edge(archive_copy):
    """An edge made programmatic (its consumer may start before its producer ends) is listed
    once, with both kinds, not as an edge only in A and another only in B."""
    path = archive_copy("tiny-qwen3")
    programmatic = EdgeData(from_port=1, to_port=0, type=1)

    def make_programmatic(ir):
        ir._edges[(5, 6)] = programmatic

    edit_graph(path, "decode.bs2", make_programmatic)
    d = diff_archives(Archive.open(FIXTURES / "tiny-qwen3"), Archive.open(path))
    (graph,) = changed(d)
    assert graph.name == "decode.bs2" and not graph.nodes
    assert graph.edges_changed == [EdgeChange((5, 6), (5, 6), EdgeData(), programmatic)]
    assert not graph.edges_only_a and not graph.edges_only_b and graph.edge_count == 1
    assert (graph.edges_changed[0].kind_a, graph.edges_changed[0].kind_b) == (
        "plain", "programmatic from the programmatic port",
    )  # fmt: skip
    text = CliRunner().invoke(main, ["archive", "diff", str(FIXTURES / "tiny-qwen3"), str(path)])
    assert text.exit_code == 1
    assert "~ edge A 5 -> 6, B 5 -> 6: plain -> programmatic from the programmatic port" in text.stdout
    listed = json.loads(CliRunner().invoke(main, ["archive", "diff", "--json", str(FIXTURES / "tiny-qwen3"),
                                                  str(path)]).stdout)  # fmt: skip
    (entry,) = [g for g in listed["graphs"] if g["graph"] == "decode.bs2"]
    assert entry["edges_changed"] == [{"a": [5, 6], "b": [5, 6], "kind_a": "plain",
                                       "kind_b": "programmatic from the programmatic port",
                                       "data_a": [0, 0, 0], "data_b": [1, 0, 1]}]  # fmt: skip


def test_environment_and_graph_set_differences(archive_copy):
    path = archive_copy("tiny-qwen3")
    edit_json(path / "foundry-archive.json", lambda c: c["environment"].update(driver_version="590.1"))
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"].pop(0), root=path)
    d = diff_archives(Archive.open(FIXTURES / "tiny-qwen3"), Archive.open(path))
    assert [(c.field, c.a, c.b) for c in d.environment] == [("environment.driver_version", "580.159.04", "590.1")]
    assert [(g.name, g.status) for g in changed(d)] == [("decode.bs1", Status.ONLY_A)]
    reverse = diff_archives(Archive.open(path), Archive.open(FIXTURES / "tiny-qwen3"))
    assert [(g.name, g.status) for g in changed(reverse)] == [("decode.bs1", Status.ONLY_B)]
    result = CliRunner().invoke(main, ["archive", "diff", str(FIXTURES / "tiny-qwen3"), str(path), "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["identical"] is False and payload["environment"][0]["b"] == "590.1"


def test_different_models_align_only_shared_graphs():
    d = diff_archives(Archive.open(FIXTURES / "compiled-triton"), Archive.open(FIXTURES / "symm-mem-ws1"))
    assert {(g.name, g.status) for g in d.graphs} == {
        ("compiled.fused", Status.ONLY_A),
        ("symm.allreduce", Status.ONLY_B),
    }
    assert any(c.field == "model.model" for c in d.environment)


def test_bytes_either_save_marked_undefined_are_left_out_on_both_sides(tmp_path):
    # Two SAVEs of one program: A's runs saw a leftover byte vary and marked it; B's
    # runs happened to agree on it, so B kept a value. Same graph, different fingerprints.
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(FIXTURES / "saveload-a", a)
    shutil.copytree(FIXTURES / "saveload-a", b)
    ir = Archive.open(a).graph(0, "decode.bs1")
    node = next(n for n in ir.kernels() if not n.undefined and len(n.params) > 40)
    pointer_bytes = {o.offset + i for o in ir.operands.of(node.id) for i in range(8)}
    offset = next(i for i in range(len(node.params)) if i not in pointer_bytes and i + 1 not in pointer_bytes)

    edit_graph(
        a, "decode.bs1", lambda g: g.replace_node(msgspec.structs.replace(g.node(node.id), undefined=((offset, 1),)))
    )
    edit_graph(b, "decode.bs1", lambda g: _flip(g, node.id, offset))
    d = diff_archives(Archive.open(a), Archive.open(b))
    graph = next(g for g in d.graphs if g.name == "decode.bs1")
    assert graph.fingerprint_a != graph.fingerprint_b
    assert graph.status is Status.SAME and graph.undefined_only and d.identical
    # the diff names the node whose marks differ, so a SAVE-to-SAVE difference can be traced
    assert [(m.node, m.only_a, m.only_b) for m in graph.marks_differ] == [(node.id, 1, 0)]
    text = CliRunner().invoke(main, ["archive", "diff", str(a), str(b)])
    assert text.exit_code == 0 and f"node {node.id} " in text.stdout and "1 byte(s) undefined in A only" in text.stdout
    listed = json.loads(CliRunner().invoke(main, ["archive", "diff", "--json", str(a), str(b)]).stdout)
    entry = next(g for g in listed["graphs"] if g["graph"] == "decode.bs1")
    assert entry["marks_differ"] == [{"node": node.id, "label": node_label(node), "only_a": 1, "only_b": 0}]

    edit_graph(b, "decode.bs1", lambda g: _flip(g, node.id, offset + 1))  # outside A's marks: a real change
    again = next(g for g in diff_archives(Archive.open(a), Archive.open(b)).graphs if g.name == "decode.bs1")
    assert again.status is Status.CHANGED and not again.undefined_only
    assert [c.field.split(" bytes ")[1] for n in again.nodes for c in n.changes] == [f"{offset + 1}..{offset + 1}"]


def _flip(ir, node_id: int, offset: int) -> None:
    node = ir.node(node_id)
    params = bytearray(node.params)
    params[offset] ^= 0xFF
    ir.replace_node(msgspec.structs.replace(node, params=bytes(params)))


def test_a_stale_recorded_fingerprint_is_not_taken_for_marks(tmp_path):
    # No field differs, but B's recorded fingerprint is not its graph's: the graphs are
    # not "the same up to undefined bytes"; the diff says they differ and why to look.
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(FIXTURES / "saveload-a", a)
    shutil.copytree(FIXTURES / "saveload-a", b)

    def stale(session):
        session["graphs"][0]["fingerprint"] = "fp1:" + "0" * 64

    edit_json(b / "rank0" / "session.json", stale, root=b, graphs=False)
    d = diff_archives(Archive.open(a), Archive.open(b))
    graph = next(g for g in d.graphs if g.fingerprint_b == "fp1:" + "0" * 64)
    assert graph.status is Status.CHANGED and not graph.undefined_only and not graph.nodes
    result = CliRunner().invoke(main, ["archive", "diff", str(a), str(b)])
    assert result.exit_code == 1 and "a recorded fingerprint" in result.stdout


def test_graphs_a_load_would_instantiate_otherwise_make_the_archives_differ(archive_copy):
    """The same graph with other instantiation flags (say, SAVEs under two torch versions)
    runs otherwise after LOAD: not identical, and the diff says which graph and flags."""
    path = archive_copy("tiny-qwen3")
    flag_first_graph(path, 9)
    d = diff_archives(Archive.open(FIXTURES / "tiny-qwen3"), Archive.open(path))
    assert [(rank, name, c.field, c.a, c.b) for rank, name, c in d.entries] == [
        (0, "decode.bs1", "instantiate_flags", "0x0", "0x9")
    ]
    assert not d.identical and all(g.status is Status.SAME for g in d.graphs)
    result = CliRunner().invoke(main, ["archive", "diff", str(FIXTURES / "tiny-qwen3"), str(path)])
    assert result.exit_code == 1 and "instantiate_flags" in result.stdout and "archives differ" in result.stdout
    payload = json.loads(CliRunner().invoke(main, ["archive", "diff", str(FIXTURES / "tiny-qwen3"), str(path),
                                                   "--json"]).stdout)  # fmt: skip
    assert payload["entries"] == [{"rank": 0, "graph": "decode.bs1", "field": "instantiate_flags", "a": "0x0",
                                   "b": "0x9", "subject": "instantiate_flags"}]  # fmt: skip
