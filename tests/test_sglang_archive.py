"""Inspection of a real SGLang archive: ``foundry archive inspect``, ``foundry graph lint``,
``foundry archive diff`` and ``foundry-tui`` on the decode graphs SGLang 0.5.17 captured.

``tests/fixtures/sglang-decode`` is the SAVE of ``scripts/validate_on_gpu.sh RESULTS
sglang-cold`` on the H200 test machine (tiny Qwen3, triton attention, decode graphs
``full`` for batch sizes 1, 2, 4, 8), stripped of its module images and warm-up bytes
with ``foundry archive strip``.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from click.testing import CliRunner

from foundry.archive import Archive
from foundry.archive.schema import ModuleState
from foundry.cli import main
from foundry.errors import DriftError
from foundry.graphir.passes.diff import REBUILT, Status
from foundry.inspect.archive_diff import diff_archives
from foundry.runtime.sessions.validate import start_module_check

from .archive_tools import edit_graph
from .conftest import FIXTURES
from .test_tui import SIZE, app_for, pilot_test, plain, press, settle, status

SGLANG = FIXTURES / "sglang-decode"
# SGLang's own kernels, which it compiles with nvcc at run time (tvm-ffi), and its triton attention
SGLANG_KERNELS = ("store_kvcache", "fused_rope_kernel", "fused_qknorm_warp", "act_and_mul_kernel",
                  "_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2")  # fmt: skip


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_inspect_shows_sglangs_decode_graphs_server_arguments_and_kernels():
    result = invoke("archive", "inspect", "--json", str(SGLANG))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    graphs = {g["graph"]: g for g in summary["graphs"]}
    assert sorted(graphs) == ["decode.bs1", "decode.bs2", "decode.bs4", "decode.bs8"]
    for name, graph in graphs.items():
        assert (graph["runner"], graph["shape_key"]) == ("decode", int(name.removeprefix("decode.bs")))
        assert graph["kinds"] == {"kernel": graph["nodes"]} and graph["collectives"] == {}
        assert graph["unresolved"] == 0 and graph["plan"]
        # the edge into each kernel launched with programmatic dependent launch (SGLang's own,
        # FlashInfer's norms, the second Triton attention stage) is programmatic, the others plain
        assert graph["edges"] == {"plain": 12, "programmatic from the programmatic port": 15}
    model = summary["model"]
    assert model["sglang.version"] == "0.5.17" and model["sglang.attention_backend"] == '"triton"'
    assert model["sglang.cuda_graph_bs_decode"] == "[1, 2, 4, 8]" and model["sglang.warmup_skip"] == "safe"
    assert summary["modules"]["state"] == "stripped"
    launches = sum(k["count"] for k in summary["kernels"])
    assert launches == sum(g["nodes"] for g in graphs.values())  # the histogram counts every node
    names = " ".join(k["name"] for k in summary["kernels"])
    assert all(kernel in names for kernel in SGLANG_KERNELS)


def test_inspect_counts_the_programmatic_edges():
    result = invoke("archive", "inspect", str(SGLANG))
    assert result.exit_code == 0, result.output
    assert result.stdout.count("27 (15 programmatic)") == 4


def test_lint_counts_no_collective_in_sglangs_graphs():
    nodes = Archive.open(SGLANG).entries(0)[0].nodes
    result = invoke("graph", "lint", str(SGLANG), "--expect", "nccl-allreduce=0", "--expect", f"kernel={nodes}")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("ok   nccl-allreduce=0") == 4 and "0 failed expectation(s)" in result.stdout
    result = invoke("graph", "lint", str(SGLANG), "--expect", "nccl-allreduce=1")
    assert result.exit_code == 1 and result.stdout.count("FAIL nccl-allreduce=1") == 4


def test_load_refuses_the_stripped_sglang_archive():
    archive = Archive.open(SGLANG)
    assert archive.catalog.modules.state is ModuleState.STRIPPED
    with pytest.raises(DriftError) as err:
        start_module_check(archive).result()
    assert err.value.field == "modules.state"


def _rename(ir, old: str, new: str, image: str | None = None) -> None:
    for node in ir.kernels():
        if old in node.kernel.name:
            kernel = msgspec.structs.replace(node.kernel, name=node.kernel.name.replace(old, new),
                                             image=image or node.kernel.image)  # fmt: skip
            ir.replace_node(msgspec.structs.replace(node, kernel=kernel))


def _rebuilt_copy(archive_copy):
    """The SGLang archive with its KV-cache store kernel as another compilation names it."""
    path = archive_copy("sglang-decode")
    store = next(n for n in Archive.open(SGLANG).graph(0, "decode.bs2").kernels() if "store_kvcache" in n.kernel.name)
    anonymous = store.kernel.name.split("_GLOBAL__N__")[1][:8]
    rebuilt = f"_GLOBAL__N__{anonymous}_", "_GLOBAL__N__0badc0de_"  # the id another compilation drew
    edit_graph(path, "decode.bs2", lambda ir: _rename(ir, *rebuilt, image="f" * 64))
    return path


def test_diff_names_a_kernel_rebuilt_from_the_same_source(archive_copy):
    """Two SAVEs, each with SGLang's kernels compiled on its own, differed on the H200 test
    machine only in nvcc's anonymous-namespace ids and the images: the diff says so."""
    path = _rebuilt_copy(archive_copy)
    d = diff_archives(Archive.open(SGLANG), Archive.open(path))
    (graph,) = [g for g in d.graphs if g.status is not Status.SAME]
    assert graph.name == "decode.bs2" and not graph.edges_only_a and not graph.edges_only_b
    assert {n.status for n in graph.nodes} == {Status.CHANGED}  # aligned as the same kernels, none only on one side
    subjects = {c.subject for n in graph.nodes for c in n.changes}
    assert subjects == {REBUILT, "image"} and d.rebuilt_kernels == ["(anon)::store_kvcache<...>"]
    result = invoke("archive", "diff", str(SGLANG), str(path))
    assert result.exit_code == 1 and "differ only in nvcc's per-compilation anonymous-namespace id" in result.stdout
    assert json.loads(invoke("archive", "diff", "--json", str(SGLANG), str(path)).stdout)["rebuilt_kernels"] == [
        "(anon)::store_kvcache<...>"
    ]


