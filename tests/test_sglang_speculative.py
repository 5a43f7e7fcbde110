"""The SGLang plugin with several model runners and hybrid models, on the CPU: graph
runners named and refused, speculative algorithms accepted and refused by field,
one archive per scheduler with every runner's graphs, each model runner's
configuration compared, the linear-attention state pool sized as at SAVE.

SGLang's GPU runtime (its graph runners, model runners, backends, the session's
GPU side and SGLang's runtime configuration) cannot exist here: the objects the
hooks receive are stand-ins named and shaped like SGLang 0.5.17's, which
``tests/test_sglang_speculative_contract.py`` pins against the real sources."""

from __future__ import annotations

import collections
import enum
import json
import sys
import types

import pytest

from foundry.errors import DriftError, FoundryError
from foundry.integrations.sglang import plugin, runners, speculative, warmup_skip
from foundry.integrations.sglang.config import PluginConfig
from foundry.integrations.sglang.server_args import check_server_args, server_fingerprint


class ForwardMode(enum.IntEnum):  # SGLang's, the members the runners capture in
    DECODE = 2
    TARGET_VERIFY = 5
    DLLM_EXTEND = 9


def model_runner(draft: bool = False, **config) -> types.SimpleNamespace:
    """A model runner as SGLang's graph runners hold it (the fields the plugin reads)."""
    hf_config = types.SimpleNamespace(architectures=["Qwen3ForCausalLM"], hidden_size=256, **config)
    return types.SimpleNamespace(is_draft_worker=draft, model_config=types.SimpleNamespace(hf_config=hf_config))


def graph_runner(kind: str, runner: types.SimpleNamespace, mode: ForwardMode | None = None, **fields):
    """An instance of a class named like SGLang's graph runner ``kind``."""
    attrs = {"model_runner": runner, **({} if mode is None else {"capture_forward_mode": mode}), **fields}
    return type(kind, (), attrs)()


TARGET, DRAFT = model_runner(), model_runner(draft=True)


def test_each_graph_runner_is_named_by_sglangs_phase():
    assert runners.phase_of(graph_runner("DecodeCudaGraphRunner", TARGET, ForwardMode.DECODE)) == "decode"
    assert runners.phase_of(graph_runner("DecodeCudaGraphRunner", TARGET, ForwardMode.TARGET_VERIFY)) == (
        "target_verify"
    )
    assert runners.phase_of(graph_runner("EAGLEDraftCudaGraphRunner", DRAFT)) == "draft_decode"
    assert runners.phase_of(graph_runner("EAGLEDraftExtendCudaGraphRunner", DRAFT)) == "draft_extend"
    assert runners.phase_of(graph_runner("PrefillCudaGraphRunner", TARGET)) == "prefill"
    assert runners.phase_of(graph_runner("PrefillCudaGraphRunner", DRAFT)) == "draft_prefill"
    assert (runners.role_of(TARGET), runners.role_of(DRAFT), runners.role_of(None)) == ("target", "draft", "target")
    key = types.SimpleNamespace(size=8, stream_idx=None, variant_label=None)
    names = [runners.graph_name(phase, key) for phase in runners.PHASES]
    assert names == ["decode.bs8", "target_verify.bs8", "draft_decode.bs8", "draft_extend.bs8", "prefill.t8",
                     "draft_prefill.t8"]  # fmt: skip


def test_graph_runners_the_plugin_has_not_been_checked_against_are_refused_by_name():
    verify = ForwardMode.TARGET_VERIFY
    refused = {
        "FrozenKVMTPCudaGraphRunner": graph_runner("FrozenKVMTPCudaGraphRunner", DRAFT),
        "DecodeCudaGraphRunner of the draft model": graph_runner("DecodeCudaGraphRunner", DRAFT, verify),
        "DecodeCudaGraphRunner (DLLM_EXTEND)": graph_runner("DecodeCudaGraphRunner", TARGET, ForwardMode.DLLM_EXTEND),
        "DecodeCudaGraphRunner (TARGET_VERIFY, ragged)": graph_runner("DecodeCudaGraphRunner", TARGET, verify,
                                                                      ragged_verify_mode=True),
    }  # fmt: skip
    for found, runner in refused.items():
        with pytest.raises(FoundryError, match="not persisted") as err:
            runners.phase_of(runner)
        assert err.value.field == "sglang.graph_runner" and err.value.found == found


