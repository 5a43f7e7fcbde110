"""The SGLang recipe's readers, run as scripts: compare.py over the wave, the
restored graphs' replays and speculative acceptance, tpot.py over SGLang's decode
log lines (in the format SGLang 0.5.17's metrics reporter writes them); and the
recipe's standalone draft model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from .conftest import load_script

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "sglang"


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECIPE / script), *args], capture_output=True, text=True, timeout=60)


def report(tmp_path: Path, name: str, wave: list[list[int]] | None, foundry: dict | None = None) -> str:
    outputs = [{"output_ids": [5, 6, 7], "logprobs": [-0.5, -0.25, -1.0]},
               {"output_ids": [8, 9, 9], "logprobs": [-0.125, -2.0, -3.0]}]  # fmt: skip
    waves = None if wave is None else [{"output_ids": ids, "logprobs": [-1.0] * len(ids)} for ids in wave]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"outputs": outputs, "wave": waves, "foundry": foundry}))
    return str(path)


def test_compare_names_the_first_differing_wave_prompt_and_step(tmp_path):
    base = report(tmp_path, "base", [[1], [2, 3], [4, 5, 6]])
    same = report(tmp_path, "same", [[1], [2, 3], [4, 5, 6]])
    other = report(tmp_path, "other", [[1], [2, 3], [4, 7, 6]])
    missing = report(tmp_path, "missing", None)
    assert run("compare.py", base, same).returncode == 0
    out = run("compare.py", base, other, missing)
    assert out.returncode == 1
    assert "wave prompt 2: output ids differ from step 1" in out.stdout
    assert "0 wave prompt outputs, not 3" in out.stdout


def test_compare_says_which_restored_graphs_were_never_replayed(tmp_path):
    base = report(tmp_path, "base", None)
    load = report(tmp_path, "load", None, {"mode": "load", "sglang_graphs": ["decode.bs2", "decode.bs1"],
                                            "replayed": ["decode.bs1"]})  # fmt: skip
    out = run("compare.py", base, load)
    assert out.returncode == 0
    assert "replayed 1 of 2 restored graphs; never: decode.bs2" in out.stdout


def decode_line(running: int, throughput: float, graph: bool = True) -> str:
    return (f"[2026-12-01 10:00:00] Decode batch, #running-req: {running}, #token: 4096, token usage: 0.06, "
            f"cuda graph: {graph}, gen throughput (token/s): {throughput:.2f}, #queue-req: 0, ")  # fmt: skip


def test_tpot_takes_the_median_step_at_each_announced_size(tmp_path):
    lines = ["tpot batch 8", *(decode_line(8, 800.0 + (i % 3) * 100) for i in range(120)),
             decode_line(7, 5.0), decode_line(8, 1.0, graph=False),  # the batch shrinking; an eager step
             "tpot batch 64", *(decode_line(64, 3200.0) for _ in range(110)), "tpot batch end",
             decode_line(64, 1.0)]  # fmt: skip
    reference = tmp_path / "plain.log"
    reference.write_text("\n".join(lines) + "\n")
    slower = tmp_path / "load.log"
    slower.write_text("\n".join(line.replace("3200.00", "3100.00") for line in lines) + "\n")
    out = run("tpot.py", str(reference), str(slower))
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert rows["8"].count("8.889 ( 120)") == 2  # 8 tokens over the median 900 token/s
    assert "20.000 ( 110)  1.000x" in rows["64"] and "20.645 ( 110)  1.032x" in rows["64"]


def test_tpot_gives_each_run_of_a_log_its_own_column(tmp_path):
    """A SAVE's log holds its priming run (a plain one) and its own: told apart, not merged."""

    def one_run(throughput: float) -> list[str]:
        return ["tpot batch 1", *(decode_line(1, throughput) for _ in range(100)), "tpot batch end"]

    save = tmp_path / "save.log"
    save.write_text("\n".join([*one_run(200.0), "foundry: scheduler (tp rank 0) active", *one_run(250.0)]) + "\n")
    out = run("tpot.py", str(save))
    assert out.returncode == 0, out.stderr
    assert "save.log#1" in out.stdout and "save.log#2" in out.stdout
    assert "5.000 ( 100)  1.000x      4.000 ( 100)  0.800x" in out.stdout.splitlines()[1]


def test_tpot_keeps_two_logs_of_one_name_apart_by_their_paths(tmp_path):
    """Two machines' ``run.log``: two columns, each labelled by its path, neither overwritten."""
    for name, throughput in (("a", 200.0), ("b", 400.0)):
        (tmp_path / name).mkdir()
        lines = ["tpot batch 1", *(decode_line(1, throughput) for _ in range(100)), "tpot batch end"]
        (tmp_path / name / "run.log").write_text("\n".join(lines) + "\n")
    out = run("tpot.py", str(tmp_path / "a" / "run.log"), str(tmp_path / "b" / "run.log"))
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "a" / "run.log") in out.stdout and str(tmp_path / "b" / "run.log") in out.stdout
    assert "5.000 ( 100)  1.000x      2.500 ( 100)  0.500x" in out.stdout.splitlines()[1]


