"""Contract tests for speculative decoding and hybrid models, against the real
SGLang wheel (``sglang==0.5.17``, parsed with ``ast`` as in
``tests/test_sglang_contract.py``, whose fixture and helpers these share).

They pin what the plugin's handling rests on: which graph runners build a full
graph backend and which phase each is, that the draft model runner is a
``ModelRunner`` of its own whose graphs come after the target's inside
``Scheduler.init_all_cuda_graphs``, that everything a graph reads outside itself
(static buffers, per-shape attention metadata, speculative inputs) is set up by
SGLang's own code outside ``capture_one`` (so a LOAD that repeats the warm-ups
reproduces it), how a hybrid model's state pool is sized, and the fields SGLang
reports speculative acceptance in."""

from __future__ import annotations

import ast
import json
import warnings
import zipfile

import pytest

from foundry.integrations.sglang import runners, speculative
from foundry.integrations.sglang.hookpoints import HOOK_POINTS

from .test_sglang_contract import _find, _module, _recipe, wheel  # noqa: F401  (wheel: the fixture)

RUNNER_MODULES = {
    "DecodeCudaGraphRunner": "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "PrefillCudaGraphRunner": "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    "EAGLEDraftCudaGraphRunner": "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "EAGLEDraftExtendCudaGraphRunner": "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
}
# graph runners that build a full-graph backend and whose graphs the plugin refuses (runners.phase_of)
REFUSED_RUNNERS = {
    "MultiLayerEagleDraftExtendCudaGraphRunner",
    "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner",
    "FrozenKVMTPCudaGraphRunner",
}


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Calls of ``name`` (a function or an attribute) inside ``node``, in source order."""
    found = [n for n in ast.walk(node) if isinstance(n, ast.Call)
             and (getattr(n.func, "attr", None) == name or getattr(n.func, "id", None) == name)]  # fmt: skip
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _first_line(node: ast.AST, name: str) -> int:
    calls = _calls(node, name)
    assert calls, f"no call of {name}"
    return calls[0].lineno


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _sources(archive: zipfile.ZipFile, words: tuple[bytes, ...]) -> dict[str, ast.Module]:
    """Every module of SGLang's runtime that holds one of ``words``, parsed."""
    found = {}
    for name in archive.namelist():
        if name.startswith("sglang/srt/") and name.endswith(".py"):
            data = archive.read(name)
            if any(word in data for word in words):
                with warnings.catch_warnings():  # SGLang's own invalid escapes
                    warnings.simplefilter("ignore", SyntaxWarning)
                    warnings.simplefilter("ignore", DeprecationWarning)
                    found[name] = ast.parse(data)
    return found


@pytest.fixture(scope="module")
def sources(wheel):  # noqa: F811
    return _sources(wheel, (b"resolve_decode_backend", b"resolve_prefill_backend", b"init_all_cuda_graphs",
                            b"draft_decode", b"target_verify"))  # fmt: skip


def test_the_new_hook_points_are_in_the_table():
    targets = {p.target.rsplit(".", 2)[-2] + "." + p.target.rsplit(".", 1)[-1] for p in HOOK_POINTS}
    assert {"ModelRunner.load_model", "KVCacheConfigurator._handle_max_mamba_cache",
            "Scheduler.init_all_cuda_graphs"} <= targets  # fmt: skip
    assert "ModelRunner.init_cuda_graphs" not in targets  # a draft model captures after its own call returns


def test_every_graph_runner_that_builds_a_full_backend_is_named_or_refused(sources):
    builders = set()
    for tree in sources.values():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            if _calls(cls, "resolve_decode_backend") or _calls(cls, "resolve_prefill_backend"):
                builders.add(cls.name)
    assert builders == set(runners.KNOWN_RUNNERS) | REFUSED_RUNNERS
    for name in REFUSED_RUNNERS:  # refused by name at the backend's construction
        with pytest.raises(Exception, match="not persisted") as err:
            runners.phase_of(type(name, (), {})())
        assert err.value.field == "sglang.graph_runner" and err.value.found == name


@pytest.mark.parametrize("name", ["DecodeCudaGraphRunner", "EAGLEDraftCudaGraphRunner",
                                  "EAGLEDraftExtendCudaGraphRunner"])  # fmt: skip
