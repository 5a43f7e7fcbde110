"""The plugin vLLM loads: hooks that SAVE or LOAD a worker's CUDA graphs.

vLLM runs :func:`register` once in every process it starts (the front end, the
engine core, each worker, its model-registry subprocess). It logs and swallows
an exception raised while importing a plugin, but not one raised by calling it:
the plugin still stops the process itself (``SystemExit`` with the reason) when
its configuration is wrong, vLLM is missing or its version was not checked,
before anything is patched; inside the hooks a Foundry error propagates and the
engine fails to start. In a worker (hook points in :mod:`.hookpoints`):

1. ``Worker.init_device`` (before): open the SAVE or LOAD session and reserve the
   deterministic region before the worker's first CUDA allocation; refuse what
   cannot be persisted; LOAD compares the configuration with SAVE's, by field.
2. ``Worker.determine_available_memory``: SAVE records the KV budget vLLM
   profiled; LOAD takes that budget, so the KV cache lands where it did.
3. V1's ``profile_cudagraph_memory``: vLLM's own captures, passed through.
4. ``capture_model`` (either runner): the graph phase. Before it, the resolved
   graph configuration and the model are recorded (SAVE) or compared (LOAD);
   after it, SAVE writes the archive and LOAD checks that every archived graph
   was restored and nothing captured.
5. ``CUDAGraphWrapper.__call__`` and V2's ``CudaGraphManager.capture``: where vLLM
   would capture a graph, SAVE captures through the session and LOAD installs the
   restored graph where vLLM keeps it (:mod:`.graphs` names them and checks their
   inputs).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundry.env import VLLM_REPORT
from foundry.errors import FoundryError
from foundry.integrations.common import patching
from foundry.integrations.common import session as shared
from foundry.integrations.common.drift import check_fields, config_digest, value_text
from foundry.integrations.common.session import say as _say
from foundry.integrations.vllm.config import PluginConfig, load_config
from foundry.integrations.vllm.engine_config import check_supported, config_fingerprint
from foundry.integrations.vllm.graphs import INPUTS, OUT, check_inputs, graph_inputs, graph_name
from foundry.integrations.vllm.hookpoints import HOOK_POINTS, check_version

KV_BUDGET = "vllm.kv_budget_bytes"
MODEL_CONFIG = "vllm.model_config_sha256"
RUNNER = "vllm.model_runner"  # v1 or v2
COMPILE_CACHE_KEY = "vllm.compile_cache_key"  # the torch.compile cache's hash directory, compared
COMPILE_CACHE_DIR = "vllm.compile_cache_dir"  # where that cache was at SAVE: recorded, not compared
# spawned, not forked, children: a forked engine core would inherit this process's loaded-plugins
# flag (so never report itself) and, without `foundry run`, no hook
CHILDREN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
# vLLM's compilation counters that say whether torch.compile's cache was warm
COMPILE_COUNTERS = ("num_inductor_compiles", "num_compiled_artifacts_loaded", "num_compiled_artifacts_saved",
                    "num_cache_entries_updated", "num_aot_artifacts_loaded", "num_aot_compiles")  # fmt: skip


@dataclass
class WorkerState:
    """What the plugin holds in one worker process."""

    config: PluginConfig
    session: Any
    rank: int
    runner: str  # "v1" or "v2"
    graphs: list[str] = field(default_factory=list)
    profiling: bool = False  # inside V1's graph-memory estimate: vLLM's own captures
    graph_phase: bool = False  # inside capture_model
    finished: bool = False
    compile: dict[str, Any] = field(default_factory=dict)  # torch.compile's cache, for the report
    # seconds in vLLM's graph phase, in capturing (SAVE) or restoring (LOAD), and in every Foundry call
    # on the worker's path (session start, graphs, finish)
    seconds: dict[str, float] = field(default_factory=lambda: {"capture_model_s": 0.0, "graphs_s": 0.0,
                                                               "foundry_s": 0.0})  # fmt: skip


_state: WorkerState | None = None


def register() -> None:
    """vLLM's entry point (group ``vllm.general_plugins``), run once per process."""
    try:
        config = load_config()
        if config.mode == "off":
            return
        if config.warmup != "replay":
            raise FoundryError("a vLLM LOAD repeats vLLM's warm-ups; restoring their bytes is not supported yet",
                               field="warmup", expected=["replay"], found=config.warmup)  # fmt: skip
        check_version(installed_version())
        patching.install(HOOK_POINTS, sys.modules[__name__], "vllm")  # every point or none
        if config.from_launcher:
            os.environ.update(CHILDREN)
        else:
            shared.prepare_children(config, CHILDREN)
    except FoundryError as err:
        raise SystemExit(f"foundry: the vLLM plugin cannot run: {err}") from None
    _say(f"vLLM plugin active (pid {os.getpid()}): mode {config.mode}, archive {config.archive}")