def test_tpot_refuses_too_few_steps(tmp_path):
    log = tmp_path / "short.log"
    log.write_text("tpot batch 256\n" + "\n".join(decode_line(256, 9000.0) for _ in range(40)) + "\n")
    out = run("tpot.py", str(log))
    assert out.returncode == 2 and "too few: 40" in out.stdout


def test_tpot_refuses_a_reference_that_never_decoded(tmp_path):
    failed = tmp_path / "failed.log"  # a run refused before its first batch
    failed.write_text("run.py: error: --wave-size needs --wave\n")
    other = tmp_path / "other.log"
    other.write_text("tpot batch 1\n" + "\n".join(decode_line(1, 200.0) for _ in range(120)) + "\ntpot batch end\n")
    out = run("tpot.py", str(failed), str(other))
    assert out.returncode == 2 and "failed.log announces no batch size" in out.stderr, out.stderr


def spec_report(tmp_path: Path, name: str, accepted: list[int], proposed: int = 30) -> str:
    """A run under speculative decoding: per prompt, SGLang's verify steps and drafts."""
    outputs = [{"output_ids": [5 + i, 6, 7], "logprobs": [-0.5, -0.25, -1.0],
                "spec": {"spec_verify_ct": 10, "spec_num_correct_drafts": a, "spec_num_proposed_drafts": proposed}}
               for i, a in enumerate(accepted)]  # fmt: skip
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"outputs": outputs}))
    return str(path)


def test_compare_checks_speculative_counts_and_the_accept_rate(tmp_path):
    base = spec_report(tmp_path, "base", [30, 24])
    same = spec_report(tmp_path, "same", [30, 24])
    fewer = spec_report(tmp_path, "fewer", [30, 23])
    out = run("compare.py", base, same)
    assert out.returncode == 0, out.stdout
    assert f"speculative: 20 verify steps, 54 of 60 drafts accepted (rate 0.900)  {base}" in out.stdout
    out = run("compare.py", base, fewer)
    assert out.returncode == 1
    assert "prompt 1: speculative counts differ (spec_num_correct_drafts 24 vs 23)" in out.stdout
    assert run("compare.py", "--min-accept-rate", "0.5", base, same).returncode == 0
    low = spec_report(tmp_path, "low", [3, 2])
    out = run("compare.py", low, spec_report(tmp_path, "low2", [3, 2]), "--min-accept-rate", "0.5")
    assert out.returncode == 1 and "accept rate 0.083, below 0.5" in out.stdout
    plain = report(tmp_path, "plain", None)  # no speculative counts at all: no rate to hold
    out = run("compare.py", plain, plain, "--min-accept-rate", "0.5")
    assert out.returncode == 1 and "accept rate not recorded" in out.stdout
    for bad in ("2", "much"):
        out = run("compare.py", base, same, "--min-accept-rate", bad)
        assert out.returncode == 2 and out.stderr.count("\n") == 1


def recipe():
    return load_script(RECIPE / "run.py", "sglang_recipe_run_drafts")


def test_a_standalone_draft_is_the_targets_own_config_in_a_directory_of_its_own(tmp_path):
    module = recipe()
    model = tmp_path / "foundry-sglang-standalone"
    config = {**module.CONFIG, "num_hidden_layers": 2}
    draft = module.draft_model("standalone", model, config, {})
    assert draft == tmp_path / "foundry-sglang-standalone-draft"
    assert json.loads((draft / "config.json").read_text()) == config
    module.draft_model("standalone", model, config, {"num_hidden_layers": 1})  # drift: another draft model
    assert json.loads((draft / "config.json").read_text()) == {**config, "num_hidden_layers": 1}
    assert module.draft_model("qwen3-next-mtp", model, config, {}) == model  # the MTP head: the target's path
    assert module.draft_model("tiny", model, config, {}) is None
    with pytest.raises(SystemExit, match="needs a preset with a standalone draft"):
        module.draft_model("qwen3-next-mtp", model, config, {"num_hidden_layers": 1})
    assert set(module.DRAFTS) <= set(module.PRESETS)
    for name in ("standalone", "ngram", "qwen3-next-mtp"):
        assert module.PRESETS[name][1]["speculative_algorithm"] in ("STANDALONE", "NGRAM", "NEXTN")


