"""The plugin SGLang loads: hooks that SAVE or LOAD a scheduler's CUDA graphs.

SGLang calls :func:`register` once in its main process and once in every
scheduler process it spawns. SGLang logs and swallows a plugin's exceptions, so
a plugin that cannot run stops the process itself (``SystemExit`` with the
reason); inside the hooks a Foundry error propagates and the scheduler fails
to start. In a scheduler:

1. ``Scheduler.__init__`` (before): open the SAVE or LOAD session; LOAD compares the
   server arguments that shape memory with SAVE's, by name. Nothing of CUDA's yet.
   ``ModelRunner.init_torch_distributed`` (before; the target's runner, right after its
   ``set_device`` made CUDA's context): start the session, reserving the deterministic
   region before the first CUDA allocation; report the rank active.
2. ``ModelRunner.load_model`` (before): each model runner's configuration (the
   target's, and under speculative decoding the draft model's) is recorded at
   SAVE and compared at LOAD before its weights are allocated.
3. ``KVCacheConfigurator._profile_available_bytes``: SAVE records the KV budget it
   profiled; LOAD takes that budget (refusing when less memory is free), so the
   KV pool and every later allocation land where they did at SAVE. For hybrid
   models ``_handle_max_mamba_cache``, called inside it, sizes the
   linear-attention state pool: SAVE records that size, LOAD takes it.
4. ``FullCudaGraphBackend.__init__`` (after): the graph runner the backend
   captures for (:mod:`foundry.integrations.sglang.runners`) and its model runner.
5. ``FullCudaGraphBackend.capture_one``: SGLang's two warm-up forwards run as
   always (SAVE records torch's allocations from the first on); then SAVE
   captures through the session, LOAD installs the restored graph and its
   outputs where SGLang keeps them. A LOAD with ``--warmup restore`` skips the
   forwards and restores the region's bytes as SAVE left them, where SAVE found
   that safe (:mod:`foundry.integrations.sglang.warmup_skip`). Breakable graphs
   are passed through: SGLang captures them itself in SAVE and LOAD, the hook
   told so, and the log says so.
6. ``Scheduler.init_all_cuda_graphs`` (after): every model runner has captured
   (the target's graphs, then the draft model's); SAVE judges whether a LOAD may
   skip the warm-ups and writes the one archive; LOAD checks that every archived
   graph of every graph runner was restored and nothing was captured.

At ``--tp-size`` above 1 each scheduler is one rank and also patches
``TP_HOOK_POINTS`` (:mod:`foundry.integrations.sglang.tensor_parallel`): NCCL and
SGLang's custom all-reduce are attached as they are at the graph phase's start, and
the custom all-reduce completed once SGLang has registered its graphs' inputs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.metadata
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from foundry.env import SAVE_FIRST_RUN, SAVE_ID, SGLANG_GC, SGLANG_REPORT
from foundry.errors import DriftError, FoundryError
from foundry.integrations.common import patching, startup
from foundry.integrations.common import session as shared
from foundry.integrations.common.session import say as _say
from foundry.integrations.sglang import tensor_parallel
from foundry.integrations.sglang.config import PluginConfig, load_config
from foundry.integrations.sglang.hookpoints import HOOK_POINTS, TP_HOOK_POINTS, check_version
from foundry.integrations.sglang.runners import graph_name, phase_of, role_of
from foundry.integrations.sglang.server_args import check_server_args, model_config_digest, server_fingerprint
from foundry.integrations.sglang.speculative import check_speculative, model_runners
from foundry.integrations.sglang.warmup_skip import SAFE, VERDICT, decode_placed
from foundry.runtime.sessions.placement import BETWEEN

KV_BUDGET = "sglang.kv_budget_bytes"
MAMBA_POOL = "sglang.mamba_cache_size"  # hybrid models: slots of the linear-attention state pool
# each model runner's configuration digest, by role
MODEL_CONFIGS = {"target": "sglang.model_config_sha256", "draft": "sglang.draft_model_config_sha256"}
# prefill backends the plugin handles: full graphs are persisted, breakable ones passed through
# (SGLang captures them in SAVE and LOAD alike); tc_piecewise lives in torch.compile's caches
PREFILL_BACKENDS = ("disabled", "full", "breakable")


def _phase_seconds() -> dict[str, float]:
    return {"warmup_forwards_s": 0.0, "graphs_s": 0.0}


@dataclass
class RunnerGraphs:
    """One model runner's graphs in a scheduler (the target's, a draft model's): the
    names by graph runner phase, in capture order, and the seconds they took."""

    phases: dict[str, list[str]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=_phase_seconds)


@dataclass
class SchedulerState:
    """What the plugin holds in one scheduler process."""

    config: PluginConfig
    session: Any
    rank: int
    world_size: int = 1  # tp_size: one scheduler process a rank
    allreduce: tensor_parallel.CustomAllReduceNotes | None = None  # tp_size above 1: its custom all-reduce
    graphs: list[str] = field(default_factory=list)  # every graph, in capture order
    expected_runners: tuple[str, ...] = ("target",)  # the model runners this server's scheduler holds
    runners: dict[str, RunnerGraphs] = field(default_factory=dict)  # by model runner role, as they capture
    configs: dict[str, str] = field(default_factory=dict)  # model runner role -> its configuration's digest
    passed_through: set[str] = field(default_factory=set)
    hybrid: bool = False  # the model has a linear-attention state pool (its size is pinned)
    graph_phase: bool = False  # the first shape's warm-up has begun
    recording_error: str | None = None  # SAVE: why torch's allocation history is not recorded
    finished: bool = False
    # seconds in SGLang's eager warm-up forwards, in capturing (SAVE) or restoring (LOAD), and in
    # every Foundry call on the scheduler's path (session opening and start, graphs, finish with its
    # waits); the session's opening, start and finish alone as session_open_s, session_start_s and
    # session_finish_s; capture_loop_s, inside SGLang's capture loops (their collections included)
    seconds: dict[str, float] = field(default_factory=lambda: {**_phase_seconds(), "foundry_s": 0.0,
                                                               "capture_loop_s": 0.0})  # fmt: skip
    started: bool = False  # the session started (at the target model runner's init_torch_distributed)
    prefetch: Any = None  # LOAD: Triton's cache key computed on a thread (startup.Prefetch)
    skipped_collections: bool = False  # LOAD: SGLang's collections around the capture loop were left out
    collected_before_loop: bool = False  # SGLang's collection before the capture loop ran (kept, or SGLang's own)
    # LOAD restoring the warm-ups: the blocks SAVE's graphs read that the capture loop allocated
    # (warmup_skip), and whether it makes allocations of SAVE's trace again (then it collects as SAVE did)
    placed: list[tuple[int, int]] = field(default_factory=list)
    follows_trace: bool = False


_state: SchedulerState | None = None


def register() -> None:
    """SGLang's entry point (group ``sglang.srt.plugins``)."""
    try:
        config = load_config()
        if config.mode == "off":
            return
        check_version(installed_version())
        if not config.from_launcher:
            _prepare_children(config)
        _install()
    except FoundryError as err:
        raise SystemExit(f"foundry: the SGLang plugin cannot run: {err}") from None


