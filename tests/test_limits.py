"""The limits of ``foundry.graphir.limits`` and ``foundry.archive.schema``: a graph or
session over one is refused before it is built, cheaply, and every offline command
on the largest archive the limits allow stays under 1 GiB of peak RSS (the same
archive ``bench/hostile_memory.py`` builds; the bench adds its sessions and MoE-scale
archives and ``graph show``'s table, which takes a minute at 32,768 rows)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import msgspec
import pytest

from foundry.archive import Archive, ArchiveWriter, reader
from foundry.archive.files import DEFAULT_LIMITS, Limits
from foundry.archive.sample import sample_path
from foundry.archive.schema import CATALOG_FILE, MAX_ARCHIVE_GRAPHS, MAX_GRAPHS, MAX_TRACE, MAX_WORLD_SIZE
from foundry.errors import ArchiveError
from foundry.graphir import limits
from foundry.graphir.graph import GraphIR
from foundry.graphir.kernel import KernelIdentity, LaunchConfig, ParamLayout
from foundry.graphir.nodes import KernelNode
from foundry.graphir.passes.diff import LISTED_CHANGES, VALUE_CHARS, Status, diff_graphs
from foundry.inspect import archive_diff as archive_diff_module
from foundry.inspect import lint as lint_module
from foundry.inspect import relocations as relocations_module
from foundry.inspect import summary as summary_module
from foundry.inspect.archive_diff import diff_archives
from foundry.inspect.lint import Severity, lint
from foundry.inspect.relocations import check_relocations
from foundry.inspect.summary import summarize

from .archive_tools import edit_json, graph_file, reseal
from .conftest import load_script
from .hostile import assert_refused, edit_document, first_kernel

ROOT = Path(__file__).resolve().parent.parent
GiB = 1 << 30


def _bench():
    return load_script(ROOT / "bench" / "hostile_memory.py", "hostile_memory")


def copy(tmp_path: Path) -> Path:
    target = tmp_path / "archive"
    shutil.copytree(sample_path(), target)
    return target


def _empty_nodes(count: int):
    def edit(d: dict) -> None:
        d["nodes"] = [{"type": "empty", "id": i} for i in range(count)]
        d["edges"] = []
        d["operands"] = {k: [] for k in d["operands"]}

    return edit


def _chain(edges: int):
    def edit(d: dict) -> None:
        _empty_nodes(limits.MAX_NODES)(d)
        d["edges"] = [[i % (limits.MAX_NODES - 1), i % (limits.MAX_NODES - 1) + 1, [0, 0, 0]] for i in range(edges)]

    return edit


def _layouts(nodes: int, params: int):
    """``nodes`` kernels of ``params`` one-byte parameters each."""

    def edit(d: dict) -> None:
        kernel = first_kernel(d)
        kernel.update(
            layout={"offsets": list(range(params)), "sizes": [1] * params}, params=bytes(params), undefined=[]
        )
        d["nodes"] = [{**kernel, "id": i} for i in range(nodes)]
        d["edges"] = []
        d["operands"] = {k: [] for k in d["operands"]}

    return edit


OVER = {
    "nodes": (_empty_nodes(limits.MAX_NODES + 1), rf": nodes: Expected `array` of length <= {limits.MAX_NODES}"),
    "edges": (_chain(limits.MAX_EDGES + 1), rf": edges: Expected `array` of length <= {limits.MAX_EDGES}"),
    "2M edges (the probe's 21 MB graph)": (_chain(2_000_000), rf"length <= {limits.MAX_EDGES}"),
    "operands": (lambda d: d["operands"].update(node=[0] * (limits.MAX_OPERANDS + 1)),
                 rf": operands\.node: Expected `array` of length <= {limits.MAX_OPERANDS}"),
    "regions": (lambda d: d.update(regions=[{"name": f"r{i}", "kind": "alloc", "base": 4096 * i, "size": 4096}
                                            for i in range(limits.MAX_REGIONS + 1)]),
                rf": regions: Expected `array` of length <= {limits.MAX_REGIONS}"),
    "parameter bytes": (lambda d: first_kernel(d).update(params=bytes(limits.MAX_PARAM_BYTES + 1)), r"params"),
    "parameters of a kernel": (_layouts(1, limits.MAX_PARAMS + 1), r"layout\.offsets"),
    "parameters of a graph": (_layouts(limits.MAX_GRAPH_PARAMS // limits.MAX_PARAMS + 1, limits.MAX_PARAMS),
                              "more parameters, undefined runs or launch attributes than a graph may"),
    "meta": (lambda d: d.update(meta={f"k{i}": i for i in range(limits.MAX_META + 1)}),
             rf": meta: Expected `object` of length <= {limits.MAX_META}"),
    "kernel name": (lambda d: first_kernel(d)["kernel"].update(name="k" * (limits.MAX_NAME + 1)), r"kernel\.name"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(OVER))
def test_a_graph_over_a_count_limit_is_refused_before_it_is_built(cli, tmp_path, case):
    edit, message = OVER[case]
    path = copy(tmp_path)
    edit_document(path, "decode.bs1", edit)
    for command in (["archive", "inspect", path], ["graph", "show", path, "decode.bs1"], ["archive", "verify", path]):
        outcome = cli.run(*command)
        assert_refused(outcome, match=message)
        assert outcome.maxrss_kib < 300 << 10, f"{outcome.maxrss_kib} KiB to refuse it"


# MessagePack headers that claim what the bytes behind them do not hold: 2**32 - 1 elements of an
# array or map, a string or byte string of 4 GiB. A reader that sized anything by the claim would
# allocate gigabytes; the limits are checked from the header, before an element is read.
_CLAIM = "CLAIMED-COUNT"
_HEADERS = {"array": b"\xdd\xff\xff\xff\xff", "map": b"\xdf\xff\xff\xff\xff", "str": b"\xdb\xff\xff\xff\xff",
            "bin": b"\xc6\xff\xff\xff\xff"}  # fmt: skip
CLAIMS = {
    "nodes": ("array", lambda d: d.update(nodes=_CLAIM)),
    "edges": ("array", lambda d: d.update(edges=_CLAIM)),
    "operand column": ("array", lambda d: d["operands"].update(value=_CLAIM)),
    "regions": ("array", lambda d: d.update(regions=_CLAIM)),
    "meta": ("map", lambda d: d.update(meta=_CLAIM)),
    "parameter offsets": ("array", lambda d: first_kernel(d)["layout"].update(offsets=_CLAIM)),
    "undefined runs": ("array", lambda d: first_kernel(d).update(undefined=_CLAIM)),
    "kernel name": ("str", lambda d: first_kernel(d)["kernel"].update(name=_CLAIM)),
    "parameter bytes": ("bin", lambda d: first_kernel(d).update(params=_CLAIM)),
}  # fmt: skip


def _claim(path: Path, header: str, edit) -> None:
    """Graph ``decode.bs1`` with one element replaced by ``header`` claiming 2**32 - 1 of it, re-sealed."""
    target = graph_file(path, "decode.bs1")
    document = msgspec.msgpack.decode(target.read_bytes())
    edit(document)
    data = msgspec.msgpack.encode(document)
    marker = msgspec.msgpack.encode(_CLAIM)
    assert data.count(marker) == 1
    target.write_bytes(data.replace(marker, _HEADERS[header]))
    reseal(path)


@pytest.mark.parametrize("case", sorted(CLAIMS))
def test_a_graph_claiming_4_billion_elements_is_refused_in_one_line_cheaply(cli, tmp_path, case):
    header, edit = CLAIMS[case]
    path = copy(tmp_path)
    _claim(path, header, edit)
    sample = sample_path()
    for command in (["archive", "inspect", path], ["archive", "inspect", path, "--json"], ["graph", "lint", path],
                    ["archive", "verify", path], ["graph", "show", path, "decode.bs1"],
                    ["graph", "export", path, "decode.bs1", "--format", "dot"], ["archive", "diff", sample, path],
                    ["archive", "diff", path, sample, "--relocations"]):  # fmt: skip
        outcome = cli.run(*command, timeout=60)
        assert_refused(outcome, match="decode.bs1")
        assert outcome.maxrss_kib < 300 << 10, f"{outcome.maxrss_kib} KiB to refuse {command}"


#: Counts a session or the catalog records, claimed far past what the archive holds.
RECORDED = {
    "world size": (CATALOG_FILE, lambda c: c.update(world_size=1 << 40), "world_size"),
    "world size at the limit plus one": (CATALOG_FILE, lambda c: c.update(world_size=MAX_WORLD_SIZE + 1),
                                         "world_size"),
    "a graph's node count": ("rank0/session.json", lambda s: s["graphs"][0].update(nodes=1 << 40), "nodes"),
    "a graph's size": ("rank0/session.json", lambda s: s["graphs"][0].update(size=1 << 62), "size"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_a_recorded_count_past_the_archive_is_refused_in_one_line_cheaply(cli, tmp_path, case):
    file, edit, field = RECORDED[case]
    path = copy(tmp_path)
    edit_json(path / file, edit, root=path if file != CATALOG_FILE else None)
    for command in (["archive", "inspect", path], ["archive", "verify", path], ["graph", "lint", path, "--json"],
                    ["graph", "show", path, "decode.bs1"], ["archive", "diff", sample_path(), path]):  # fmt: skip
        outcome = cli.run(*command, timeout=60)
        assert_refused(outcome, match=field)
        assert outcome.maxrss_kib < 300 << 10, f"{outcome.maxrss_kib} KiB to refuse {command}"


def test_a_graph_file_over_its_limit_is_refused_unread(cli, tmp_path):
    path = copy(tmp_path)
    limit = Archive.open(path).limits.graph
    assert limit == 32 << 20
    edit_document(path, "decode.bs1", lambda d: d["meta"].update(pad="x" * limit), seal=True)
    assert_refused(cli.run("archive", "inspect", path), match="larger than the reader accepts")


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            lambda s: s.update(graphs=[s["graphs"][0]] * (MAX_GRAPHS + 1)),
            r": graphs: Expected `array` of length <= 16384",
        ),
        (lambda s: s["region"].update(trace=[[0, 0, 4096, 4096, "warmup"]] * (MAX_TRACE + 1)), r"region\.trace"),
    ],
)
def test_a_session_over_a_count_limit_is_refused(cli, tmp_path, edit, field):
    path = tmp_path / "archive"
    shutil.copytree(ROOT / "tests" / "fixtures" / "saveload-a", path)
    edit_json(path / "rank0" / "session.json", edit, root=path)
    assert_refused(cli.run("archive", "inspect", path), match=field)


#: The largest real archives (foundry.graphir.limits): SGLang's MoE preset at its default graph set
#: (821-869 nodes per decode graph on the H200 test machine; 52 graphs at max_running_requests 512),
#: vLLM's piecewise graphs (about 2,000 per rank), and the largest graph measured (1,850 nodes).
LARGEST_GRAPH_NODES = 1_850
MOE_NODES, MOE_GRAPHS = 869, 52
VLLM_GRAPHS = 2_000


def test_the_largest_real_archives_fit_the_limits_with_4x_headroom():
    """Per node, the real SAVEs of the fixtures (H200 test machine): bytes of graph file,
    operands, parameters and undefined runs; scaled to the largest real graph, times 4."""
    per_node = {"bytes": 0.0, "operands": 0.0, "params": 0.0, "runs": 0.0}
    runs = 0
    for fixture in ("saveload-a", "sglang-decode", "tiny-qwen3"):
        archive = Archive.open(ROOT / "tests" / "fixtures" / fixture)
        for rank, entry in archive.select():
            ir = archive.graph(rank, entry)
            kernels = list(ir.kernels())
            per_node["bytes"] = max(per_node["bytes"], entry.size / len(ir))
            per_node["operands"] = max(per_node["operands"], len(ir.operands) / len(ir))
            per_node["params"] = max(per_node["params"], sum(len(k.layout.offsets) for k in kernels) / len(kernels))
            per_node["runs"] = max(per_node["runs"], sum(len(k.undefined) for k in kernels) / len(kernels))
            runs = max(runs, *(len(k.undefined) for k in kernels))
    nodes = 4 * max(LARGEST_GRAPH_NODES, MOE_NODES)
    assert nodes <= limits.MAX_NODES and nodes <= limits.MAX_EDGES
    assert 4 * max(VLLM_GRAPHS, MOE_GRAPHS) <= MAX_GRAPHS and MAX_ARCHIVE_GRAPHS >= 4 * 8 * VLLM_GRAPHS
    assert Archive.open(sample_path()).limits.graph >= nodes * per_node["bytes"]
    assert nodes * per_node["operands"] <= limits.MAX_OPERANDS
    assert nodes * per_node["params"] <= limits.MAX_GRAPH_PARAMS
    assert 4 * runs <= limits.MAX_UNDEFINED_RUNS
    assert nodes * per_node["runs"] <= limits.MAX_GRAPH_UNDEFINED_RUNS


@pytest.fixture(scope="module")
def at_limits(tmp_path_factory) -> Path:
    return _bench().build_limits(tmp_path_factory.mktemp("limits") / "limits")


def test_the_archive_at_the_limits_is_at_them(at_limits):
    archive = Archive.open(at_limits)
    entry = archive.entry(0, "limits.a")
    assert entry.size > archive.limits.graph - (1 << 20)  # within 1 MiB of the file limit
    ir = archive.graph(0, entry)
    assert len(ir) == limits.MAX_NODES and ir.edge_count() == limits.MAX_EDGES
    assert len(ir.operands) == limits.MAX_OPERANDS and len(ir.regions) == limits.MAX_REGIONS
    assert sum(len(n.layout.offsets) for n in ir.kernels()) == limits.MAX_GRAPH_PARAMS
    assert sum(len(n.undefined) for n in ir.kernels()) == limits.MAX_GRAPH_UNDEFINED_RUNS
    assert sum(len(n.launch.attributes) for n in ir.kernels()) == limits.MAX_GRAPH_ATTRIBUTES


def test_every_offline_command_stays_under_1_gib_at_the_limits(cli, at_limits):
    peaks = {}
    for label, argv in _bench().commands(at_limits, "limits.a").items():
        if label == "graph show":  # rich's table of 32,768 rows takes a minute: the bench measures it
            continue
        outcome = cli.run(*argv, timeout=300)
        assert not outcome.timed_out and outcome.rc in (0, 1), str(outcome)
        peaks[label] = outcome.maxrss_kib << 10
    assert max(peaks.values()) < GiB, json.dumps({k: v >> 20 for k, v in peaks.items()})


# -- the archive as a whole ---------------------------------------------------------------------


def _ranks(path: Path, ranks: int, graphs: int) -> Path:
    """An archive of ``ranks`` ranks, each holding ``graphs`` copies of the sample's first graph."""
    sample = Archive.open(sample_path())
    template = sample.graph(0, sample.entries(0)[0])
    writer = ArchiveWriter(path, environment=sample.catalog.environment, world_size=ranks)
    for r in range(ranks):
        rank = writer.rank(r)
        for i in range(graphs):
            ir = GraphIR(f"g{i}", regions=template.regions.values(), meta=template.meta)
            ir.add_nodes(template.nodes())
            ir.add_edges(template.edges())
            ir.set_operands(template.operands)
            rank.add_graph(ir, shape_key=i)
        rank.seal()
    writer.commit()
    return path