def test_each_graph_runner_sets_up_what_its_graphs_read_outside_capture_one(wheel, name):  # noqa: F811
    """In ``__init__``: the attention backend's per-runner graph state and the static
    input buffers, then the backend, then the capture loop; per shape, the
    out-of-graph attention metadata before ``backend.capture_one`` (so a LOAD, which
    runs all of it, reproduces it)."""
    tree = _module(wheel, RUNNER_MODULES[name])
    init = _find(tree, [name, "__init__"])
    assert init is not None
    state = _first_line(init, "init_cuda_graph_state")
    buffers = _first_line(init, "share_buffers")
    assert state < buffers < _first_line(init, "resolve_decode_backend") < _first_line(init, "capture")
    shape = _find(tree, [name, "capture_one_shape"])
    metadata = _calls(shape, "init_forward_metadata_out_graph")
    assert metadata and any(k.arg == "in_capture" for k in metadata[0].keywords)
    assert metadata[0].lineno < _first_line(shape, "capture_one")


def test_draft_runners_key_their_graphs_by_batch_size_and_subclass_the_decode_runner(wheel):  # noqa: F811
    for name in ("EAGLEDraftCudaGraphRunner", "EAGLEDraftExtendCudaGraphRunner"):
        cls = _find(_module(wheel, RUNNER_MODULES[name]), [name])
        assert [b.id for b in cls.bases] == ["DecodeCudaGraphRunner"]
        key = _find(cls, ["_make_graph_key"])
        call = _calls(key, "ShapeKey")[0]
        assert [k.arg for k in call.keywords] == ["size"]  # draft_decode.bs8, draft_extend.bs8


def test_the_decode_runner_chooses_target_verify_before_building_its_backend(wheel):  # noqa: F811
    init = _find(_module(wheel, RUNNER_MODULES["DecodeCudaGraphRunner"]), ["DecodeCudaGraphRunner", "__init__"])
    modes = [n for n in ast.walk(init) if isinstance(n, ast.Assign) and any(
        getattr(t, "attr", None) == "capture_forward_mode" for t in n.targets)]  # fmt: skip
    values = {ast.unparse(n.value) for n in modes}
    assert {"ForwardMode.DECODE", "ForwardMode.TARGET_VERIFY"} <= values
    assert max(n.lineno for n in modes) < _first_line(init, "resolve_decode_backend")
    forward_mode = _find(_module(wheel, "sglang.srt.model_executor.forward_batch_info"), ["ForwardMode"])
    members = {t.id for n in forward_mode.body if isinstance(n, ast.Assign) for t in n.targets}
    assert {"DECODE", "TARGET_VERIFY"} <= members


def test_the_phase_names_are_sglangs_own(sources):
    setup = sources["sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py"]
    eagle = sources["sglang/srt/speculative/eagle_worker_v2.py"]
    assert set(runners.PHASES) <= _strings(setup) | _strings(eagle)


def test_the_draft_model_runner_is_a_model_runner_of_its_own_captured_after_the_target(wheel):  # noqa: F811
    scheduler = _module(wheel, "sglang.srt.managers.scheduler")
    init = _find(scheduler, ["Scheduler", "init_model_worker"])
    order = [_first_line(init, n) for n in ("init_tp_model_worker", "maybe_init_draft_worker", "init_memory_pools",
                                            "init_all_attention_backends", "init_all_cuda_graphs")]  # fmt: skip
    assert order == sorted(order)
    graphs = _find(scheduler, ["Scheduler", "init_all_cuda_graphs"])
    assert [ast.unparse(c.func) for c in _calls(graphs, "init_cuda_graphs")] == [
        "self.tp_worker.init_cuda_graphs", "self.draft_worker.init_cuda_graphs"]  # fmt: skip
    eagle = _module(wheel, "sglang.srt.speculative.eagle_worker_v2")
    standalone = _module(wheel, "sglang.srt.speculative.standalone_worker_v2")
    for module, cls in ((eagle, "EagleDraftWorker"), (standalone, "StandaloneDraftWorker")):
        worker = _calls(_find(module, [cls, "__init__"]), "TpModelWorker")
        assert worker and any(k.arg == "is_draft_worker" and ast.unparse(k.value) == "True" for k in worker[0].keywords)
    draft_graphs = _find(eagle, ["EagleDraftWorker", "init_cuda_graphs"])
    assert _first_line(draft_graphs, "init_cuda_graphs") < _first_line(draft_graphs, "_capture_cuda_graphs")
    capture = _find(eagle, ["EagleDraftWorker", "_capture_cuda_graphs"])
    assert {"EAGLEDraftCudaGraphRunner", "EAGLEDraftExtendCudaGraphRunner"} <= {
        n.id for n in ast.walk(capture) if isinstance(n, ast.Name)}  # fmt: skip