def test_diff_does_not_take_another_kernel_for_a_rebuild(archive_copy):
    path = archive_copy("sglang-decode")
    edit_graph(path, "decode.bs2", lambda ir: _rename(ir, "store_kvcacheILl256", "store_kvcacheILl128"))
    d = diff_archives(Archive.open(SGLANG), Archive.open(path))
    changes = [c for g in d.graphs for n in g.nodes for c in n.changes]
    assert changes and {c.subject for c in changes} == {"kernel"} and not d.rebuilt_kernels
    assert "per-compilation" not in invoke("archive", "diff", str(SGLANG), str(path)).stdout


@pilot_test
async def test_tui_browses_sglangs_graphs_and_summary():
    app = app_for(SGLANG)
    archive = Archive.open(SGLANG)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        tree = app.screen.query_one("GraphTree")
        assert [str(child.label) for child in tree.root.children[0].children] == [
            f"{e.name} {e.nodes}" for e in archive.entries(0)
        ]
        await press(pilot, "s")
        text = plain(app.screen.query_one("SummaryPane").shown)
        launches = sum(e.nodes for e in archive.entries(0))
        assert f"Kernel histogram: {launches} launches of" in text and "(anon)::store_kvcache<...>" in text
        assert "Collectives by kind: none" in text and "module images were stripped" in text  # lint ran too


@pilot_test
async def test_tui_diff_says_how_many_kernels_were_rebuilt(archive_copy):
    app = app_for(SGLANG, _rebuilt_copy(archive_copy))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert status(app).startswith("archives differ: 4 graphs (3 same, 1 changed")
        assert status(app).endswith("; 1 kernel(s) rebuilt from the same source")