def spec_args(**changes) -> types.SimpleNamespace:
    base = {"speculative_algorithm": "STANDALONE", "enable_multi_layer_eagle": False, "speculative_adaptive": False}
    return types.SimpleNamespace(**{**base, **changes})


def test_persisted_algorithms_pass_and_the_others_are_refused_by_field():
    for name in ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NEXTN", "eagle"):
        speculative.check_speculative(spec_args(speculative_algorithm=name))
    speculative.check_speculative(spec_args(speculative_algorithm=None))
    assert speculative.model_runners(spec_args(speculative_algorithm="NEXTN")) == ("target", "draft")
    assert speculative.model_runners(spec_args(speculative_algorithm=None)) == ("target",)
    refused = {
        "sglang.speculative_algorithm": [spec_args(speculative_algorithm=n) for n in ("DFLASH", "DSPARK",
                                                                                        "FROZEN_KV_MTP", "MY_SPEC")],
        "sglang.enable_multi_layer_eagle": [spec_args(speculative_algorithm="EAGLE", enable_multi_layer_eagle=True)],
        "sglang.speculative_adaptive": [spec_args(speculative_adaptive=True)],
    }  # fmt: skip
    for field, cases in refused.items():
        for args in cases:
            with pytest.raises(FoundryError) as err:
                speculative.check_speculative(args)
            assert err.value.field == field
    full = types.SimpleNamespace(backend="full")
    server = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "enable_memory_saver": False,
              "cuda_graph_config": types.SimpleNamespace(prefill=types.SimpleNamespace(backend="disabled"),
                                                         decode=full)}  # fmt: skip
    plugin._check_supported(types.SimpleNamespace(**server, **vars(spec_args())))  # the plugin's start check
    with pytest.raises(FoundryError) as err:
        plugin._check_supported(types.SimpleNamespace(**server, **vars(spec_args(speculative_algorithm="DFLASH"))))
    assert err.value.field == "sglang.speculative_algorithm"


def test_another_algorithm_number_of_steps_tree_or_draft_model_is_drift_by_field():
    saved_args = types.SimpleNamespace(model_path="/m", speculative_algorithm="STANDALONE", speculative_num_steps=3,
                                       speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                                       speculative_draft_model_path="/m-draft", max_mamba_cache_size=None,
                                       mamba_ssm_dtype="float32")  # fmt: skip
    saved = server_fingerprint(saved_args, "0.5.17")
    changes = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 5, "speculative_eagle_topk": 4,
               "speculative_num_draft_tokens": 8, "speculative_draft_model_path": "/other-draft",
               "max_mamba_cache_size": 64, "mamba_ssm_dtype": "bfloat16"}  # fmt: skip
    for name, value in changes.items():
        live = server_fingerprint(types.SimpleNamespace(**{**vars(saved_args), name: value}), "0.5.17")
        with pytest.raises(DriftError) as err:
            check_server_args(saved, live)
        assert err.value.field == f"sglang.{name}"


