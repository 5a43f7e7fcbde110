"""The SGLang plugin's own logic on the CPU: configuration, version and drift
refusals, graph names, and failing closed when it cannot run. (The hooks
themselves run inside SGLang's scheduler, on the GPU.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from foundry.errors import DriftError, FoundryError
from foundry.integrations.sglang.config import PluginConfig, load_config
from foundry.integrations.sglang.hookpoints import CHECKED_VERSIONS, HOOK_POINTS, check_version
from foundry.integrations.sglang.plugin import graph_name
from foundry.integrations.sglang.server_args import SERVER_ARGS, check_server_args, server_fingerprint
from foundry.integrations.sglang.warmup_skip import PLACED, VERDICT

from .engine_stubs import fake_engine


def test_no_configuration_means_off():
    assert load_config({}) == PluginConfig()


def test_the_launcher_environment_configures_the_plugin():
    config = load_config({"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": "/srv/a", "FOUNDRY_REGION_BASE": "0x600000000000",
                          "FOUNDRY_REGION_SIZE": str(64 << 30)})  # fmt: skip
    assert config == PluginConfig("load", "/srv/a", 0x600000000000, 64 << 30, from_launcher=True)
    skipping = load_config({"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": "/srv/a", "FOUNDRY_LOAD_WARMUP": "restore"})
    assert skipping.warmup == "restore"
    with pytest.raises(FoundryError, match="unknown warm-up mode") as err:
        load_config({"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": "/srv/a", "FOUNDRY_LOAD_WARMUP": "skip"})
    assert err.value.field == "FOUNDRY_LOAD_WARMUP"
    with pytest.raises(FoundryError, match="unknown mode"):
        load_config({"FOUNDRY_MODE": "restore", "FOUNDRY_ARCHIVE": "/srv/a"})
    with pytest.raises(FoundryError, match="not a number") as err:
        load_config({"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": "/a", "FOUNDRY_REGION_BASE": "high"})
    assert err.value.field == "FOUNDRY_REGION_BASE"


def test_a_toml_file_configures_the_plugin_and_bad_ones_are_refused(tmp_path):
    good = tmp_path / "foundry.toml"
    good.write_text('mode = "save"\narchive = "/srv/a"\nregion_base = 0x600000000000\n')
    assert load_config({"FOUNDRY_SGLANG_CONFIG": str(good)}) == PluginConfig("save", "/srv/a", 0x600000000000)
    cases = {
        "not TOML": ("mode = save", "not TOML"),
        "unknown key": ('mode = "save"\narchive = "/a"\nbase = 1\n', "invalid plugin configuration"),
        "no archive": ('mode = "load"\n', "needs an archive"),
        "small region": ('mode = "load"\narchive = "/a"\nregion_size = 4096\n', "at least 1 GiB"),
        "launcher flag": ('mode = "load"\narchive = "/a"\nfrom_launcher = true\n', "unknown setting"),
        "warm-up mode": ('mode = "load"\narchive = "/a"\nwarmup = "skip"\n', "invalid plugin configuration"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.toml"
        path.write_text(text)
        with pytest.raises(FoundryError, match=message):
            load_config({"FOUNDRY_SGLANG_CONFIG": str(path)})
    with pytest.raises(FoundryError, match="cannot read"):
        load_config({"FOUNDRY_SGLANG_CONFIG": str(tmp_path / "missing.toml")})


def test_only_checked_sglang_versions_are_accepted():
    check_version(CHECKED_VERSIONS[0])
    with pytest.raises(FoundryError, match="not checked against") as err:
        check_version("0.5.18")
    assert err.value.field == "sglang.version" and err.value.found == "0.5.18"


def test_a_plugin_that_cannot_run_stops_the_process_with_the_reason(tmp_path):
    # SGLang swallows a plugin's exceptions; SystemExit is not one of them. Here SGLang
    # itself is absent, which the plugin must refuse the same way as an unknown version.
    code = "from foundry.integrations.sglang.plugin import register; register(); print('went on')"
    env = {"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "went on" not in proc.stdout
    assert "foundry: the SGLang plugin cannot run" in proc.stderr and "sglang.version" in proc.stderr
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert off.returncode == 0 and "went on" in off.stdout  # off: nothing checked, nothing patched


def _register_in(root: Path, code: str) -> subprocess.CompletedProcess:
    env = {"FOUNDRY_MODE": "load", "FOUNDRY_ARCHIVE": str(root / "a"), "PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_the_plugin_patches_every_hook_point_itself_once(tmp_path):
    # a stand-in SGLang (engine_stubs): the real one imports the GPU build of torch
    root = fake_engine(tmp_path / "site", "sglang", CHECKED_VERSIONS[0], HOOK_POINTS)
    code = ("import json, pkgutil\nfrom foundry.integrations.sglang import plugin\n"
            "plugin.register(); plugin.register()\nplugin._check_patched()\n"
            "points = [pkgutil.resolve_name(p.target) for p in plugin.HOOK_POINTS]\n"
            "print(json.dumps([(p.__wrapped__.__name__, hasattr(p.__wrapped__, '__wrapped__')) for p in points]))\n"
            "import sglang.srt.plugins\n")  # fmt: skip
    proc = _register_in(root, code)
    # every point wrapped once, the runners' copies of freeze_gc each in their own module; the
    # plugin never touches SGLang's hook registry (the stand-in has none: importing it fails)
    assert "ModuleNotFoundError: No module named 'sglang.srt.plugins'" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout) == [[p.attribute, False] for p in HOOK_POINTS]
    assert [p.module for p in HOOK_POINTS if p.attribute == "freeze_gc"] == [
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
        "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    ]
    missing = HOOK_POINTS[2].target
    partial = fake_engine(tmp_path / "partial", "sglang", CHECKED_VERSIONS[0], HOOK_POINTS, leave_out=missing)
    proc = _register_in(partial, "from foundry.integrations.sglang import plugin\nplugin.register()")
    assert proc.returncode == 1 and "the SGLang plugin cannot run" in proc.stderr and missing in proc.stderr
    proc = _register_in(
        partial,
        "import json, pkgutil\nfrom foundry.integrations.sglang import plugin\n"
        "try:\n    plugin.register()\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps(hasattr(pkgutil.resolve_name({HOOK_POINTS[0].target!r}), '__wrapped__')))",
    )
    assert json.loads(proc.stdout) is False  # a missing point patches nothing


def test_graph_names_follow_runner_and_shape():
    shape = types.SimpleNamespace(size=8, stream_idx=None, variant_label=None)
    assert graph_name("decode", shape) == "decode.bs8"
    assert (
        graph_name("prefill", types.SimpleNamespace(size=512, stream_idx=1, variant_label="tp/2"))
        == "prefill.t512.s1.tp_2"
    )


def test_server_arguments_that_shape_memory_are_compared_by_name():
    args = types.SimpleNamespace(model_path="/m", mem_fraction_static=0.2, cuda_graph_max_bs_decode=8,
                                 attention_backend="triton", tp_size=1)  # fmt: skip
    saved = server_fingerprint(args, "0.5.17")
    assert set(saved) == {f"sglang.{n}" for n in SERVER_ARGS} | {"sglang.version"}
    check_server_args(saved, server_fingerprint(args, "0.5.17"))
    for name, value in (("mem_fraction_static", 0.3), ("cuda_graph_max_bs_decode", 16), ("attention_backend", "fa3")):
        live = server_fingerprint(types.SimpleNamespace(**{**vars(args), name: value}), "0.5.17")
        with pytest.raises(DriftError, match=f"differs from SAVE's in sglang.{name}") as err:
            check_server_args(saved, live)
        assert err.value.field == f"sglang.{name}"
    with pytest.raises(DriftError, match=r"sglang\.model_config_sha256"):
        check_server_args(saved, {"sglang.model_config_sha256": "ab" * 32})
    both = server_fingerprint(types.SimpleNamespace(**{**vars(args), "mem_fraction_static": 0.3,
                                                       "attention_backend": "fa3"}), "0.5.17")  # fmt: skip
    with pytest.raises(DriftError, match=r"in sglang\.mem_fraction_static \(also sglang\.attention_backend\)") as err:
        check_server_args(saved, both)  # the first differing field, every other one named
    assert err.value.field == "sglang.mem_fraction_static"


def test_the_recipe_comparison_tells_runs_and_prompts_apart(tmp_path):
    import json

    def record(name, outputs):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"outputs": [{"output_ids": ids, "logprobs": lps} for ids, lps in outputs]}))
        return str(path)

    base = record("base", [([5, 6, 7], [-0.5, -0.25, -1.0]), ([8, 9, 9], [-0.125, -2.0, -3.0])])
    same = record("same", [([5, 6, 7], [-0.5, -0.25, -1.0]), ([8, 9, 9], [-0.125, -2.0, -3.0])])
    token = record("token", [([5, 6, 7], [-0.5, -0.25, -1.0]), ([8, 4, 9], [-0.125, -2.0, -3.0])])
    logprob = record("logprob", [([5, 6, 7], [-0.5, -0.25, -1.5]), ([8, 9, 9], [-0.125, -2.0, -3.0])])
    alike = record("alike", [([5, 6, 7], [-0.5, -0.25, -1.0]), ([5, 6, 7], [-0.5, -0.25, -1.0])])
    script = [sys.executable, str(Path(__file__).resolve().parent.parent / "recipes" / "sglang" / "compare.py")]
    assert subprocess.run([*script, base, same], capture_output=True).returncode == 0
    out = subprocess.run([*script, base, token, logprob], capture_output=True, text=True)
    assert out.returncode == 1 and "prompt 1: output ids differ from step 1" in out.stdout
    assert "prompt 0: logprobs differ" in out.stdout
    assert subprocess.run([*script, alike, alike], capture_output=True).returncode == 1  # prompts not told apart


def test_servers_the_plugin_cannot_persist_are_refused_by_field():
    from foundry.integrations.sglang.plugin import _check_supported

    def args(**changes):
        phase = types.SimpleNamespace(backend="disabled")
        full = types.SimpleNamespace(backend="full")
        base = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "enable_memory_saver": False,
                "speculative_algorithm": None, "cuda_graph_config": types.SimpleNamespace(prefill=phase, decode=full),
                "disable_prefill_cuda_graph": False, "cuda_graph_backend_decode": "full"}  # fmt: skip
        return types.SimpleNamespace(**{**base, **changes})

    _check_supported(args())
    for prefill in ("full", "breakable"):
        _check_supported(
            args(
                cuda_graph_config=types.SimpleNamespace(
                    prefill=types.SimpleNamespace(backend=prefill), decode=types.SimpleNamespace(backend="full")
                )
            )
        )
    _check_supported(args(cuda_graph_config=None, disable_prefill_cuda_graph=True))  # flags: only without a config
    _check_supported(args(tp_size=2))  # one scheduler a rank: tests/test_sglang_tensor_parallel.py
    _check_supported(args(flashinfer_allreduce_fusion_backend="auto"))  # one rank all-reduces nothing
    refused = {
        "sglang.pp_size": args(pp_size=2),
        "sglang.dp_size": args(tp_size=2, dp_size=2),
        "sglang.enable_dp_attention": args(tp_size=2, enable_dp_attention=True),
        "sglang.flashinfer_allreduce_fusion_backend": args(tp_size=2, flashinfer_allreduce_fusion_backend="auto"),
        "sglang.enable_symm_mem": args(tp_size=2, enable_symm_mem=True),
        "sglang.enable_torch_symm_mem": args(tp_size=2, enable_torch_symm_mem=True),
        "sglang.enable_mscclpp": args(tp_size=2, enable_mscclpp=True),
        "sglang.enable_memory_saver": args(enable_memory_saver=True),
        "sglang.speculative_algorithm": args(speculative_algorithm="DFLASH"),  # EAGLE: tests/test_sglang_speculative.py
        "sglang.cuda_graph_backend_prefill": args(
            cuda_graph_config=types.SimpleNamespace(prefill=types.SimpleNamespace(backend="tc_piecewise")),
            disable_prefill_cuda_graph=True,  # the resolved config wins over the flag, as in ServerArgs
        ),
        "sglang.cuda_graph_backend_decode": args(
            cuda_graph_config=types.SimpleNamespace(
                prefill=types.SimpleNamespace(backend="disabled"), decode=types.SimpleNamespace(backend="breakable")
            )
        ),
    }
    for field_name, server_args in refused.items():
        with pytest.raises(FoundryError) as err:
            _check_supported(server_args)
        assert err.value.field == field_name


def test_a_refusal_inside_a_hook_is_said_in_one_line_and_still_stops_the_scheduler(capsys, monkeypatch):
    # The KV-budget hook of a LOAD whose archive records no budget: SGLang gets the
    # error (and stops the server); its log gets one line naming what was refused.
    from foundry.integrations.sglang import plugin

    archive = types.SimpleNamespace(catalog=types.SimpleNamespace(model={}))
    session = types.SimpleNamespace(archive=archive)
    state = plugin.SchedulerState(PluginConfig(mode="load", archive="/srv/a"), session, 0)
    monkeypatch.setattr(plugin, "_state", state)
    with pytest.raises(DriftError) as err:
        plugin._kv_budget(lambda configurator: 1 << 30, object())
    assert err.value.field == plugin.KV_BUDGET
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"foundry: scheduler (tp rank 0) load refused: {err.value}"]
    assert plugin.KV_BUDGET in said[0]
    state.finished = True  # a failure that is not drift (the graph phase ending twice) is said as one
    with pytest.raises(FoundryError) as second:
        plugin._on_graphs_done(None)
    assert capsys.readouterr().err.strip() == f"foundry: scheduler (tp rank 0) load failed: {second.value}"


def test_the_report_splits_the_graph_phase_into_sglangs_warmups_and_foundrys_graphs(tmp_path, monkeypatch):
    # SGLang's graph phase holds its two eager warm-up forwards per shape and then the
    # capture (SAVE) or restore (LOAD); the report keeps the two apart. The backend
    # and session stand in for SGLang's and the GPU's, which do not exist here.
    import collections
    import json
    import time

    from foundry.integrations.sglang import plugin

    forwards: list[float] = []
    backend = types.SimpleNamespace(
        _device_module=types.SimpleNamespace(synchronize=lambda: None),
        _tp_group=types.SimpleNamespace(barrier=lambda: None),
        _graphs={}, _outputs={}, _foundry_runner="decode",
    )  # fmt: skip

    def graph(name, fn, **kwargs):
        time.sleep(0.2)
        return types.SimpleNamespace(outputs=f"outputs of {name}")

    session = types.SimpleNamespace(graph=graph, finish=lambda: {"counters": {"stream_captures": 4}},
                                    warmup=lambda fn: fn(), entries=[], device=0, model={}, warmup_pool=None,
                                    warmups_between=[])  # fmt: skip
    state = plugin.SchedulerState(PluginConfig(mode="save", archive=str(tmp_path)), session, 0,
                                  configs={"target": "ab" * 32})  # fmt: skip
    monkeypatch.setattr(plugin, "_state", state)
    # torch's allocation history (a CUDA build of torch) cannot exist here either
    from foundry.integrations.sglang import warmup_skip

    recording = []
    monkeypatch.setattr(warmup_skip, "start_recording", lambda: recording.append("start"))
    monkeypatch.setattr(
        warmup_skip,
        "stop_recording",
        lambda device, pool: recording.append("stop") or (warmup_skip.PhaseBlocks([], []), []),
    )
    session.hook = types.SimpleNamespace(region=lambda: types.SimpleNamespace(base=0x600000000000), trace=lambda: [])
    session.warmup_start = (0, 0)
    monkeypatch.setenv("FOUNDRY_SGLANG_REPORT", str(tmp_path / "report.json"))
    shape = collections.namedtuple("ShapeKey", "size")  # SGLang's keys are hashable records with a size
    for size in (8, 4):
        plugin._capture_one(None, backend, shape(size), lambda: (forwards.append(1), time.sleep(0.01)))
    assert len(forwards) == 4 and backend._outputs[next(iter(backend._graphs))] == "outputs of decode.bs8"
    plugin._on_graphs_done(None)
    report = json.loads((tmp_path / "report.json").read_text())
    seconds = report["sglang_seconds"]
    assert recording == ["start", "stop"] and report["sglang.warmup_skip"] == "safe"
    assert state.session.keep_warmup_bytes  # kept only for a safe verdict
    assert seconds["warmup_forwards_s"] >= 4 * 0.01 and seconds["graphs_s"] >= 2 * 0.2
    assert seconds["warmup_forwards_s"] < 0.2  # neither capture's time is counted as warm-up
    assert 0 <= seconds["session_finish_s"] <= seconds["foundry_s"] - seconds["graphs_s"]


def test_a_load_skips_the_warmups_only_where_save_found_it_safe(monkeypatch):
    # LOAD with --warmup restore: only an archive whose SAVE judged it safe is accepted,
    # and the session's warm-up (LoadSession.warmup itself) skips SGLang's forwards. The
    # backend and the rest of the session stand in for SGLang's and the GPU's.
    import functools

    from foundry.integrations.sglang import plugin
    from foundry.integrations.sglang.warmup_skip import SAFE
    from foundry.runtime.sessions.load import LoadSession

    for recorded in (None, "unsafe: decode.bs8 node 3 points at 0x7f00, in memory ...", "unknown: overflowed"):
        with pytest.raises(DriftError, match="does not allow a LOAD to skip") as err:
            plugin.check_warmup_skip({} if recorded is None else {VERDICT: recorded})
        assert err.value.field == VERDICT and err.value.found == recorded
    plugin.check_warmup_skip({VERDICT: SAFE})

    forwards = []
    backend = types.SimpleNamespace(
        _device_module=types.SimpleNamespace(synchronize=lambda: None),
        _tp_group=types.SimpleNamespace(barrier=lambda: None),
        _graphs={}, _outputs={}, _foundry_runner="decode",
    )  # fmt: skip
    restoring = types.SimpleNamespace(warmup_mode="restore", region_restore=None)
    session = types.SimpleNamespace(
        warmup=functools.partial(LoadSession.warmup, restoring),
        graph=lambda *a, **k: types.SimpleNamespace(outputs="restored outputs"),
    )
    monkeypatch.setattr(plugin, "_state", plugin.SchedulerState(PluginConfig(mode="load", archive="/a"), session, 0,
                                                                configs={"target": "ab" * 32}))  # fmt: skip
    plugin._capture_one(None, backend, 8, lambda: forwards.append(1))
    assert forwards == [] and backend._outputs[8] == "restored outputs"


def test_save_judges_the_skip_unsafe_when_a_graph_points_into_memory_of_the_phase(monkeypatch):
    # torch's allocation history and the hook stand in (no GPU here); the graph is real
    from foundry.archive import Archive
    from foundry.integrations.sglang import plugin, warmup_skip

    from .conftest import FIXTURES

    ir = Archive.open(FIXTURES / "saveload-a").graph(0, "decode.bs8")
    target = next(iter(ir.operands)).value
    # a library's own driver memory (no torch segment), taken in the first shape's warm-up
    kept = types.SimpleNamespace(order=3, offset=0x100, size=4096, freed=False, phase="warmup")
    region = types.SimpleNamespace(base=target - 0x180)
    hook = types.SimpleNamespace(region=lambda: region, trace=lambda: [kept])
    session = types.SimpleNamespace(device=0, entries=[(ir, {})], warmup_start=(3, 0x100), hook=hook,
                                    warmup_pool=None, warmups_between=[])  # fmt: skip
    state = plugin.SchedulerState(PluginConfig(mode="save", archive="/a"), session, 0)
    monkeypatch.setattr(plugin, "_state", state)

    def recorded(warmup=(), program=(), segments=()):
        blocks = warmup_skip.PhaseBlocks(list(warmup), list(program))
        monkeypatch.setattr(warmup_skip, "stop_recording", lambda device, pool: (blocks, list(segments)))

    recorded()
    assert plugin._judge_warmup_skip(session)[VERDICT].startswith("unsafe: decode.bs8 node")
    recorded(segments=[target - 0x80])  # torch's segment
    assert plugin._judge_warmup_skip(session) == {VERDICT: "safe"}
    recorded(warmup=[(target, 8)], segments=[target - 0x80])  # a block a warm-up kept
    assert plugin._judge_warmup_skip(session)[VERDICT].startswith("unsafe: decode.bs8")
    recorded(program=[(target, 8), (target + (1 << 30), 8)], segments=[target - 0x80])  # the capture loop's
    assert plugin._judge_warmup_skip(session) == {VERDICT: "safe", PLACED: "[[384,8]]"}  # the one a graph reads
    state.recording_error = "the program records torch's allocation history itself"
    said = plugin._judge_warmup_skip(session)
    assert said == {VERDICT: "unknown: the program records torch's allocation history itself"}


def test_without_foundry_run_the_plugin_prepares_the_schedulers_environment(with_hook, tmp_path):
    # SGLang spawns its schedulers from this process: they inherit the hook and the
    # session's description, and none of a SAVE's later-run settings.
    code = (
        "import os, json\n"
        "from foundry.integrations.sglang.config import PluginConfig\n"
        "from foundry.integrations.sglang.plugin import _prepare_children\n"
        f"_prepare_children(PluginConfig(mode='save', archive={str(tmp_path / 'a')!r}))\n"
        "print(json.dumps(dict(os.environ)))"
    )
    env = {**os.environ, "FOUNDRY_LAYOUT_PAD": "....", "FOUNDRY_SAVE_FIRST_RUN": "/elsewhere", "PYTHONHASHSEED": "7"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout)
    assert child["LD_PRELOAD"].split(":")[0] == str(with_hook)
    assert child["FOUNDRY_MODE"] == "save" and child["FOUNDRY_ARCHIVE"] == str(tmp_path / "a")
    assert child["PYTHONHASHSEED"] == "0"
    assert "FOUNDRY_LAYOUT_PAD" not in child and "FOUNDRY_SAVE_FIRST_RUN" not in child


def test_a_load_session_s_report_says_where_its_opening_went(tmp_path, monkeypatch):
    from foundry.archive.reader import Archive
    from foundry.integrations.common import session as shared
    from foundry.runtime.sessions.load import LoadSession

    from .hostile import saved_archive

    archive = saved_archive(tmp_path / "a")
    # start() reserves the region through the hook on a GPU; this machine may have neither
    monkeypatch.setattr(LoadSession, "start", lambda self: None)
    live = dict(Archive.open(archive).catalog.model)
    session = shared.start_session(PluginConfig(mode="load", archive=str(archive)), device=0, rank=0, live=live)
    opened = session.report["open_s"]
    assert list(opened) == ["modules", "archive", "session", "engine_record"] and min(opened.values()) >= 0
    with pytest.raises(DriftError, match="model"):  # the record compared after the session, still refused
        shared.start_session(PluginConfig(mode="load", archive=str(archive)), device=0, rank=0,
                             live={**live, "model": "another"})  # fmt: skip


def test_the_session_starts_once_at_the_model_runner_s_set_device_and_refuses_earlier_allocations(capsys, monkeypatch):
    # The session stands in for the GPU's (its start reserves the region through the hook)
    from foundry.integrations.sglang import plugin

    made = {"allocations": 0}
    starts = []
    hook = types.SimpleNamespace(region=lambda: types.SimpleNamespace(**made))
    session = types.SimpleNamespace(start=lambda: starts.append(1), hook=hook)
    state = plugin.SchedulerState(PluginConfig(mode="load", archive="/srv/a"), session, 0)
    monkeypatch.setattr(plugin, "_state", state)
    plugin._on_device_set(object())
    plugin._on_device_set(object())  # a draft model's runner: the session started with the target's
    assert starts == [1] and state.started and 0 <= state.seconds["session_start_s"] <= state.seconds["foundry_s"]
    assert "scheduler (tp rank 0) active: mode load, archive /srv/a" in capsys.readouterr().err
    made["allocations"] = 3  # SGLang allocated before its runner set the device: the trace would miss them
    state = plugin.SchedulerState(PluginConfig(mode="load", archive="/srv/a"), session, 0)
    monkeypatch.setattr(plugin, "_state", state)
    with pytest.raises(FoundryError, match="before its model runner set the device") as err:
        plugin._on_device_set(object())
    assert err.value.field == "sglang.session_start" and err.value.found == 3
    monkeypatch.setattr(plugin, "_state", None)
    plugin._on_device_set(object())  # mode off: nothing to start
