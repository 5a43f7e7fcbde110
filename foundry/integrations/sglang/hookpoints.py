"""Where the SGLang plugin patches SGLang, and the versions that table was checked against.

Every entry names a function or method by its dotted path and the parameters it
had in the checked versions. ``tests/test_sglang_contract.py`` parses those
versions' sources (the published wheel, read with ``ast``: importing it needs
the GPU build of torch) and fails when a hook point is gone or its parameters
changed. The plugin refuses any other SGLang version before patching anything.
"""

from __future__ import annotations

from foundry.integrations.common import hookpoints
from foundry.integrations.common.hookpoints import HookPoint

__all__ = ["CHECKED_VERSIONS", "HOOK_POINTS", "TP_HOOK_POINTS", "HookPoint", "check_version"]

CHECKED_VERSIONS = ("0.5.17",)

_BACKEND = "sglang.srt.model_executor.runner_backend"
_BASE = "sglang.srt.model_executor.runner.base_cuda_graph_runner"
_DECODE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
_PREFILL = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
_KV = "sglang.srt.mem_cache.kv_cache_configurator"
_RUNNER = "sglang.srt.model_executor.model_runner"

HOOK_POINTS = (
    HookPoint("sglang.srt.managers.scheduler.Scheduler.__init__", "sglang.srt.managers.scheduler",
              ("self", "server_args", "port_args", "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank", "attn_cp_rank",
               "moe_dp_rank", "dp_rank"),
              "open the session in each scheduler process, its archive and server arguments checked",
              "BEFORE", "_on_scheduler_start"),
    HookPoint(f"{_RUNNER}.ModelRunner.init_torch_distributed", _RUNNER, ("self",),
              "start the session once the model runner's set_device made CUDA's context, before its first "
              "CUDA allocation", "BEFORE", "_on_device_set"),
    HookPoint(f"{_RUNNER}.ModelRunner.load_model", _RUNNER, ("self",),
              "compare each model runner's configuration (the target's, a draft model's) with SAVE's before its "
              "weights are allocated", "BEFORE", "_on_model_load"),
    HookPoint(f"{_KV}.KVCacheConfigurator._profile_available_bytes", _KV, ("self", "pre_model_load_memory"),
              "SAVE records the KV budget it profiled; LOAD uses that budget instead of profiling again",
              "AROUND", "_kv_budget"),
    HookPoint(f"{_KV}.KVCacheConfigurator._handle_max_mamba_cache", _KV, ("self", "total_rest_memory"),
              "hybrid models: SAVE records the linear-attention state pool's size it derived from free memory; "
              "LOAD sizes the pool as SAVE did", "AROUND", "_mamba_pool"),
    HookPoint(f"{_BACKEND}.full_cuda_graph_backend.FullCudaGraphBackend.__init__",
              f"{_BACKEND}.full_cuda_graph_backend", ("self", "cuda_graph_runner"),
              "note which graph runner (decode, target_verify, draft_decode, ...) and model runner a backend "
              "captures for; refuse runners the plugin does not persist", "AFTER", "_note_runner"),
    HookPoint(f"{_BACKEND}.full_cuda_graph_backend.FullCudaGraphBackend.capture_one",
              f"{_BACKEND}.full_cuda_graph_backend",
              ("self", "shape_key", "forward_fn", "capture_inputs", "post_warmup_hook"),
              "SAVE captures through the session; LOAD installs the restored graph instead", "AROUND", "_capture_one"),
    HookPoint(f"{_BACKEND}.breakable_cuda_graph_backend.BreakableCudaGraphBackend.capture_one",
              f"{_BACKEND}.breakable_cuda_graph_backend",
              ("self", "shape_key", "forward_fn", "capture_inputs", "post_warmup_hook"),
              "breakable graphs are not persisted: passed through, and the log says so", "AROUND", "_pass_through"),
    HookPoint(f"{_DECODE}.freeze_gc", _DECODE, ("enable_cudagraph_gc",),
              "a LOAD that restores the warm-ups' bytes freezes the collector around the decode capture loop "
              "without the two full collections SGLang runs there (nothing of such a LOAD follows SAVE's trace)",
              "AROUND", "_freeze_gc", defined_in=_BASE),
    HookPoint(f"{_PREFILL}.freeze_gc", _PREFILL, ("enable_cudagraph_gc",),
              "the same around the prefill capture loop", "AROUND", "_freeze_gc", defined_in=_BASE),
    HookPoint("sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs", "sglang.srt.managers.scheduler",
              ("self",),
              "after every model runner's graphs (the target's, then a draft model's): SAVE writes the archive, "
              "LOAD checks every archived graph was restored", "AFTER", "_on_graphs_done"),
)  # fmt: skip


_CAR = "sglang.srt.distributed.device_communicators.custom_all_reduce_v2"

# Patched only in a scheduler of a server with tp_size above 1 (importing the custom
# all-reduce's module pulls in its JIT kernels' bindings, which a single GPU never uses).
TP_HOOK_POINTS = (
    HookPoint(f"{_CAR}._allocate_symmetric_memory", _CAR, ("nbytes", "device", "group"),
              "note the rendezvous handle of the custom all-reduce's workspace: every rank's slab, as this "
              "process maps it", "AROUND", "_ca_workspace"),
    HookPoint(f"{_CAR}.CustomAllReduceV2.__init__", _CAR, ("self", "group", "device", "max_size"),
              "note the TP group's custom all-reduce (a second one is refused)", "AFTER", "_ca_made"),
    HookPoint(f"{_CAR}.CustomAllReduceV2._register_graph_inputs", _CAR, ("self",),
              "SAVE notes the graph inputs SGLang registers after its capture loop; LOAD hands it SAVE's to "
              "register again; both through SGLang's cudaIpc path", "AROUND", "_ca_register",
              body_sha256="26191a835566e31338545637710faada0e53f929f7b2e9242bcb7066b7e39e9f"),
)  # fmt: skip


def check_version(version: str) -> None:
    """Refuse an SGLang version the hook points were not checked against."""
    hookpoints.check_version("sglang", version, CHECKED_VERSIONS)
