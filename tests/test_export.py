"""Graph export: GraphML reads back to the same graph; DOT lists every node and edge."""

from __future__ import annotations

import re

import networkx as nx
import pytest
from click.testing import CliRunner

from foundry.archive import Archive
from foundry.cli import main
from foundry.graphir.passes.export import export, flat_view

from .conftest import FIXTURES


@pytest.mark.parametrize(("archive", "graph"), [("tiny-qwen3", "decode.bs1"), ("symm-mem-ws1", "symm.allreduce")])
def test_graphml_reads_back_to_the_same_graph(tmp_path, archive, graph):
    ir = Archive.open(FIXTURES / archive).graph(0, graph)
    out = tmp_path / "g.graphml"
    result = CliRunner().invoke(
        main, ["graph", "export", str(FIXTURES / archive), graph, "--format", "graphml", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    back = nx.read_graphml(out, node_type=int)
    expected = flat_view(ir)
    assert nx.utils.nodes_equal(back.nodes, expected.nodes)
    assert nx.utils.edges_equal(back.edges, expected.edges)
    assert dict(back.nodes(data=True)) == dict(expected.nodes(data=True))
    assert {(s, d): a for s, d, a in back.edges(data=True)} == {(s, d): a for s, d, a in expected.edges(data=True)}
    kernel = back.nodes[0]
    assert kernel["kind"] == "kernel" and bytes.fromhex(kernel["params"]) == ir.node(0).params


def test_dot_lists_every_node_and_edge():
    ir = Archive.open(FIXTURES / "symm-mem-ws1").graph(0, "symm.allreduce")
    dot = export(ir, "dot")
    assert dot.startswith('digraph "symm.allreduce" {') and dot.rstrip().endswith("}")
    assert len(re.findall(r"^  \d+ \[label=", dot, re.M)) == len(ir)
    assert len(re.findall(r"^  \d+ -> \d+ ", dot, re.M)) == ir.edge_count()
    assert "one_shot_all_reduce_kernel" in dot and "symm.buffer_ptrs+0x0" in dot


def test_export_to_stdout_and_unknown_graph():
    runner = CliRunner()
    result = runner.invoke(main, ["graph", "export", "@sample", "decode.bs1", "--format", "dot"])
    assert result.exit_code == 0 and result.stdout.startswith('digraph "decode.bs1"')
    missing = runner.invoke(main, ["graph", "export", "@sample", "prefill", "--format", "dot"])
    assert missing.exit_code == 2 and "rank 0 has no graph 'prefill'" in missing.stderr
    bad_format = runner.invoke(main, ["graph", "export", "@sample", "decode.bs1", "--format", "png"])
    assert bad_format.exit_code == 2
