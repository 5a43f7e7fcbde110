"""The vLLM recipe without vLLM: its comparison run as a script over recorded
reports, the capture sizes its wave walks, the server's flags, and the log tee
that reads vLLM's start-up lines from the processes vLLM starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import load_script

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "vllm"


def recipe(name: str):
    """A module of recipes/vllm (vLLM itself is imported only when a run starts)."""
    return load_script(RECIPE / f"{name}.py", f"vllm_recipe_{name}")


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECIPE / script), *args], capture_output=True, text=True, timeout=60)


def test_the_comparison_tells_runs_apart_and_tabulates_graph_time(tmp_path):
    def record(name, outputs, **extra):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"outputs": [{"output_ids": i, "logprobs": lp} for i, lp in outputs], **extra}))
        return str(path)

    outputs = [([5, 6, 7], [-0.5, -0.25, -1.0]), ([8, 9, 9], [-0.125, -2.0, -3.0])]
    base = record("base", outputs, startup={"graph_capture_s": 41.0, "torch_compile_s": 18.0, "init_engine_s": 70.0},
                  ready_s=95.0, batch_s=[0.5])  # fmt: skip
    load = record("load", outputs, startup={"graph_capture_s": 2.0}, ready_s=50.0, batch_s=[0.4],
                  foundry={"mode": "load", "vllm_graphs": ["full.t1.r1.u", "piecewise.t1.p0"],
                           "replayed": ["full.t1.r1.u"],
                           "vllm_seconds": {"capture_model_s": 1.64, "graphs_s": 0.9, "foundry_s": 1.1}})  # fmt: skip
    token = record("token", [outputs[0], ([8, 4, 9], [-0.125, -2.0, -3.0])])
    wave = record("wave", outputs, wave=[{"output_ids": [1], "logprobs": [-1.0]}])
    same = run("compare.py", base, load)
    assert same.returncode == 0, same.stdout
    assert "25.0x less" in same.stdout and "plugin 1.640" in same.stdout  # the plugin's figure where it ran
    assert "Foundry in the worker 1.100 (its start included; the graphs 0.900)" in same.stdout
    assert "replayed 1 of 2 restored graphs; never: piecewise.t1.p0" in same.stdout
    differs = run("compare.py", base, token, wave)
    assert differs.returncode == 1 and "prompt 1: output ids differ from step 1" in differs.stdout
    assert "0 wave prompt outputs, not 1" in run("compare.py", wave, base).stdout
    missing = run("compare.py", base, str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    (tmp_path / "plugin.json").write_text('{"mode": "load"}')
    foreign = run("compare.py", str(tmp_path / "plugin.json"), base)
    assert foreign.returncode == 2 and "recipes/vllm/run.py (no outputs)" in foreign.stderr


def test_the_wave_walks_every_capture_size_and_the_decode_batch_down_from_max_num_seqs():
    r = recipe("run")
    sizes = r.capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)
    assert len(sizes) == 51 and sizes[-1] == 512 and sizes == sorted(set(sizes))
    assert [len(p) for p in r.walk_prompts(sizes)] == sizes
    wave = r.decode_wave(256)
    assert len(wave) == 256 and len({tuple(p) for p in wave}) == 256 and {len(p) for p in wave} == {16}
    assert all(2 not in p for p in r.walk_prompts(sizes) + wave)  # no EOS among the prompts
    assert r.capture_sizes(max_num_seqs=8, max_num_batched_tokens=8192) == [1, 2, 4, 8, 16]


def test_the_server_gets_vllms_flags_for_the_engines_settings():
    r = recipe("run")
    flags = r.server_args({"load_format": "dummy", "enable_prefix_caching": False, "skip_tokenizer_init": True,
                           "compilation_config": {"cudagraph_mode": "PIECEWISE"}, "max_num_seqs": 8,
                           "kv_cache_memory_bytes": None})  # fmt: skip
    assert flags == ["--load-format", "dummy", "--no-enable-prefix-caching", "--skip-tokenizer-init",
                     "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}', "--max-num-seqs", "8"]  # fmt: skip


def test_the_log_tee_reads_what_child_processes_write(capfd):
    r = recipe("run")
    seen: list[str] = []
    with r.LogTee(seen.append):
        os.write(1, b"foundry: worker (rank 0) active\n")  # this process's own fd (pytest holds sys.stdout)
        subprocess.run(["sh", "-c", "echo 'Graph capturing finished in 41 secs, took 0.52 GiB' >&2"], check=True)
    assert "foundry: worker (rank 0) active\n" in seen
    startup = r.Startup()
    for line in seen:
        startup.line(line)
    assert startup.figures == {"graph_capture_s": 41.0, "graph_memory_gib": 0.52}
    assert "Graph capturing finished in 41 secs" in capfd.readouterr().out  # echoed as it passed


def test_the_recipe_runs_its_usage_without_vllm():
    out = run("run.py", "--help")
    assert out.returncode == 0 and "--wave" in out.stdout and "qwen3-30b-a3b" in out.stdout