def test_the_graphs_of_all_ranks_together_are_bounded(tmp_path, monkeypatch):
    path = _ranks(tmp_path / "ranks", ranks=3, graphs=2)
    monkeypatch.setattr(reader, "MAX_ARCHIVE_GRAPHS", 5)
    archive = Archive.open(path)
    assert len(archive.entries(0)) + len(archive.entries(1)) == 4
    with pytest.raises(ArchiveError, match="more graphs in all than a reader accepts") as err:
        archive.select()
    assert err.value.field == "graphs" and err.value.found == 6 and err.value.path.endswith("rank2/session.json")


def test_the_sessions_of_all_ranks_together_are_bounded(cli, tmp_path):
    path = _ranks(tmp_path / "ranks", ranks=2, graphs=1)
    one = (path / "rank0" / "session.json").stat().st_size
    archive = Archive.open(path, limits=Limits(session=2 * one, sessions=one + one // 2))
    archive.session(0)
    with pytest.raises(ArchiveError, match="sessions of all ranks together are larger") as err:
        archive.session(1)
    assert err.value.path.endswith("rank1/session.json") and err.value.field == "size"
    assert DEFAULT_LIMITS.sessions == DEFAULT_LIMITS.session == 64 << 20
    assert cli.run("archive", "inspect", path).rc == 0  # within the default limits


def _unresolved_everywhere(path: Path) -> Path:
    """The sample, every operand of every graph turned unresolved (a finding each)."""
    shutil.copytree(sample_path(), path)
    for entry in Archive.open(path).entries(0):
        edit_document(path, entry.name, lambda d: d["operands"].update(region=[-1] * len(d["operands"]["region"])),
                      seal=False)  # fmt: skip
    reseal(path)
    return path


def test_reports_list_a_bounded_number_and_count_the_rest(tmp_path, monkeypatch, registry):
    """Lint, the summary, relocations and the diff list at most their budget, and count the
    rest: the verdicts and totals do not change with the budget."""
    path = _unresolved_everywhere(tmp_path / "unresolved")
    archive = Archive.open(path)
    full_lint, full_summary = lint(archive, registry), summarize(archive, registry)
    total = sum(len(archive.graph(0, e).operands) for e in archive.entries(0))
    assert full_lint.count(Severity.ERROR) == total > 1_000
    assert (
        len(full_summary.unresolved) == summary_module.LISTED_UNRESOLVED == total - full_summary.unresolved_not_listed
    )
    warnings = full_lint.count(Severity.WARNING)  # the sample keeps no module images: one per graph

    monkeypatch.setattr(lint_module, "LISTED_FINDINGS", 10)
    monkeypatch.setattr(summary_module, "LISTED_UNRESOLVED", 7)
    monkeypatch.setattr(summary_module, "LISTED_NAMES", 3)
    small_lint, small_summary = lint(archive, registry), summarize(archive, registry)
    assert len(small_lint.findings) == 10 and small_lint.count(Severity.ERROR) == total and small_lint.failed()
    assert small_lint.to_dict()["findings_not_listed"] == {"error": total - 10, "warning": warnings}
    assert len(small_summary.unresolved) == 7 and small_summary.unresolved_not_listed == total - 7
    assert [g.unresolved_count for g in small_summary.graphs] == [g.unresolved_count for g in full_summary.graphs]
    assert len(small_summary.kernels) == 3
    assert sum(small_summary.kernels.values()) + small_summary.kernels_not_listed == sum(full_summary.kernels.values())

    other = tmp_path / "other"
    shutil.copytree(sample_path(), other)
    full_diff = diff_archives(Archive.open(other), archive)
    monkeypatch.setattr(archive_diff_module, "LISTED", 25)
    small_diff = diff_archives(Archive.open(other), archive)
    assert [g.status for g in small_diff.graphs] == [g.status for g in full_diff.graphs]
    assert [g.node_count for g in small_diff.graphs] == [g.node_count for g in full_diff.graphs]
    assert sum(g.listed for g in small_diff.graphs) <= 25 < sum(g.listed for g in full_diff.graphs)
    assert sum(g.nodes_not_listed for g in small_diff.graphs) > 0

    monkeypatch.setattr(relocations_module, "LISTED_FINDINGS", 4)
    report = check_relocations(Archive.open(other), archive)
    assert len(report.findings) == 4 and report.finding_count > 4


def test_a_diff_lists_at_most_its_budget_of_one_node(tmp_path):
    """A node whose every parameter byte differs, one byte apart: its changes are cut at
    LISTED_CHANGES, and long values at VALUE_CHARS characters."""
    base = KernelNode(0, KernelIdentity("_Z1kv"), LaunchConfig((1, 1, 1), (1, 1, 1)), ParamLayout((0,), (4096,)),
                      bytes(4096))  # fmt: skip
    a, b = GraphIR("g"), GraphIR("g")
    a.add_nodes([base])
    b.add_nodes([msgspec.structs.replace(base, params=bytes([1, 0]) * 2048, kernel=KernelIdentity("_Z1kw" * 2000))])
    diff = diff_graphs(a, b)
    (node,) = diff.nodes
    assert len(node.changes) == LISTED_CHANGES and node.changes_not_listed == 2049 - LISTED_CHANGES
    kernel = next(c for c in node.changes if c.field == "kernel")
    assert len(kernel.b) < VALUE_CHARS + 40 and kernel.b.endswith("(10000 characters)")


def test_aligning_graphs_no_sequence_matcher_can_align_quickly_is_bounded():
    """Two graphs of 20,000 nodes of one kernel but for a different middle: sequence
    matching would take minutes; the diff pairs head and tail and aligns by position."""

    def graph(middle: str) -> GraphIR:
        ir = GraphIR("g")
        launch = LaunchConfig((1, 1, 1), (1, 1, 1))
        names = [middle if 5_000 <= i < 15_000 and i % 2 else "_Z1k" for i in range(20_000)]
        ir.add_nodes([KernelNode(i, KernelIdentity(name), launch, ParamLayout(), b"") for i, name in enumerate(names)])
        return ir

    started = time.perf_counter()
    diff = diff_graphs(graph("_Z1a"), graph("_Z1b"))
    assert time.perf_counter() - started < 20
    assert diff.status is Status.CHANGED and diff.node_count == 5_000