def installed_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise FoundryError("vLLM is not installed in this environment", field="vllm.version") from None


@functools.cache
def _vllm() -> Any:
    """The names of vLLM (and torch) the hooks use, imported once, in a worker. (The
    CPU tests stand in for them: importing vLLM needs the CUDA build of torch.)"""
    import torch
    from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
    from vllm.compilation.counter import compilation_counter
    from vllm.compilation.cuda_graph import CUDAGraphEntry
    from vllm.compilation.monitor import validate_cudagraph_capturing_enabled
    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed.parallel_state import graph_capture
    from vllm.forward_context import get_forward_context, is_forward_context_available
    from vllm.model_executor.offloader.base import get_offloader
    from vllm.utils.torch_utils import weak_ref_tensors
    from vllm.v1.worker.gpu.cudagraph_utils import AttentionStatePair

    return types.SimpleNamespace(
        inference_mode=torch.inference_mode,
        is_breakable_cudagraph_enabled=is_breakable_cudagraph_enabled,
        compilation_counter=compilation_counter,
        CUDAGraphEntry=CUDAGraphEntry,
        validate_cudagraph_capturing_enabled=validate_cudagraph_capturing_enabled,
        CUDAGraphMode=CUDAGraphMode,
        graph_capture=graph_capture,
        get_forward_context=get_forward_context,
        is_forward_context_available=is_forward_context_available,
        get_offloader=get_offloader,
        weak_ref_tensors=weak_ref_tensors,
        AttentionStatePair=AttentionStatePair,
    )


def _who() -> str:
    return "worker" if _state is None else f"worker (rank {_state.rank}) {_state.config.mode}"


# A hook's Foundry error stops the worker (vLLM logs it with a traceback and the engine fails
# to start); the log also gets one line that says what was refused (drift) or what failed.
_says_refusals = shared.says_refusals(_who)