class Session:
    """The session's CPU side: what the hooks call (SAVE or LOAD), the GPU work left out."""

    def __init__(self, mode: str, archived: list[tuple[str, str]] | None = None, model: dict | None = None):
        self.mode, self.model, self.entries, self.device = mode, {}, [], 0
        self.captured: list[tuple[str, str | None]] = []
        self.keep_warmup_bytes = None
        self.counters = {"stream_captures": 0 if mode == "load" else 12}
        entries = [types.SimpleNamespace(name=n, runner=r) for n, r in archived or []]
        self.record = types.SimpleNamespace(graphs=entries)
        self.archive = types.SimpleNamespace(catalog=types.SimpleNamespace(model=model or {}))
        self.hook = types.SimpleNamespace(region=lambda: types.SimpleNamespace(base=0x600000000000),
                                          trace=lambda: [])  # fmt: skip
        self.warmup_start = (0, 0)
        self.warmup_pool, self.warmups_between = None, []  # the warm-ups' MemPool is a GPU's

    def warmup(self, fn):
        fn()

    def graph(self, name, fn, *, shape_key=None, runner=None):
        self.captured.append((name, runner))
        return types.SimpleNamespace(outputs=f"outputs of {name}", first_replay=None)

    def finish(self):
        return {"mode": self.mode, "counters": dict(self.counters)}


def backend() -> types.SimpleNamespace:
    """A full-graph backend's fields the capture hook uses."""
    device = types.SimpleNamespace(synchronize=lambda: None)
    group = types.SimpleNamespace(barrier=lambda: None)
    return types.SimpleNamespace(_device_module=device, _tp_group=group, _graphs={}, _outputs={})


ShapeKey = collections.namedtuple("ShapeKey", "size")  # SGLang's keys: hashable records with a size
SHAPES = (8, 4)
RUNNERS = (("DecodeCudaGraphRunner", TARGET, ForwardMode.TARGET_VERIFY), ("EAGLEDraftCudaGraphRunner", DRAFT, None),
           ("EAGLEDraftExtendCudaGraphRunner", DRAFT, None))  # fmt: skip


def serve(session: Session, monkeypatch, tmp_path, mode: str, draft: types.SimpleNamespace = DRAFT) -> dict:
    """One scheduler's start-up as SGLang 0.5.17 orders it under STANDALONE: both model
    runners load, then the target's graphs, then the draft model's, then the end of
    ``init_all_cuda_graphs``. Returns the plugin's report."""
    state = plugin.SchedulerState(PluginConfig(mode=mode, archive=str(tmp_path / "a")), session, 0,
                                  expected_runners=("target", "draft"))  # fmt: skip
    monkeypatch.setattr(plugin, "_state", state)
    monkeypatch.setattr(warmup_skip, "start_recording", lambda: None)  # torch's allocation history: a CUDA build
    monkeypatch.setattr(warmup_skip, "stop_recording", lambda device, pool: (warmup_skip.PhaseBlocks([], []), []))
    monkeypatch.setenv("FOUNDRY_SGLANG_REPORT", str(tmp_path / "report.json"))
    plugin._on_model_load(TARGET)
    plugin._on_model_load(draft)
    for kind, runner, mode_ in RUNNERS:
        graphs = backend()
        plugin._note_runner(None, graphs, graph_runner(kind, runner, mode_))
        for size in SHAPES:
            plugin._capture_one(None, graphs, ShapeKey(size), lambda: None)
        assert graphs._outputs[ShapeKey(8)].startswith("outputs of ")
    plugin._on_graphs_done(None)
    return json.loads((tmp_path / "report.json").read_text())


ALL = [f"{phase}.bs{size}" for phase in ("target_verify", "draft_decode", "draft_extend") for size in SHAPES]


def test_save_writes_every_runners_graphs_into_one_archive_with_their_runner(monkeypatch, tmp_path, capsys):
    session = Session("save")
    report = serve(session, monkeypatch, tmp_path, "save")
    assert session.captured == [(n, n.split(".")[0]) for n in ALL]  # the runner recorded with each graph
    assert report["sglang_graphs"] == ALL
    by_role = report["sglang_model_runners"]
    assert by_role["target"]["graph_runners"] == {"target_verify": ALL[:2]}
    assert by_role["draft"]["graph_runners"] == {"draft_decode": ALL[2:4], "draft_extend": ALL[4:]}
    assert set(session.model) >= {plugin.MODEL_CONFIGS["target"], plugin.MODEL_CONFIGS["draft"], warmup_skip.VERDICT}
    verdict = session.model[warmup_skip.VERDICT]
    assert verdict.startswith("unknown: not judged for several model runners") and not session.keep_warmup_bytes
    with pytest.raises(DriftError) as err:  # so a LOAD skipping the warm-ups is refused, by name
        plugin.check_warmup_skip(session.model)
    assert err.value.field == warmup_skip.VERDICT
    said = capsys.readouterr().err
    assert "6 graphs saved (target_verify 2, draft_decode 2, draft_extend 2)" in said


