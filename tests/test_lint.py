"""``foundry graph lint``: expectations per graph and in total, rules, exit codes."""

from __future__ import annotations

import json

import msgspec
import pytest
from click.testing import CliRunner

from foundry.archive import Archive
from foundry.backends import Backend, BackendRegistry
from foundry.cli import main
from foundry.errors import LintError
from foundry.graphir.nodes import UnsupportedNode
from foundry.graphir.operands import OperandSite
from foundry.graphir.regions import UNRESOLVED
from foundry.inspect.lint import Expectation, Severity, lint

from .archive_tools import edit_graph
from .conftest import FIXTURES


def run(*args: str):
    return CliRunner().invoke(main, ["graph", "lint", *args])


def test_expectations_hold_per_graph_on_every_rank(registry):
    archive = Archive.open(FIXTURES / "tiny-qwen3")
    report = lint(archive, registry, expectations=[Expectation("kernel", 155), Expectation("nccl-allreduce", 0)])
    assert len(report.expectations) == 6  # 2 expectations x 3 graphs
    assert all(e.ok for e in report.expectations)
    assert not report.failed()
    assert {f.rule for f in report.findings} == {"missing-module-image"}  # warning: no images recorded
    assert report.failed(strict=True)


def test_failed_expectation_names_graph_and_counts(registry):
    archive = Archive.open(FIXTURES / "symm-mem-ws1")
    report = lint(archive, registry, expectations=[Expectation("symm-allreduce", 3)])
    (result,) = report.expectations
    assert (result.graph, result.expected, result.found, result.ok) == ("symm.allreduce", 3, 2, False)
    assert report.failed()


def test_total_counts_over_the_selection(registry):
    archive = Archive.open(FIXTURES / "tiny-qwen3")
    report = lint(archive, registry, expectations=[Expectation("kernel", 465)], total=True)
    (result,) = report.expectations
    assert result.ok and result.graph is None and result.found == 465
    report = lint(archive, registry, pattern="decode.bs[12]", expectations=[Expectation("kernel", 310)], total=True)
    assert report.expectations[0].ok and [g.graph for g in report.graphs] == ["decode.bs1", "decode.bs2"]


def test_symmetric_memory_collectives_are_counted_through_the_backend(registry):
    report = lint(Archive.open(FIXTURES / "symm-mem-ws1"), registry,
                  expectations=[Expectation("symm-allreduce", 2), Expectation("nccl-allreduce", 0),
                                Expectation("memcpy", 1)])  # fmt: skip
    assert all(e.ok for e in report.expectations)


def test_kernels_are_counted_by_name(registry):
    # the SGLang fixture's model has 2 layers: two fused add-norms and Triton's two decode-attention
    # stages in each, one plain norm (the first layer's input, matched by its mangled name); no MoE
    # kernel in a dense model
    archive = Archive.open(FIXTURES / "sglang-decode")
    wanted = ["kernel:*FusedAddRMSNorm*=4", "kernel:_fwd_*kernel_stage[12]=4",
              "kernel:_ZN10flashinfer4norm13RMSNormKernel*=1", "kernel:fused_moe_kernel=0"]  # fmt: skip
    report = lint(archive, registry, expectations=[Expectation.parse(e) for e in wanted])
    assert len(report.expectations) == 4 * len(report.graphs) == 16
    assert all(e.ok for e in report.expectations), [e for e in report.expectations if not e.ok]
    moe = lint(archive, registry, pattern="decode.bs1", expectations=[Expectation.parse("kernel:fused_moe_kernel=96")])
    (result,) = moe.expectations
    assert (result.kind, result.found, result.ok) == ("kernel:fused_moe_kernel", 0, False) and moe.failed()
    both = lint(archive, registry, expectations=[Expectation.parse("kernel:*FusedAddRMSNorm*=16")], total=True)
    assert both.expectations[0].ok


def test_kernel_expectations_on_the_command_line():
    fixture = str(FIXTURES / "sglang-decode")
    ok = run(fixture, "--expect", "kernel:*FusedAddRMSNorm*=4", "--json")
    data = json.loads(ok.output)
    assert ok.exit_code == 0 and {e["kind"] for e in data["expectations"]} == {"kernel:*FusedAddRMSNorm*"}
    failed = run(fixture, "--graph", "decode.bs1", "--expect", "kernel:fused_moe_kernel=96")
    assert failed.exit_code == 1 and "kernel:fused_moe_kernel=96" in failed.output and "found 0" in failed.output
    for bad in ("kernel:=3", "kernel=3=4", "kernel: x=1", "kernel:\x1b[31mx=1"):
        refused = run(fixture, "--expect", bad)
        assert refused.exit_code == 2 and "kernel:GLOB=N" in refused.output, bad