def installed_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise FoundryError("SGLang is not installed in this environment", field="sglang.version") from None


def _prepare_children(config: PluginConfig) -> None:
    """Without `foundry run`: preload the hook into the schedulers SGLang spawns and
    describe the session to them (spawned processes inherit this environment)."""
    shared.prepare_children(config)


def _install() -> None:
    """Patch every hook point now, in this process (:func:`patching.install`: all or none).
    Not through SGLang's ``HookRegistry``: its ``apply_hooks`` walks the namespace of every
    module loaded for each target it patches (to replace ``from X import f`` copies): a
    walk over torch's and SGLang's modules per point, in each process, on the path to the
    scheduler.
    The table names each module whose copy of a function the plugin replaces."""
    patching.install(HOOK_POINTS, sys.modules[__name__], "sglang")


def _check_patched() -> None:
    """Every hook point in place before the session starts (a second plugin could have
    replaced one)."""
    patching.check_patched(HOOK_POINTS, "sglang")


def _argument(args: tuple, kwargs: dict, index: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else args[index] if len(args) > index else None


# -- hooks ---------------------------------------------------------------------------


def _who() -> str:
    return "scheduler" if _state is None else f"scheduler (tp rank {_state.rank}) {_state.config.mode}"


# A hook's Foundry error stops the scheduler (SGLang logs it with a traceback and shuts the
# server down); the log also gets one line that says what was refused (drift) or what failed.
_says_refusals = shared.says_refusals(_who)


@_says_refusals
def _on_scheduler_start(*args: Any, **kwargs: Any) -> None:
    global _state
    begun = time.perf_counter()
    config = load_config()
    if config.mode == "off":
        return
    _check_patched()
    server_args = _argument(args, kwargs, 1, "server_args")
    device = _argument(args, kwargs, 3, "gpu_id") or 0
    rank = _argument(args, kwargs, 4, "tp_rank") or 0
    _check_supported(server_args)
    world_size = int(getattr(server_args, "tp_size", 1) or 1)
    if world_size > 1:
        _prepare_tensor_parallel(config)
    live = server_fingerprint(server_args, installed_version())

    def check_archive(archive: Any, options: dict[str, Any]) -> None:
        if options["warmup"] == "restore":
            check_warmup_skip(archive.catalog.model)

    # SAVE keeps the region's bytes to the end of the graph phase: what a LOAD skipping the warm-ups restores
    saving = {"world_size": world_size} if config.mode == "save" else {}
    opened = shared.open_session(config, device=device, rank=rank, live=live, check_archive=check_archive,
                                 warmup_bytes_until="finish", **saving)  # fmt: skip
    _state = SchedulerState(config, opened, rank, world_size, expected_runners=model_runners(server_args))
    if world_size > 1:
        _state.allreduce = tensor_parallel.CustomAllReduceNotes()
        if config.mode == "load":
            _state.allreduce.recorded = next((state.record for backend, state in opened.backends
                                              if backend.name == tensor_parallel.CUSTOM_ALLREDUCE), None)  # fmt: skip
    if config.mode == "load" and config.warmup == "restore":
        _state.placed = decode_placed(opened.archive.catalog.model)
        region = opened.archive.session(rank).region
        _state.follows_trace = bool(_state.placed) or any(a.phase == BETWEEN for a in (region.trace if region else ()))
    if config.mode == "load":  # Triton's cache key, which the graph phase's first Triton launch would compute
        _state.prefetch = startup.prefetch_triton_key()
    _state.seconds["session_open_s"] = time.perf_counter() - begun
    _state.seconds["foundry_s"] += time.perf_counter() - begun


@_says_refusals
def _on_device_set(*args: Any, **kwargs: Any) -> None:
    """Start the session where SGLang's model runner has made CUDA's context current (its
    ``set_device``) and before it allocates: SGLang initialises CUDA as it would without
    Foundry, and the session's start finds the context made. Refused when anything was
    allocated in the region before (the trace would begin without it)."""
    if _state is None or _state.started:  # a draft model's runner: the session started with the target's
        return
    begun = time.perf_counter()
    _state.session.start()
    _state.started = True
    if _state.placed:  # SGLang makes them again during its graph phase, after the warm-up bytes are copied
        _state.session.restore_again_at_finish(_state.placed)
    made = _state.session.hook.region().allocations
    if made:
        raise FoundryError("CUDA allocations were made in the scheduler before its model runner set the device; "
                           "the session would start after them", field="sglang.session_start", found=made)  # fmt: skip
    _state.seconds["session_start_s"] = time.perf_counter() - begun
    _state.seconds["foundry_s"] += time.perf_counter() - begun
    _say(f"scheduler (tp rank {_state.rank}) active: mode {_state.config.mode}, archive {_state.config.archive}")


@_says_refusals
def _freeze_gc(original: Any, enable_cudagraph_gc: bool) -> Any:
    """SGLang collects garbage fully before and after its capture loop (about 0.9 s in a
    server's scheduler). A LOAD that restores the warm-ups' bytes leaves the collection
    after the loop out: what it frees would only be free later. The one before stays
    where the capture loop makes SAVE's allocations again (a tensor left uncollected
    could move them); elsewhere nothing of the LOAD follows SAVE's allocation trace, so
    only SGLang's freeze is kept. ``FOUNDRY_SGLANG_GC=keep`` keeps SGLang's collections;
    ``skip-all`` leaves out the one before the loop too: the hook still compares every
    allocation with SAVE's trace and the placed blocks are checked before any replay, so
    an allocation that garbage moved refuses the LOAD by name instead of passing."""
    choice = SGLANG_GC.read()
    if _state is None:
        return original(enable_cudagraph_gc)
    if _state.config.mode != "load" or _state.config.warmup != "restore" or choice == "keep":
        _state.collected_before_loop = True  # SGLang's own, both collections
        return _timed_loop(original(enable_cudagraph_gc))
    _state.skipped_collections = True
    _state.collected_before_loop = _state.follows_trace and choice != "skip-all"
    return _timed_loop(_fewer_collections(collect_first=_state.collected_before_loop, freeze=not enable_cudagraph_gc))


@contextlib.contextmanager
def _timed_loop(loop: Any) -> Any:
    """``loop`` (the context around a capture loop), its seconds added to ``capture_loop_s``:
    what of SGLang's graph phase the loop took, its collections included; the rest of the
    phase is SGLang's set-up around it."""
    assert _state is not None
    begun = time.perf_counter()
    try:
        with loop:
            yield
    finally:
        _state.seconds["capture_loop_s"] += time.perf_counter() - begun


@contextlib.contextmanager
def _fewer_collections(*, collect_first: bool, freeze: bool) -> Any:
    """SGLang's ``freeze_gc`` without its collection after the loop, and without the one
    before unless ``collect_first``."""
    if collect_first:
        gc.collect()
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


def check_warmup_skip(model: dict[str, str]) -> None:
    """A LOAD that skips SGLang's warm-up forwards needs SAVE's verdict that it may."""
    found = model.get(VERDICT)
    if found != SAFE:
        raise DriftError("this archive does not allow a LOAD to skip SGLang's warm-up forwards (LOAD with "
                         "--warmup replay)", field=VERDICT, expected=SAFE, found=found)  # fmt: skip


def _prepare_tensor_parallel(config: PluginConfig) -> None:
    """A scheduler of a server with several TP ranks, before SGLang makes its communicators."""
    if config.mode == "save" and not SAVE_ID.read():
        raise FoundryError(f"a SAVE of several TP ranks needs {SAVE_ID.name}, the same in every scheduler (set it "
                           "in the server's environment)", field=SAVE_ID.name)  # fmt: skip
    if config.mode == "save" and SAVE_FIRST_RUN.read():  # one launcher drives every rank: no merged later run yet
        raise FoundryError("a SAVE of several TP ranks runs once (foundry run --save-runs 1)",
                           field=SAVE_FIRST_RUN.name)  # fmt: skip
    tensor_parallel.pin_nccl()
    patching.install(TP_HOOK_POINTS, sys.modules[__name__], "sglang")


def _check_supported(server_args: Any) -> None:
    """Refuse what the plugin cannot persist, by field, before anything is allocated."""
    sizes = {name: getattr(server_args, name, 1) or 1 for name in ("pp_size", "dp_size")}
    for name, size in sizes.items():
        if size != 1:
            raise FoundryError("the SGLang plugin persists tensor-parallel servers only (pp and dp size 1)",
                               field=f"sglang.{name}", expected=1, found=size)  # fmt: skip
    if getattr(server_args, "enable_dp_attention", False):
        raise FoundryError("data-parallel attention is not persisted", field="sglang.enable_dp_attention")
    if (getattr(server_args, "tp_size", 1) or 1) > 1:
        _check_collectives(server_args)
    if getattr(server_args, "enable_memory_saver", False):
        raise FoundryError("the memory saver moves graph memory; it cannot be used with Foundry",
                           field="sglang.enable_memory_saver")  # fmt: skip
    check_speculative(server_args)
    decode = _phase_backend(server_args, "decode")
    if decode not in ("full", "disabled"):
        raise FoundryError("decode graphs are persisted with the full backend only",
                           field="sglang.cuda_graph_backend_decode", expected=["full"], found=decode)  # fmt: skip
    prefill = _phase_backend(server_args, "prefill")
    if prefill not in PREFILL_BACKENDS:
        raise FoundryError("prefill graphs of this backend can be neither persisted nor passed through; set "
                           "cuda_graph_backend_prefill to disabled, full or breakable",
                           field="sglang.cuda_graph_backend_prefill", expected=list(PREFILL_BACKENDS),
                           found=prefill)  # fmt: skip


def _check_collectives(server_args: Any) -> None:
    """At tp above 1: only NCCL and SGLang's custom all-reduce have backends; the other
    collectives SGLang can use keep peer buffers nothing relocates."""
    fusion = getattr(server_args, "flashinfer_allreduce_fusion_backend", None)
    if fusion is not None:  # SGLang turns it on by itself for some MoE models on sm90 and sm100
        raise FoundryError("FlashInfer's fused all-reduce keeps peer buffers that no Foundry backend relocates; "
                           "start SGLang with --enforce-disable-flashinfer-allreduce-fusion",
                           field="sglang.flashinfer_allreduce_fusion_backend", expected=None, found=fusion)  # fmt: skip
    for name in ("enable_symm_mem", "enable_torch_symm_mem", "enable_mscclpp"):
        if getattr(server_args, name, False):
            raise FoundryError("this all-reduce keeps peer buffers that the SGLang plugin does not relocate",
                               field=f"sglang.{name}", expected=False, found=True)  # fmt: skip


def _phase_backend(server_args: Any, phase: str) -> str:
    """The graph backend ServerArgs resolved for ``phase`` (decode or prefill). Its
    ``cuda_graph_config`` already folds the JSON config, the per-phase flags and the
    disable switches together; the flags are read only when it is absent."""
    resolved = getattr(getattr(server_args, "cuda_graph_config", None), phase, None)
    backend = getattr(resolved, "backend", None)
    if backend is None:
        if getattr(server_args, f"disable_{phase}_cuda_graph", False) or getattr(server_args, "disable_cuda_graph",
                                                                                    False):  # fmt: skip
            return "disabled"
        backend = getattr(server_args, f"cuda_graph_backend_{phase}", None)
    return str(getattr(backend, "value", backend))


@_says_refusals
def _on_model_load(model_runner: Any, *args: Any, **kwargs: Any) -> None:
    """A model runner's configuration, before its weights are allocated: SAVE records
    its digest, LOAD refuses one that differs from SAVE's (by role: target or draft)."""
    if _state is None:
        return
    role = role_of(model_runner)
    if role in _state.configs:
        raise FoundryError(f"a second {role} model runner; the plugin persists one target and one draft per "
                           "scheduler", field="sglang.model_runners", found=role)  # fmt: skip
    digest = model_config_digest(model_runner)
    key = MODEL_CONFIGS[role]
    if _state.config.mode == "save":
        _state.session.model[key] = digest
    else:
        check_server_args(_state.session.archive.catalog.model, {key: digest})
    _state.configs[role] = digest


@_says_refusals
def _kv_budget(original: Any, configurator: Any, *args: Any, **kwargs: Any) -> int:
    profiled = original(configurator, *args, **kwargs)
    if _state is None:
        return profiled
    return shared.pinned_budget(_state.session, _state.config.mode, profiled, KV_BUDGET, "SGLang")


@_says_refusals
def _mamba_pool(original: Any, configurator: Any, *args: Any, **kwargs: Any) -> Any:
    """Hybrid models: SGLang sizes the linear-attention state pool (``max_mamba_cache_size``
    slots) from free memory unless told; SAVE records the size, LOAD takes SAVE's (refusing
    when it derived fewer slots: less memory is free). The bytes this returns feed the KV
    budget, which :func:`_kv_budget` pins as a whole."""
    rest = original(configurator, *args, **kwargs)
    if _state is None:
        return rest
    from sglang.srt.runtime_context import get_context, get_schedule

    _state.hybrid = True
    derived = int(get_schedule().max_mamba_cache_size)
    pinned = shared.pinned_budget(_state.session, _state.config.mode, derived, MAMBA_POOL, "SGLang",
                                  what="the linear-attention state pool")  # fmt: skip
    if pinned != derived:
        get_context().override("foundry.pinned_mamba_pool", max_mamba_cache_size=pinned)
    return rest


@_says_refusals
def _note_runner(result: Any, backend: Any, cuda_graph_runner: Any = None, *args: Any, **kwargs: Any) -> None:
    if _state is None:
        return
    backend._foundry_runner = phase_of(cuda_graph_runner)  # refuses a graph runner the plugin does not persist
    backend._foundry_role = role_of(getattr(cuda_graph_runner, "model_runner", None))


@_says_refusals
def _capture_one(original: Any, backend: Any, shape_key: Any, forward_fn: Any, capture_inputs: Any = None,
                 post_warmup_hook: Any = None) -> None:  # fmt: skip
    if _state is None:
        return original(backend, shape_key, forward_fn, capture_inputs, post_warmup_hook)
    runner = getattr(backend, "_foundry_runner", None)
    role = getattr(backend, "_foundry_role", "target")
    name = _next_graph(runner, shape_key)
    backend._device_module.synchronize()  # work queued before this shape is not its warm-up's
    if not _state.graph_phase:
        _begin_graph_phase()
    started = time.perf_counter()

    def warm_up() -> None:  # SGLang's own warm-ups, so that SAVE and LOAD allocate alike
        for _ in range(2):
            backend._device_module.synchronize()
            backend._tp_group.barrier()
            forward_fn()
            if post_warmup_hook is not None:
                post_warmup_hook()

    _state.session.warmup(warm_up)  # a LOAD restoring the warm-up's bytes skips it
    backend._device_module.synchronize()
    warmed = time.perf_counter()
    graph = _state.session.graph(name, forward_fn, shape_key=getattr(shape_key, "size", None), runner=runner)
    done = time.perf_counter()
    graphs = _state.runners.setdefault(role, RunnerGraphs())
    for seconds in (_state.seconds, graphs.seconds):
        seconds["warmup_forwards_s"] += warmed - started
        seconds["graphs_s"] += done - warmed
    _state.seconds["foundry_s"] += done - warmed
    backend._graphs[shape_key] = graph
    backend._outputs[shape_key] = graph.outputs
    _state.graphs.append(name)
    graphs.phases.setdefault(runner, []).append(name)
    if _state.config.mode == "load":
        graph.first_replay = functools.partial(_note_replay, name)


def _next_graph(runner: str | None, shape_key: Any) -> str:
    """The archive name of the shape about to be captured, refused when the graph phase
    is over or the name is taken (two runners, or one capturing a shape twice)."""
    assert _state is not None
    if runner is None:  # the backend was built without the plugin's note (a hook not in place)
        raise FoundryError("a graph backend whose graph runner is unknown", field="sglang.graph_runner")
    name = graph_name(runner, shape_key)
    if _state.finished:
        raise FoundryError("a graph captured after the scheduler's graph phase ended (captured again?)",
                           field="sglang.graphs", found=name)  # fmt: skip
    if name in _state.graphs:
        raise FoundryError("two graphs of one name in one scheduler", field="sglang.graphs", found=name)
    return name


def _note_replay(name: str) -> None:
    """A restored graph's first replay, appended to the report's path + ``.replays``
    (SGLang replays after the report is written): the proof that the server ran it."""
    shared.note_replay(SGLANG_REPORT.read(), name)


def _begin_graph_phase() -> None:
    """SAVE records torch's allocations from here on (see warmup_skip)."""
    from foundry.integrations.sglang import warmup_skip

    assert _state is not None
    _state.graph_phase = True
    if _state.config.mode == "save":
        _state.recording_error = warmup_skip.start_recording()
    if _state.world_size > 1:  # the communicators exist by now; attached before the first graph
        tensor_parallel.attach_nccl(_state.session, _state.rank, _state.world_size)
        if _state.allreduce is not None:
            tensor_parallel.raise_refusal(_state.allreduce)
        if _state.allreduce is not None and _state.allreduce.communicator is not None:
            facts = tensor_parallel.communicator_facts(_state.allreduce, complete=False)
            _state.session.attach(tensor_parallel.CUSTOM_ALLREDUCE, **facts)


@_says_refusals
def _pass_through(original: Any, backend: Any, *args: Any, **kwargs: Any) -> Any:
    """Breakable graphs are SGLang's own: captured as usual in SAVE and in LOAD, with the
    hook told so (they end no warm-up and a LOAD does not refuse them)."""
    if _state is None:
        return original(backend, *args, **kwargs)
    runner = getattr(backend, "_foundry_runner", "prefill")
    if runner not in _state.passed_through:
        _state.passed_through.add(runner)
        _say(f"breakable {runner} graphs are not persisted; SGLang captures them as usual")
    with _state.session.hook.passthrough():
        return original(backend, *args, **kwargs)


@_says_refusals
def _on_graphs_done(result: Any, *args: Any, **kwargs: Any) -> None:
    if _state is None:
        return result
    if _state.finished:
        raise FoundryError("the scheduler's graph phase ended twice", field="sglang.graphs")
    _check_model_runners()
    _state.finished = True
    begun = time.perf_counter()
    if _state.config.mode == "save" and _state.graph_phase:
        judged = _judge_warmup_skip(_state.session)
        _state.session.model.update(judged)
        _state.session.keep_warmup_bytes = judged[VERDICT] == SAFE  # what only a LOAD skipping the warm-ups restores
    elif _state.placed:  # before the first replay: the blocks the graphs read where SAVE had them
        _check_placed()
    notes = _state.allreduce
    if notes is not None:  # also where no graph phase began (graphs off)
        tensor_parallel.raise_refusal(notes)
    if _state.graph_phase and notes is not None and notes.communicator is not None:  # its table, filled by now
        facts = tensor_parallel.communicator_facts(notes, complete=True)
        _state.session.complete(tensor_parallel.CUSTOM_ALLREDUCE, **facts)
    report = _state.session.finish()
    _state.seconds["session_finish_s"] = time.perf_counter() - begun
    if _state.config.mode == "load":
        _check_restored(report)
    report["sglang_graphs"] = list(_state.graphs)
    report["sglang_model_runners"] = {role: {"graph_runners": graphs.phases, "seconds": graphs.seconds}
                                      for role, graphs in _state.runners.items()}  # fmt: skip
    report[VERDICT] = (_state.session.model if _state.config.mode == "save"
                       else _state.session.archive.catalog.model).get(VERDICT)  # fmt: skip
    _state.seconds["foundry_s"] += time.perf_counter() - begun
    report["sglang_seconds"] = dict(_state.seconds)
    report["sglang_startup"] = _startup_report()
    counters = report.get("counters", {})
    by_runner = ", ".join(f"{phase} {len(names)}" for graphs in _state.runners.values()
                          for phase, names in graphs.phases.items())  # fmt: skip
    _say(f"scheduler (tp rank {_state.rank}) {_state.config.mode}: {len(_state.graphs)} graphs "
         f"{'saved' if _state.config.mode == 'save' else 'restored'}{f' ({by_runner})' if by_runner else ''}, "
         f"{counters.get('stream_captures', 0)} stream captures, "
         f"{counters.get('passthrough_captures', 0)} passed through")  # fmt: skip
    shared.write_report(SGLANG_REPORT.read(), report)
    return result


@_says_refusals
def _ca_workspace(original: Any, *args: Any, **kwargs: Any) -> Any:
    if _state is None or _state.allreduce is None:
        return original(*args, **kwargs)
    with tensor_parallel.keeping_refusal(_state.allreduce):
        tensor, handle = original(*args, **kwargs)
    _state.allreduce.handles[id(tensor)] = handle
    return tensor, handle


@_says_refusals
def _ca_made(result: Any, ca: Any, *args: Any, **kwargs: Any) -> None:
    if _state is not None and _state.allreduce is not None:
        with tensor_parallel.keeping_refusal(_state.allreduce):
            tensor_parallel.note_communicator(_state.allreduce, ca)


@_says_refusals
def _ca_register(original: Any, ca: Any) -> None:
    if _state is None or _state.allreduce is None:
        return original(ca)
    tensor_parallel.register_inputs(_state.allreduce, ca, _state.config.mode)
    return None


def _startup_report() -> dict[str, Any]:
    """What this scheduler moved off SGLang's graph phase (see _freeze_gc and common.startup)."""
    assert _state is not None
    prefetch = _state.prefetch
    key = None if prefetch is None else {"seconds": prefetch.seconds(), "error": prefetch.error}
    return {"skipped_collections": _state.skipped_collections, "collected_before_loop": _state.collected_before_loop,
            "triton_key": key}  # fmt: skip


def _check_model_runners() -> None:
    """Every model runner the server holds had its configuration compared (a hook that
    was not reached would let a draft model change unnoticed)."""
    assert _state is not None
    unseen = [role for role in _state.expected_runners if role not in _state.configs]
    if unseen:
        raise FoundryError("a model runner's configuration was never compared with SAVE's",
                           field="sglang.model_runners", expected=list(_state.expected_runners),
                           found=sorted(_state.configs))  # fmt: skip


def _judge_warmup_skip(session: Any) -> dict[str, str]:
    """SAVE's verdict on a LOAD that skips SGLang's warm-ups and the capture loop's blocks
    its graphs read (see warmup_skip), as archive model entries; not judged for several
    model runners or a hybrid model's state pool."""
    from foundry.integrations.sglang import warmup_skip

    assert _state is not None
    irs = [ir for ir, _ in session.entries]
    pool = None if session.warmup_pool is None else tuple(session.warmup_pool.id)
    recorded = _state.recording_error or warmup_skip.stop_recording(session.device, pool)
    unjudged = warmup_skip.unjudged(_state.runners, _state.hybrid)
    if unjudged is not None:
        recorded = unjudged
    if isinstance(recorded, str):  # never recorded, unreadable or not judged: the verdict says why
        return {VERDICT: warmup_skip.verdict(irs, recorded)}
    blocks, segments = recorded
    info = session.hook.region()
    foreign = warmup_skip.foreign_allocations(session.hook.trace(), session.warmup_start[1], info.base, segments,
                                              session.warmups_between)  # fmt: skip
    judged = {VERDICT: warmup_skip.verdict(irs, blocks.warmup, foreign)}
    placed = warmup_skip.read_blocks(irs, blocks.program)
    if judged[VERDICT] == SAFE and placed:
        judged[warmup_skip.PLACED] = warmup_skip.encode_placed(placed, info.base)
    return judged


def _check_placed() -> None:
    """(``--warmup restore``) Each block SAVE's graphs read that SGLang's capture loop
    allocated is allocated again at SAVE's address, or the LOAD refuses naming it."""
    import torch

    from foundry.integrations.sglang import warmup_skip

    assert _state is not None
    begun = time.perf_counter()
    base = _state.session.hook.region().base
    warmup_skip.check_placed(_state.placed, base, torch.cuda.memory_snapshot())
    _state.seconds["placed_check_s"] = time.perf_counter() - begun


def _check_restored(report: dict[str, Any]) -> None:
    assert _state is not None
    shared.check_restored(_state.session, _state.graphs, report, "sglang.graphs")