def test_init_all_cuda_graphs_is_called_once_per_scheduler(sources):
    callers = [(path, c.lineno) for path, tree in sources.items() for c in _calls(tree, "init_all_cuda_graphs")]
    assert [path for path, _ in callers] == ["sglang/srt/managers/scheduler.py"]


def test_the_algorithms_are_the_ones_the_plugin_knows(wheel):  # noqa: F811
    spec = _module(wheel, "sglang.srt.speculative.spec_info")
    enum = _find(spec, ["SpeculativeAlgorithm"])
    members = {t.id for n in enum.body if isinstance(n, ast.Assign) for t in n.targets}
    refused = {"DFLASH", "DSPARK", "FROZEN_KV_MTP"}
    assert members == set(speculative.PERSISTED) | refused | {"NONE"}
    for name in refused:
        with pytest.raises(Exception, match="not persisted") as err:
            speculative.check_speculative(type("Args", (), {"speculative_algorithm": name})())
        assert err.value.field == "sglang.speculative_algorithm"
    registry = _module(wheel, "sglang.srt.speculative.spec_registry")
    aliases = next(n for n in registry.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) ==
                   "_RESERVED_ALIASES")  # fmt: skip
    assert _strings(aliases) == set(speculative.ALIASES)
    hook = _find(_module(wheel, "sglang.srt.arg_groups.speculative_hook"), ["_resolve_speculative_algorithm_alias"])
    assert {"NEXTN", "EAGLE"} <= _strings(hook)
    create = _find(enum, ["create_worker"])
    assert "server_args.enable_multi_layer_eagle" in ast.unparse(create)  # the switch the plugin refuses by name
    assert {"EAGLEWorkerV2", "StandaloneWorkerV2", "NGRAMWorker", "MultiLayerEagleWorkerV2"} <= {
        n.id for n in ast.walk(create) if isinstance(n, ast.Name)}  # fmt: skip


def test_ngram_has_no_draft_model_runner_and_adaptive_speculation_captures_more(wheel):  # noqa: F811
    ngram = _find(_module(wheel, "sglang.srt.speculative.ngram_worker"), ["NGRAMWorker"])
    assert not _calls(ngram, "TpModelWorker") and not _calls(ngram, "ModelRunner")
    assert speculative.model_runners(type("Args", (), {"speculative_algorithm": "NGRAM"})()) == ("target",)
    eagle = _find(_module(wheel, "sglang.srt.speculative.eagle_worker_v2"), ["EAGLEWorkerV2", "init_cuda_graphs"])
    assert _calls(eagle, "init_states")  # every candidate step's graphs: refused by sglang.speculative_adaptive
    states = _find(_module(wheel, "sglang.srt.speculative.adaptive_runtime_state"), ["AdaptiveController",
                                                                                    "init_states"])  # fmt: skip
    assert _calls(states, "build_adaptive_runtime_state")


def test_only_the_target_profiles_memory_and_the_state_pool_is_sized_inside_it(wheel):  # noqa: F811
    kv = _module(wheel, "sglang.srt.mem_cache.kv_cache_configurator")
    configure = _find(kv, ["KVCacheConfigurator", "configure"])
    first = next(n for n in configure.body if isinstance(n, ast.If))
    assert "self.is_draft_worker" in ast.unparse(first.test) and "self.memory_pool_config" in ast.unparse(first.body)
    profile = _find(kv, ["KVCacheConfigurator", "_profile_available_bytes"])
    assert _calls(profile, "_handle_max_mamba_cache")
    mamba = _find(kv, ["KVCacheConfigurator", "_handle_max_mamba_cache"])
    overrides = _calls(mamba, "override")
    assert overrides and all([k.arg for k in c.keywords] == ["max_mamba_cache_size"] for c in overrides)
    assert all(ast.unparse(c.func) == "get_context().override" for c in overrides)
    assert "get_schedule().max_mamba_cache_size" in ast.unparse(mamba)  # where the plugin reads the size
    context = _module(wheel, "sglang.srt.runtime_context")
    override = _find(context, ["RuntimeContext", "override"])
    assert [a.arg for a in override.args.args] == ["self", "source"] and override.args.kwarg is not None
    assert _find(context, ["get_context"]) is not None and _find(context, ["get_schedule"]) is not None
    server_args = _find(_module(wheel, "sglang.srt.server_args"), ["ServerArgs"])
    fields = {n.target.id for n in ast.iter_child_nodes(server_args) if isinstance(n, ast.AnnAssign)}
    assert "max_mamba_cache_size" in fields