def test_compare_names_the_first_differing_prefill_walk_prompt(tmp_path):
    walk = [{"output_ids": [4, 5], "logprobs": [-0.5, -1.5]}, {"output_ids": [6, 7], "logprobs": [-0.5, -1.0]}]
    paths = []
    for name, second in (("base", walk[1]), ("same", walk[1]), ("other", {**walk[1], "logprobs": [-0.5, -2.0]})):
        path = tmp_path / f"{name}.json"
        record = json.loads(Path(report(tmp_path, name, None)).read_text())
        path.write_text(json.dumps({**record, "prefill_walk": [walk[0], second]}))
        paths.append(str(path))
    assert run("compare.py", paths[0], paths[1]).returncode == 0
    out = run("compare.py", paths[0], paths[2], report(tmp_path, "without", None))
    assert out.returncode == 1
    assert "prefill walk prompt 1: logprobs differ from step 1" in out.stdout
    assert "0 prefill walk prompt outputs, not 2" in out.stdout


def test_the_prefill_walk_sends_one_prompt_per_resolved_size_with_no_shared_prefix(capsys):
    module = recipe()
    # stands in for sglang.Engine, whose resolved server arguments need a GPU machine
    engine = SimpleNamespace(server_args=SimpleNamespace(context_length=8195, cuda_graph_config=SimpleNamespace(
        prefill=SimpleNamespace(bs=[8192, 4, 12, 256]))))  # fmt: skip
    sizes = module.prefill_sizes(engine)
    assert sizes == [4, 12, 256, 8192]
    walk = module.walk_prompts(sizes, 151936)
    assert [len(ids) for ids in walk] == sizes
    others = module.prompts() + module.wave_prompts()
    firsts = {ids[0] for ids in walk}
    assert len(firsts) == len(walk) and not firsts & {ids[0] for ids in others}  # no prefix to share
    assert all(3 <= token < 151936 for ids in walk for token in ids)
    refused(
        capsys,
        lambda: module.walk_prompts(list(range(1, 5)) * 6, 1024),
        "24 prompts need a vocabulary of at least 1027 ids, not 1024",
    )
    engine.server_args.context_length = 8194  # SGLang refuses a prompt whose length and new tokens reach it
    refused(
        capsys,
        lambda: module.prefill_sizes(engine),
        "a prompt of 8192 tokens needs --set context_length=8195 or more, not 8194",
    )
    engine.server_args.cuda_graph_config.prefill.bs = None
    refused(capsys, lambda: module.prefill_sizes(engine), "resolved no prefill graph sizes")


def refused(capsys, call, said: str) -> None:
    """``call`` exits 2 with one line on stderr that says ``said``."""
    with pytest.raises(SystemExit) as exited:
        call()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and said in err, err


def test_the_prefill_walk_needs_the_engine_entry(tmp_path):
    out = run("run.py", "--out", str(tmp_path / "r.json"), "--entry", "http", "--prefill-walk")
    assert out.returncode == 2 and "--prefill-walk needs --entry engine" in out.stderr


def test_the_wave_size_is_checked_and_each_prompt_begins_with_its_own_id(tmp_path):
    module = recipe()
    wave = module.wave_prompts(module.WAVE_MAX)
    assert len(wave) == module.WAVE_MAX and all(len(ids) == 16 for ids in wave)
    assert len({ids[0] for ids in wave}) == module.WAVE_MAX  # no two share a prefix
    assert module.wave_prompts()[:3] == wave[:3] and len(module.wave_prompts()) == module.WAVE
    for size, said in (("0", "1 to 1000 prompts, not 0"), ("1001", "not 1001"), ("many", "not a prompt count")):
        out = run("run.py", "--out", str(tmp_path / "r.json"), "--wave", "--wave-size", size)
        assert out.returncode == 2 and "--wave-size" in out.stderr and said in out.stderr, out.stderr
    out = run("run.py", "--out", str(tmp_path / "r.json"), "--wave-size", "512")
    assert out.returncode == 2 and "--wave-size needs --wave" in out.stderr


def test_compare_splits_a_loads_graph_phase_into_warmups_graphs_and_capture_loops(tmp_path):
    def timed(name: str, phase: float, foundry: dict | None) -> str:
        path = Path(report(tmp_path, name, None, foundry))
        record = json.loads(path.read_text())
        record["startup"] = {"scheduler_e2e": phase + 3.0, "cuda_graph": {"decode": phase}}
        path.write_text(json.dumps(record))
        return str(path)

    split = {"warmup_forwards_s": 0.0, "graphs_s": 0.37, "capture_loop_s": 0.52}
    out = run("compare.py", timed("plain", 5.5, None), timed("load", 1.38, {"sglang_seconds": split}))
    assert out.returncode == 0, out.stdout
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("load.json") and "graphs" in line)
    assert "graphs   1.38 (decode 1.38); 4.0x less" in lines[at]
    assert "forwards 0.00, Foundry's graphs 0.37; capture loops 0.52, the phase outside them 0.86" in lines[at + 1]