def test_load_restores_every_runners_graphs_and_refuses_a_missing_one(monkeypatch, tmp_path):
    saved = Session("save")
    serve(saved, monkeypatch, tmp_path, "save")
    archived = [(n, n.split(".")[0]) for n in ALL]
    loaded = Session("load", archived, saved.model)
    report = serve(loaded, monkeypatch, tmp_path, "load")
    assert report["sglang_graphs"] == ALL and loaded.captured == archived
    extra = Session("load", [*archived, ("draft_extend.bs16", "draft_extend")], saved.model)
    with pytest.raises(DriftError, match="did not ask for every archived graph") as err:
        serve(extra, monkeypatch, tmp_path, "load")  # SAVE's draft extend had a shape this LOAD's did not
    assert err.value.field == "sglang.graphs" and err.value.found == ["draft_extend.bs16"]
    captured = Session("load", archived, saved.model)
    captured.counters["stream_captures"] = 1
    with pytest.raises(DriftError) as err:
        serve(captured, monkeypatch, tmp_path, "load")
    assert err.value.field == "stream_captures"


def test_another_draft_model_is_refused_before_its_weights_are_allocated(monkeypatch, tmp_path):
    saved = Session("save")
    serve(saved, monkeypatch, tmp_path, "save")
    loaded = Session("load", [(n, n.split(".")[0]) for n in ALL], saved.model)
    other = model_runner(draft=True, num_hidden_layers=1)
    with pytest.raises(DriftError) as err:
        serve(loaded, monkeypatch, tmp_path, "load", draft=other)
    assert err.value.field == "sglang.draft_model_config_sha256"
    assert loaded.captured == []  # refused at the draft's load, before any graph


def test_model_runners_the_plugin_does_not_expect_or_never_saw_are_refused(monkeypatch, tmp_path):
    state = plugin.SchedulerState(PluginConfig(mode="save", archive=str(tmp_path)), Session("save"), 0,
                                  expected_runners=("target", "draft"))  # fmt: skip
    monkeypatch.setattr(plugin, "_state", state)
    plugin._on_model_load(TARGET)
    with pytest.raises(FoundryError) as err:  # multi-layer EAGLE's second draft, say
        plugin._on_model_load(TARGET)
    assert err.value.field == "sglang.model_runners" and err.value.found == "target"
    with pytest.raises(FoundryError) as err:  # the draft's load never reached the hook
        plugin._on_graphs_done(None)
    assert err.value.field == "sglang.model_runners" and err.value.found == ["target"]


def test_a_graph_name_taken_twice_or_a_capture_after_the_phase_is_refused(monkeypatch, tmp_path):
    state = plugin.SchedulerState(PluginConfig(mode="save", archive=str(tmp_path)), Session("save"), 0)
    monkeypatch.setattr(plugin, "_state", state)
    monkeypatch.setattr(warmup_skip, "start_recording", lambda: None)
    graphs = backend()
    plugin._note_runner(None, graphs, graph_runner("EAGLEDraftCudaGraphRunner", DRAFT))
    plugin._capture_one(None, graphs, ShapeKey(8), lambda: None)
    with pytest.raises(FoundryError, match="two graphs of one name") as err:
        plugin._capture_one(None, graphs, ShapeKey(8), lambda: None)
    assert err.value.found == "draft_decode.bs8"
    state.finished = True
    with pytest.raises(FoundryError, match="after the scheduler's graph phase ended") as err:
        plugin._capture_one(None, graphs, ShapeKey(4), lambda: None)
    assert err.value.field == "sglang.graphs"
    with pytest.raises(FoundryError) as err:  # a backend the plugin never noted
        plugin._capture_one(None, backend(), ShapeKey(2), lambda: None)
    assert err.value.field == "sglang.graph_runner"


