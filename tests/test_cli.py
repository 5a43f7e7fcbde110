"""The ``foundry`` command: every subcommand, its output and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from foundry import __version__
from foundry.cli import main

from .archive_tools import edit_json
from .conftest import FIXTURES


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_inspect_sample_tables():
    result = invoke("archive", "inspect", "@sample")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for expected in ("NVIDIA H200", "decode.bs1", "decode.bs4", "Kernel histogram", "nvjet_sm90", "Regions",
                     "weight.lm_head.weight", "Unresolved pointers: none", "Collectives: none"):  # fmt: skip
        assert expected in out, expected


def test_inspect_json_is_complete():
    result = invoke("archive", "inspect", str(FIXTURES / "symm-mem-ws1"), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0
    assert data["world_size"] == 1 and data["modules"]["state"] == "absent"
    (graph,) = data["graphs"]
    assert graph["kinds"] == {"kernel": 3, "memcpy": 1} and graph["collectives"] == {"symm-allreduce": 2}
    assert data["totals"]["collectives"] == {"symm-allreduce": 2}
    assert {r["name"] for r in data["regions"]} >= {"symm.buffer", "symm.signal_pad_ptrs", "alloc.0"}
    assert sum(k["count"] for k in data["kernels"]) == 3 and data["unresolved"] == []


def test_inspect_rank_filter_and_bad_rank():
    assert invoke("archive", "inspect", "@sample", "--rank", "0", "--json").exit_code == 0
    bad = invoke("archive", "inspect", "@sample", "--rank", "1")
    assert bad.exit_code == 2 and "archive has no rank 1" in bad.stderr


def test_graph_show_table_and_json():
    result = invoke("graph", "show", str(FIXTURES / "symm-mem-ws1"), "symm.allreduce")
    assert result.exit_code == 0 and "one_shot_all_reduce_kernel" in result.stdout
    data = json.loads(invoke("graph", "show", str(FIXTURES / "symm-mem-ws1"), "symm.allreduce", "--json").stdout)
    assert [n["kind"] for n in data["nodes"]] == ["kernel", "memcpy", "kernel", "kernel"]
    assert data["nodes"][1]["operands"] == ["dst=symm.buffer+0x0", "src=alloc.0+0x0"]
    assert data["edges"] == [[0, 1, 0], [1, 2, 0], [2, 3, 0]]


def test_verify_recomputes_fingerprints(archive_copy):
    assert invoke("archive", "verify", "@sample").exit_code == 0
    path = archive_copy("compiled-triton")
    edit_json(path / "rank0" / "session.json", lambda s: s["graphs"][0].update(fingerprint="fp1:" + "0" * 64),
              root=path)  # fmt: skip
    result = invoke("archive", "verify", str(path), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["fingerprint_mismatches"][0]["graph"] == "compiled.fused"


def test_backends_list():
    result = invoke("backends", "list", "--json")
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert result.exit_code == 0 and rows["torch-symm-mem"]["status"] == "ok"
    assert "symm-allreduce" in rows["torch-symm-mem"]["kinds"] and rows["vmm"]["implements"] == [
        "recognise",
        "relocate",
    ]
    assert "nccl-ipc" in invoke("backends", "list").stdout


def test_usage_errors_exit_2():
    assert invoke("archive", "inspect").exit_code == 2
    assert invoke("archive", "frobnicate").exit_code == 2
    missing = invoke("archive", "inspect", "/no/such/archive")
    assert missing.exit_code == 2 and missing.stderr == "foundry: error: /no/such/archive: no such archive\n"
    assert invoke("--version").stdout.startswith(f"foundry, version {__version__}; native hook: ")


def test_installed_command_runs_without_a_gpu():
    """The console script, as a user runs it: neither torch nor the CUDA driver bindings are imported."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('loaded:', 'torch' in sys.modules, 'cuda.bindings.driver' in sys.modules,"
        " file=sys.stderr))\n"
        "from foundry.cli import main\n"
        "sys.argv = ['foundry', 'graph', 'lint', '@sample']\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "3 graph(s) checked" in proc.stdout
    assert "loaded: False False" in proc.stderr
