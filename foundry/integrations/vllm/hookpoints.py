"""Where the vLLM plugin patches vLLM, and the versions that table was checked against.

vLLM 0.25.1 runs a dense model on Model Runner V2 (``vllm/v1/worker/gpu/``) and a
MoE model (Qwen3-MoE, ...) on the V1 runner (``vllm/v1/worker/gpu_model_runner.py``);
``VllmConfig.use_v2_model_runner`` chooses, and a ``Worker``
(``vllm/v1/worker/gpu_worker.py``) drives either. With the default
``cudagraph_mode`` ``FULL_AND_PIECEWISE`` both capture, for each capture size
(by default 1, 2, 4, then every 8 to 248 and every 16 from 256 up to
min(2 x max_num_seqs, 512): 51 sizes on an H200), piecewise graphs (one per piece
of the ``torch.compile``d model between attention calls, each a
``CUDAGraphWrapper`` in ``vllm/compilation/cuda_graph.py``) and full graphs for
uniform decode batches. Where the full graphs are made differs:

- V1: ``GPUModelRunner.load_model`` wraps the whole model in a ``CUDAGraphWrapper``
  of mode ``FULL``; ``capture_model`` -> ``_capture_cudagraphs`` ->
  ``_warmup_and_capture`` -> ``_dummy_run`` reaches it, and the pieces' wrappers,
  with the batch descriptor in the forward context. V1 also captures a few graphs
  to estimate their memory (``profile_cudagraph_memory``), into a pool of its own.
- V2: ``CudaGraphManager.capture`` (``vllm/v1/worker/gpu/cudagraph_utils.py``)
  runs the piecewise pass through the same wrappers, then captures each full
  graph itself into ``manager.graphs[desc]``, replayed by ``run_fullgraph``.

Both capture into one pool, ``current_platform.get_global_graph_pool()``; under
the plugin every graph is captured into the session's pool instead, which is
equally shared. Each entry names a function by its dotted path, the parameters
it had in the checked versions, and, where the plugin's handler stands in for
vLLM's own body (the wrapper's capture, V2's capture loop), the sha256 of that
body's source. ``tests/test_vllm_contract.py`` parses the release's sources (its
sdist) and fails when a point, its parameters or such a body changed. The plugin
refuses any other vLLM version before patching anything.
"""

from __future__ import annotations

from foundry.integrations.common import hookpoints
from foundry.integrations.common.hookpoints import HookPoint

__all__ = ["CHECKED_VERSIONS", "HOOK_POINTS", "HookPoint", "check_version"]

CHECKED_VERSIONS = ("0.25.1",)

_WORKER = "vllm.v1.worker.gpu_worker"
_V1 = "vllm.v1.worker.gpu_model_runner"
_V2 = "vllm.v1.worker.gpu.model_runner"
_V2_GRAPHS = "vllm.v1.worker.gpu.cudagraph_utils"
_WRAPPER = "vllm.compilation.cuda_graph"

HOOK_POINTS = (
    HookPoint(f"{_WORKER}.Worker.init_device", _WORKER, ("self",),
              "both runners: start the session in the worker before its first CUDA allocation; LOAD compares the "
              "configuration with SAVE's, by field", "BEFORE", "_on_worker_start"),
    HookPoint(f"{_WORKER}.Worker.determine_available_memory", _WORKER, ("self",),
              "both runners: SAVE records the KV budget vLLM profiled; LOAD uses that budget", "AROUND", "_kv_budget"),
    HookPoint(f"{_V1}.GPUModelRunner.profile_cudagraph_memory", _V1, ("self",),
              "V1: the graphs captured to estimate graph memory are vLLM's own, passed through at SAVE and LOAD alike",
              "AROUND", "_profile_graph_memory"),
    HookPoint(f"{_V1}.GPUModelRunner.capture_model", _V1, ("self",),
              "V1: the graph phase; after it SAVE writes the archive, LOAD checks every graph was restored",
              "AROUND", "_capture_model"),
    HookPoint(f"{_V2}.GPUModelRunner.capture_model", _V2, ("self",),
              "V2: the graph phase; after it SAVE writes the archive, LOAD checks every graph was restored",
              "AROUND", "_capture_model"),
    HookPoint(f"{_WRAPPER}.CUDAGraphWrapper.__call__", _WRAPPER, ("self",),
              "both runners' piecewise graphs and V1's full graphs: SAVE captures through the session, LOAD installs "
              "the restored graph in concrete_cudagraph_entries", "AROUND", "_wrapper_call",
              body_sha256="70f6e5819d6a93a70aaa0f8cc809986a2e61b5ae04f75ec22daddeb9cbaf91ad"),
    HookPoint(f"{_V2_GRAPHS}.CudaGraphManager.capture", _V2_GRAPHS, ("self", "create_forward_fn", "progress_bar_desc"),
              "V2's capture loop, its full graphs through the session into manager.graphs", "AROUND",
              "_manager_capture", body_sha256="0ed82b01798cf5f259b33b42340d7051bc5a43982234dbf774b3ddacc51a488e"),
)  # fmt: skip


def check_version(version: str) -> None:
    """Refuse a vLLM version the hook points were not checked against."""
    hookpoints.check_version("vllm", version, CHECKED_VERSIONS)