def _timed(key: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add a call's seconds to the worker's ``key`` (and to nothing once no session runs)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            begun = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if _state is not None:
                    _state.seconds[key] += time.perf_counter() - begun

        return run

    return decorate


# -- the worker ------------------------------------------------------------------------


@_says_refusals
def _on_worker_start(worker: Any, *args: Any, **kwargs: Any) -> None:
    global _state
    begun = time.perf_counter()
    config = load_config()
    if config.mode == "off":
        return
    if _state is not None:
        raise FoundryError("a second worker in one process; the plugin persists one per process",
                           field="vllm.workers")  # fmt: skip
    patching.check_patched(HOOK_POINTS, "vllm")
    vllm_config = worker.vllm_config
    check_supported(vllm_config)
    _check_no_breakable_graphs()
    runner = "v2" if worker.use_v2_model_runner else "v1"
    model = config_digest(getattr(vllm_config.model_config, "hf_config", None))
    live = {**config_fingerprint(vllm_config, installed_version()), RUNNER: runner, MODEL_CONFIG: model}
    rank = worker.rank or 0
    session = shared.start_session(config, device=worker.local_rank or 0, rank=rank, live=live,
                                   keep_warmup_bytes=False)  # fmt: skip
    _state = WorkerState(config, session, rank, runner)
    _state.seconds["foundry_s"] += time.perf_counter() - begun
    _say(f"worker (rank {rank}) active: mode {config.mode}, archive {config.archive}, model runner {runner}")


def _check_no_breakable_graphs() -> None:
    if _vllm().is_breakable_cudagraph_enabled():
        raise FoundryError("breakable CUDA graphs are captured by a wrapper of their own; not persisted",
                           field="vllm.breakable_cudagraph")  # fmt: skip


@_says_refusals
def _kv_budget(original: Any, worker: Any, *args: Any, **kwargs: Any) -> int:
    profiled = original(worker, *args, **kwargs)
    if _state is None:
        return profiled
    budget = shared.pinned_budget(_state.session, _state.config.mode, profiled, KV_BUDGET, "vLLM")
    if hasattr(worker, "available_kv_cache_memory_bytes"):  # what vLLM logs against later
        worker.available_kv_cache_memory_bytes = budget
    return budget


@_says_refusals
def _profile_graph_memory(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    """V1 captures a few graphs into a pool of its own to estimate graph memory, then
    drops them: vLLM's own captures, passed through in SAVE and LOAD alike, so both
    allocate alike (and the hook, told so, does not refuse them in a LOAD)."""
    if _state is None:
        return original(runner, *args, **kwargs)
    _state.profiling = True
    try:
        with _state.session.hook.passthrough():
            return original(runner, *args, **kwargs)
    finally:
        _state.profiling = False


@_says_refusals
def _capture_model(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    if _state is None:
        return original(runner, *args, **kwargs)
    if _state.graph_phase or _state.finished:
        raise FoundryError("capture_model ran twice in one worker; the plugin persists one graph phase",
                           field="vllm.model_runners")  # fmt: skip
    begun = time.perf_counter()
    _check_graph_config(runner.vllm_config)
    _state.seconds["foundry_s"] += time.perf_counter() - begun
    _state.graph_phase = True
    try:
        result = original(runner, *args, **kwargs)
    finally:
        _state.graph_phase = False
        _state.seconds["capture_model_s"] += time.perf_counter() - begun
    _finish()
    return result


def _check_graph_config(vllm_config: Any) -> None:
    """What the runner resolved once the attention backends were known (the graph mode
    and sizes it will capture) and torch.compile's cache key: SAVE records, LOAD compares."""
    assert _state is not None
    compilation = vllm_config.compilation_config
    cache_dir = getattr(compilation, "cache_dir", "") or ""
    live = {
        "vllm.resolved.cudagraph_mode": value_text(compilation.cudagraph_mode),
        "vllm.resolved.cudagraph_capture_sizes": value_text(compilation.cudagraph_capture_sizes),
        "vllm.resolved.max_cudagraph_capture_size": value_text(compilation.max_cudagraph_capture_size),
        COMPILE_CACHE_KEY: Path(cache_dir).name,
    }
    _state.compile = {"cache_dir": cache_dir, "local_cache_dir": getattr(compilation, "local_cache_dir", None),
                      **_compile_counters()}  # fmt: skip
    if _state.config.mode == "save":
        _state.session.model.update(live)
        _state.session.model[COMPILE_CACHE_DIR] = cache_dir
    else:
        check_fields(_state.session.archive.catalog.model, live)


def _compile_counters() -> dict[str, int]:
    return {name: getattr(_vllm().compilation_counter, name, 0) for name in COMPILE_COUNTERS}


@_timed("foundry_s")
def _finish() -> None:
    assert _state is not None
    _state.finished = True
    report = _state.session.finish()
    if _state.config.mode == "load":
        shared.check_restored(_state.session, _state.graphs, report, "vllm.graphs")
    report["vllm_graphs"] = list(_state.graphs)
    report["vllm_model_runner"] = _state.runner
    report["vllm_compile"] = _state.compile
    report["vllm_seconds"] = dict(_state.seconds)
    counters = report.get("counters", {})
    _say(f"worker (rank {_state.rank}) {_state.config.mode}: {len(_state.graphs)} graphs "
         f"{'saved' if _state.config.mode == 'save' else 'restored'}, "
         f"{counters.get('stream_captures', 0)} stream captures, "
         f"{counters.get('passthrough_captures', 0)} passed through")  # fmt: skip
    shared.write_report(VLLM_REPORT.read(), report)


# -- the graphs ----------------------------------------------------------------------


@_timed("foundry_s")
@_timed("graphs_s")
def _graph(name: str, step: Callable[[], Any], num_tokens: int, inputs: dict[str, Any]) -> Any:
    """SAVE: ``step`` captured through the session; LOAD: the restored graph, its inputs
    checked against ``inputs`` (the live ones)."""
    assert _state is not None
    if name in _state.graphs:
        raise FoundryError("two graphs of one worker have the same name", field="vllm.graphs", found=name)
    graph = _state.session.graph(name, step, shape_key=num_tokens, runner=_state.runner)
    _state.graphs.append(name)
    if _state.config.mode == "load":
        check_inputs(name, (graph.outputs or {}).get(INPUTS), inputs)
        graph.first_replay = functools.partial(_note_replay, name)
    return graph


def _note_replay(name: str) -> None:
    """A restored graph's first replay, for the report (vLLM replays after it is written)."""
    shared.note_replay(VLLM_REPORT.read(), name)


def _capture_descriptor(wrapper: Any) -> Any:
    """The batch descriptor ``wrapper`` would capture a graph for now, or None where
    vLLM would not capture (no forward context, another runtime mode, or a graph
    already there: a replay)."""
    vllm = _vllm()
    if not vllm.is_forward_context_available():
        return None
    context = vllm.get_forward_context()
    mode = context.cudagraph_runtime_mode
    if mode == vllm.CUDAGraphMode.NONE or mode != wrapper.runtime_mode:
        return None
    entry = wrapper.concrete_cudagraph_entries.get(context.batch_descriptor)
    return None if entry is not None and entry.cudagraph is not None else context.batch_descriptor


@_says_refusals
def _wrapper_call(original: Any, wrapper: Any, *args: Any, **kwargs: Any) -> Any:
    """``CUDAGraphWrapper.__call__``: where vLLM would capture, SAVE captures through the
    session and LOAD installs the restored graph; every other call is vLLM's."""
    if _state is None or _state.finished or _state.profiling:
        return original(wrapper, *args, **kwargs)
    descriptor = _capture_descriptor(wrapper)
    if descriptor is None:
        return original(wrapper, *args, **kwargs)
    if not _state.graph_phase:
        raise FoundryError("vLLM captures a graph outside capture_model; the plugin persists only those",
                           field="vllm.graphs", found=repr(descriptor))  # fmt: skip
    return _install_wrapper_graph(wrapper, descriptor, args, kwargs)


def _install_wrapper_graph(wrapper: Any, descriptor: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """vLLM's capture branch, with the session in place of ``torch.cuda.graph``: the
    entry gets the graph and weak references to its outputs, and this forward gets
    the outputs themselves (the next piece reads them)."""
    vllm = _vllm()
    assert _state is not None
    vllm.validate_cudagraph_capturing_enabled()
    mode = wrapper.runtime_mode.name
    piece = getattr(wrapper.runnable, "piecewise_compile_index", None) if mode == "PIECEWISE" else None
    if mode == "PIECEWISE" and piece is None:
        raise FoundryError("a piecewise graph of a piece that has no index", field="vllm.graphs",
                           found=type(wrapper.runnable).__name__)  # fmt: skip
    name = graph_name(mode, descriptor, piece)
    inputs = graph_inputs(args, kwargs)
    weak_output = wrapper.cudagraph_options.weak_ref_output

    def step() -> dict[str, Any]:
        out = wrapper.runnable(*args, **kwargs)
        vllm.get_offloader().join_after_forward()
        return {OUT: vllm.weak_ref_tensors(out) if weak_output else out, INPUTS: inputs}

    vllm.get_offloader().sync_prev_onload()
    graph = _graph(name, step, descriptor.num_tokens, inputs)
    out = graph.outputs[OUT]
    if _state.config.mode == "save":
        graph.outputs = None  # as in vLLM, only the entry's weak references outlive this forward
    wrapper.concrete_cudagraph_entries[descriptor] = vllm.CUDAGraphEntry(
        batch_descriptor=descriptor,
        cudagraph=graph,
        output=vllm.weak_ref_tensors(out),
        input_addresses=[a.data_ptr() for a in args if callable(getattr(a, "data_ptr", None))],
    )
    vllm.compilation_counter.num_cudagraph_captured += 1
    return out


@_says_refusals
def _manager_capture(original: Any, manager: Any, create_forward_fn: Any,
                     progress_bar_desc: str = "Capturing CUDA graphs") -> Any:  # fmt: skip
    """V2's capture loop as vLLM runs it (piecewise descriptors first, then full ones,
    each warmed up once), the full graphs through the session into
    ``manager.graphs``; the piecewise pass reaches ``_wrapper_call``."""
    if _state is None:
        return original(manager, create_forward_fn, progress_bar_desc)
    if not _state.graph_phase:
        raise FoundryError("a V2 graph manager captures outside capture_model (a drafter's?); not persisted",
                           field="vllm.graphs")  # fmt: skip
    vllm = _vllm()
    modes = vllm.CUDAGraphMode
    states: dict[Any, Any] = {}
    with vllm.inference_mode(), vllm.graph_capture(device=manager.device):
        for mode in (modes.PIECEWISE, modes.FULL):
            for desc in manager._capture_descs.get(mode, ()):
                forward_fn, warmup_state = create_forward_fn(desc, warmup=True)
                forward_fn(modes.NONE)
                if desc.cg_mode == modes.PIECEWISE:
                    states[desc] = vllm.AttentionStatePair(warmup_state, warmup_state)
                    forward_fn(modes.PIECEWISE)
                    continue
                forward_fn, capture_state = create_forward_fn(desc, warmup=False)  # fresh attention state
                states[desc] = vllm.AttentionStatePair(warmup_state, capture_state)
                if desc in manager.graphs:
                    raise FoundryError("a V2 full graph was captured twice", field="vllm.graphs",
                                       found=graph_name("FULL", desc))  # fmt: skip
                manager.graphs[desc] = _full_graph(manager, desc, forward_fn)
                vllm.compilation_counter.num_cudagraph_captured += 1
    manager._graphs_captured = True
    return states


def _full_graph(manager: Any, desc: Any, forward_fn: Any) -> Any:
    """One V2 full graph: the forward writes the manager's hidden states, whose address
    a LOAD must find where SAVE's was."""
    vllm = _vllm()
    inputs = graph_inputs((), {"hidden_states": getattr(manager, "hidden_states", None)})

    def step() -> dict[str, Any]:
        forward_fn(vllm.CUDAGraphMode.NONE)
        vllm.get_offloader().join_after_forward()
        return {OUT: None, INPUTS: inputs}

    vllm.get_offloader().sync_prev_onload()
    graph = _graph(graph_name("FULL", desc), step, desc.num_tokens, inputs)
    if _state is not None and _state.config.mode == "save":
        graph.outputs = None
    return graph