def test_a_model_runner_loads_its_weights_after_its_configuration_is_set(wheel):  # noqa: F811
    runner = _module(wheel, "sglang.srt.model_executor.model_runner")
    init = _find(runner, ["ModelRunner", "__init__"])
    assigned = {ast.unparse(t) for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets}
    assert {"self.model_config", "self.is_draft_worker"} <= assigned
    assert _calls(_find(runner, ["ModelRunner", "initialize"]), "load_model")
    config = _find(_module(wheel, "sglang.srt.configs.model_config"), ["ModelConfig"])
    assert "Qwen3NextForCausalLMMTP" in _strings(config)  # a Qwen3-Next draft is its MTP head


def test_the_hybrid_backend_keeps_per_shape_metadata_in_buffers_made_once(wheel):  # noqa: F811
    hybrid = _module(wheel, "sglang.srt.layers.attention.hybrid_linear_attn_backend")
    state = _find(hybrid, ["MambaAttnBackendBase", "init_cuda_graph_state"])
    text = ast.unparse(state)
    assert "self.state_indices_list.append" in text and "self.query_start_loc_list.append" in text
    out_graph = _find(hybrid, ["MambaAttnBackendBase", "init_forward_metadata_out_graph"])
    assert _calls(out_graph, "_replay_metadata")  # refilled in place before every replay (and at capture)
    gdn = _find(_module(wheel, "sglang.srt.layers.attention.linear.gdn_backend"), ["GDNAttnBackend"])
    assert [b.id for b in gdn.bases] == ["MambaAttnBackendBase"]


def test_the_recipes_hybrid_config_is_one_qwen3_next_reads(wheel):  # noqa: F811
    init = _find(_module(wheel, "sglang.srt.configs.qwen3_next"), ["Qwen3NextConfig", "__init__"])
    params = {a.arg for a in init.args.args}
    generic = {"architectures", "model_type", "torch_dtype", "full_attention_interval", "bos_token_id",
               "eos_token_id"}  # fmt: skip
    run = _recipe("run")
    config = {**run.CONFIG, **run.QWEN3_NEXT}  # what the recipe writes for its qwen3-next presets
    assert set(config) - params <= generic, sorted(set(config) - params - generic)
    assert config["architectures"] == ["Qwen3NextForCausalLM"]
    layers = _find(_module(wheel, "sglang.srt.configs.qwen3_next"), ["Qwen3NextConfig", "layers_block_type"])
    assert "self.full_attention_interval" in ast.unparse(layers)
    kinds = ["full" if (i + 1) % config["full_attention_interval"] == 0 else "linear"
             for i in range(config["num_hidden_layers"])]  # fmt: skip
    assert "full" in kinds and "linear" in kinds  # both kinds of layer, so the hybrid backend is used


def test_the_recipe_reads_speculative_acceptance_where_sglang_reports_it(wheel):  # noqa: F811
    metrics = _find(_module(wheel, "sglang.srt.managers.tokenizer_manager"),
                    ["TokenizerManager", "_calculate_spec_decoding_metrics"])  # fmt: skip
    keys = {ast.unparse(t.slice).strip("'\"") for n in ast.walk(metrics) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "meta_info"}  # fmt: skip
    run = _recipe("run")
    assert set(run.SPEC_FIELDS) <= keys
    meta = {"output_token_logprobs": [[-0.5, 5], [-1.0, 6]], "spec_verify_ct": 1, "spec_num_correct_drafts": 1,
            "spec_num_proposed_drafts": 3, "e2e_latency": 0.1}  # fmt: skip
    out = run._output({"output_ids": [5, 6], "meta_info": meta})
    assert out["spec"] == {"spec_verify_ct": 1, "spec_num_correct_drafts": 1, "spec_num_proposed_drafts": 3}
    assert json.loads(json.dumps(out)) == out
