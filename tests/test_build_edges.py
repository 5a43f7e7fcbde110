"""The Python builder's edges on the CPU, against a stand-in for the driver's two edge calls
(this machine has no driver): the stand-in treats a batch of edges as the H200 test
machine's driver 580 did, giving every edge of one ``cuGraphAddDependencies`` call the
first edge's data, and fills at most the count ``cuGraphGetEdges`` is given. The builder
adds each kind of edge in a call of its own and refuses a graph whose edges read back
otherwise (another kind, one lost, one added), naming the first edge that differs. The
GPU tests (tests/test_gpu_rebuild.py) run the same code against the real driver."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from foundry.errors import IRError
from foundry.graphir import build
from foundry.graphir.graph import Edge, EdgeData

PROGRAMMATIC = EdgeData(1, 0, 1)
# a chain 0 -> 1 -> ... -> 7, its edges alternately programmatic and plain, the first programmatic,
# as in SGLang's decode graphs
CHAIN = [Edge(i, i + 1, PROGRAMMATIC if i % 2 == 0 else EdgeData()) for i in range(7)]
NODE = 0x1000  # the stand-in's handle of node 0, and so on


class StandInDriver:
    """The driver's edge calls as ``foundry.graphir.cuda.cu`` makes them (status stripped)."""

    def __init__(self, *, loses_plain: bool = False, adds_an_edge: bool = False, drops_one: bool = False) -> None:
        self.edges: list[tuple[int, int, SimpleNamespace]] = []
        self.batches: list[list[EdgeData]] = []  # the data of each cuGraphAddDependencies call
        self.loses_plain, self.adds_an_edge, self.drops_one = loses_plain, adds_an_edge, drops_one

    def __call__(self, name: str, *args):
        if name == "cuGraphAddDependencies":
            _, sources, targets, data, count = args
            self.batches.append([EdgeData(d.from_port, d.to_port, d.type) for d in data[:count]])
            first = data[0]  # driver 580: every edge of a batch gets the first edge's data
            for a, b in zip(sources[:count], targets[:count], strict=True):
                kept = SimpleNamespace(from_port=first.from_port, to_port=first.to_port, type=first.type)
                if self.loses_plain and kept.type == 0:
                    kept.type = 1
                self.edges.append((a, b, kept))
            if self.drops_one and len(self.batches) == 2:
                self.edges.pop()  # the plain call's last
            if self.adds_an_edge and len(self.batches) == 1:
                self.edges.append((sources[0], targets[0], SimpleNamespace(from_port=7, to_port=7, type=7)))
            return None
        if name == "cuGraphGetEdges":
            _, asked = args
            given = self.edges[:asked]
            if not asked:
                return [], [], [], len(self.edges)
            return [a for a, _, _ in given], [b for _, b, _ in given], [d for _, _, d in given], len(given)
        raise AssertionError(f"the stand-in has no {name}")


def added(stand_in: StandInDriver, edges: list[Edge]) -> None:
    """``_Builder.edges`` of a graph of ``edges``, the stand-in as the driver."""
    drv = SimpleNamespace(CUgraphEdgeData=lambda: SimpleNamespace(from_port=0, to_port=0, type=0))
    builder = SimpleNamespace(ir=SimpleNamespace(edges=lambda: edges, name="mixed"), drv=drv, graph="graph")
    build._Builder.edges(builder, [NODE + i for i in range(8)])


def test_each_kind_of_edge_is_added_in_a_call_of_its_own(monkeypatch):
    stand_in = StandInDriver()
    monkeypatch.setattr(build, "cu", stand_in)
    added(stand_in, CHAIN)
    assert stand_in.batches == [[PROGRAMMATIC] * 4, [EdgeData()] * 3]  # the IR's first kind first
    kept = {(a, b): EdgeData(d.from_port, d.to_port, d.type) for a, b, d in stand_in.edges}
    assert kept == {(NODE + e.src, NODE + e.dst): e.data for e in CHAIN}  # every edge with its own kind


def refusal(stand_in: StandInDriver, edges: list[Edge]) -> str:
    with pytest.raises(IRError) as err:
        added(stand_in, edges)
    return str(err.value)


def test_edges_read_back_with_another_kind_are_refused_naming_the_first(monkeypatch):
    monkeypatch.setattr(build, "cu", StandInDriver(loses_plain=True))
    assert refusal(build.cu, CHAIN) == ("mixed: edge 1 -> 2 came back programmatic from the default port, described "
                                        "plain (7 edges in all, 7 described)")  # fmt: skip


def test_an_edge_the_driver_added_is_refused(monkeypatch):
    monkeypatch.setattr(build, "cu", StandInDriver(adds_an_edge=True))
    assert refusal(build.cu, CHAIN) == ("mixed: the driver added an edge 0 -> 1 (type 7 from the 7 port, to port 7) "
                                        "(8 edges in all, 7 described)")  # fmt: skip


def test_an_edge_the_driver_lost_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(build, "cu", StandInDriver(drops_one=True))
    assert refusal(build.cu, CHAIN) == "mixed: the driver lost edge 5 -> 6 (plain) (6 edges in all, 7 described)"


def test_a_graph_without_edges_adds_none_and_is_read_back_too(monkeypatch):
    stand_in = StandInDriver()
    monkeypatch.setattr(build, "cu", stand_in)
    added(stand_in, [])
    assert stand_in.batches == [] and stand_in.edges == []
    stand_in.edges.append((NODE, NODE + 1, SimpleNamespace(from_port=0, to_port=0, type=0)))  # the driver's own
    assert refusal(stand_in, []) == "mixed: the driver added an edge 0 -> 1 (plain) (1 edges in all, 0 described)"


def test_an_edge_to_a_node_the_graph_was_not_given_is_named_so(monkeypatch):
    stand_in = StandInDriver()
    monkeypatch.setattr(build, "cu", stand_in)
    stand_in.edges.append((NODE, 0xBAD, SimpleNamespace(from_port=0, to_port=0, type=0)))
    assert refusal(stand_in, []) == "mixed: the driver added an edge 0 -> ? (plain) (1 edges in all, 0 described)"