def test_without_a_session_the_hooks_leave_sglang_alone(monkeypatch):
    monkeypatch.setattr(plugin, "_state", None)
    graphs = backend()
    plugin._note_runner(None, graphs, graph_runner("FrozenKVMTPCudaGraphRunner", DRAFT))  # not refused: off
    assert not hasattr(graphs, "_foundry_runner")
    assert plugin._capture_one(lambda *a: "captured by SGLang", graphs, ShapeKey(8), None) == "captured by SGLang"
    plugin._on_model_load(TARGET)


class Schedule:
    """SGLang's runtime configuration as ``_handle_max_mamba_cache`` leaves it: the state
    pool's size in the schedule bag, changed only through ``get_context().override``."""

    def __init__(self, size: int):
        self.max_mamba_cache_size = size
        self.overrides: list[tuple[str, dict]] = []

    def override(self, source: str, **fields):
        self.overrides.append((source, fields))
        self.max_mamba_cache_size = fields["max_mamba_cache_size"]


def runtime_context(monkeypatch, schedule: Schedule) -> None:
    module = types.ModuleType("sglang.srt.runtime_context")
    module.get_schedule = lambda: schedule
    module.get_context = lambda: schedule
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", module)


def test_the_state_pool_is_sized_as_at_save(monkeypatch, tmp_path):
    save = Session("save")
    monkeypatch.setattr(plugin, "_state", plugin.SchedulerState(PluginConfig(mode="save", archive="/a"), save, 0))
    schedule = Schedule(120)  # slots SGLang derived from free memory at SAVE
    runtime_context(monkeypatch, schedule)
    assert plugin._mamba_pool(lambda configurator, rest: rest - 3.0, object(), 40.0) == 37.0
    assert save.model[plugin.MAMBA_POOL] == "120" and schedule.overrides == []
    assert plugin._state.hybrid  # so SAVE does not judge a LOAD skipping the warm-ups
    assert warmup_skip.unjudged(["target"], True).startswith("not judged for a hybrid model")
    assert warmup_skip.unjudged(["target"], False) is None

    load = Session("load", model=save.model)
    monkeypatch.setattr(plugin, "_state", plugin.SchedulerState(PluginConfig(mode="load", archive="/a"), load, 0))
    schedule = Schedule(131)  # more memory free now: SAVE's size is taken
    runtime_context(monkeypatch, schedule)
    plugin._mamba_pool(lambda configurator, rest: rest, object(), 40.0)
    assert schedule.max_mamba_cache_size == 120 and [f for _, f in schedule.overrides] == [
        {"max_mamba_cache_size": 120}]  # fmt: skip
    schedule = Schedule(120)  # the same: nothing overridden
    runtime_context(monkeypatch, schedule)
    plugin._mamba_pool(lambda configurator, rest: rest, object(), 40.0)
    assert schedule.overrides == []
    runtime_context(monkeypatch, Schedule(97))  # less memory free: refused, by field
    with pytest.raises(DriftError, match="less GPU memory is free for the linear-attention state pool") as err:
        plugin._mamba_pool(lambda configurator, rest: rest, object(), 40.0)
    assert err.value.field == plugin.MAMBA_POOL and (err.value.expected, err.value.found) == (120, 97)
    unrecorded = Session("load", model={})
    monkeypatch.setattr(plugin, "_state", plugin.SchedulerState(PluginConfig(mode="load", archive="/a"), unrecorded,
                                                                0))  # fmt: skip
    with pytest.raises(DriftError, match="records no size for the linear-attention state pool"):
        plugin._mamba_pool(lambda configurator, rest: rest, object(), 40.0)