def test_unknown_kind_rule_or_selection_is_a_usage_error(registry):
    archive = Archive.open(FIXTURES / "tiny-qwen3")
    with pytest.raises(LintError, match="unknown kind 'symm-alreduce'"):
        lint(archive, registry, expectations=[Expectation("symm-alreduce", 1)])
    with pytest.raises(LintError, match="unknown rule 'no-such-rule'"):
        lint(archive, registry, disabled=["no-such-rule"])
    with pytest.raises(LintError, match="no graph matches"):
        lint(archive, registry, pattern="prefill.*")
    with pytest.raises(LintError, match="an expectation is KIND=N"):
        Expectation.parse("symm-allreduce:3")


def test_unresolved_pointer_and_unsupported_node_rules(archive_copy, registry):
    path = archive_copy("symm-mem-ws1")

    def break_graph(ir):
        ops = list(ir.operands)
        memcpy_dst = next(i for i, o in enumerate(ops) if o.site == OperandSite.MEMCPY_DST)
        ops[memcpy_dst] = msgspec.structs.replace(ops[memcpy_dst], region=UNRESOLVED, region_offset=0)
        ir.set_operands(ops)
        ir.replace_node(UnsupportedNode(3, "host", "callback"))
        ir.set_operands([o for o in ir.operands if o.node != 3])

    edit_graph(path, "symm.allreduce", break_graph)
    report = lint(Archive.open(path), registry)
    errors = [(f.rule, f.node) for f in report.findings if f.severity is Severity.ERROR]
    assert errors == [("unresolved-pointer", 1), ("unsupported-node", 3)]
    assert "lies in no known allocation" in report.findings[0].message
    quiet = lint(Archive.open(path), registry, disabled=["unresolved-pointer", "unsupported-node"])
    assert not quiet.failed()


def test_cli_exit_codes_and_json(archive_copy):
    assert run("@sample", "--expect", "kernel=155").exit_code == 0
    failing = run("@sample", "--expect", "kernel=154")
    assert failing.exit_code == 1 and "FAIL kernel=154" in failing.stdout
    assert run("@sample", "--strict").exit_code == 1  # the warning fails under --strict
    assert run("@sample", "--expect", "kernel").exit_code == 2
    assert run("@sample", "--expect", "bogus=1").exit_code == 2
    assert run("@sample", "--rank", "3").exit_code == 2
    assert run("@sample", "--disable", "nope").exit_code == 2
    result = run(str(FIXTURES / "symm-mem-ws1"), "--expect", "symm-allreduce=2", "--json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 0 and payload["ok"] is True
    assert payload["graphs"][0]["counts"]["symm-allreduce"] == 2
    assert payload["expectations"][0]["found"] == 2


class _RecogniseOnly(Backend):
    """Claims the symmetric-memory all-reduces but implements only the recognise step."""

    name = "recognise-only"
    kinds = frozenset({"symm-allreduce"})

    def recognise(self, kernel):
        return self.match("symm-allreduce") if "all_reduce_kernel" in kernel.name else None


class _NeedsMulticast(_RecogniseOnly):
    """Claims them as kernels that need more than the backend: NVLink multicast."""

    name = "needs-multicast"

    def recognise(self, kernel):
        return self.match("symm-allreduce", (), "multimem") if "all_reduce_kernel" in kernel.name else None


def test_collectives_whose_backend_cannot_relocate_are_flagged(registry):
    archive = Archive.open(FIXTURES / "symm-mem-ws1")
    assert not [f for f in lint(archive, registry).findings if f.rule == "unrelocatable-collective"]
    report = lint(archive, BackendRegistry([_RecogniseOnly()]))
    flagged = [f for f in report.findings if f.rule == "unrelocatable-collective"]
    assert [f.node for f in flagged] == [2, 3] and all(f.severity == "warning" for f in flagged)
    assert "recognise-only" in flagged[0].message and "one_shot_all_reduce" in (flagged[0].kernel or "")
    assert flagged[0].message.endswith("; LOAD will refuse this graph")  # the backend cannot relocate at all
    needing = lint(archive, BackendRegistry([_NeedsMulticast()]))
    flagged = [f for f in needing.findings if f.rule == "unrelocatable-collective"]
    assert [f.node for f in flagged] == [2, 3]  # a kernel that needs more than its backend: LOAD asks the backend
    assert "(it needs multimem); LOAD restores this graph only where the backend accepts" in flagged[0].message
    quiet = lint(archive, BackendRegistry([_RecogniseOnly()]), disabled={"unrelocatable-collective"})
    assert not [f for f in quiet.findings if f.rule == "unrelocatable-collective"]
