"""What of an SGLang server must match between SAVE and LOAD.

A restored graph reads memory at the addresses SAVE's server allocated, with
kernels its configuration chose: the model, the arguments that size memory
(KV pool, request slots, graph batch sizes) and the ones that choose kernels
(attention and sampling backends, dtypes). SAVE records them in the archive's
catalog (``model``), each as ``sglang.<argument>``; LOAD refuses the first that
differs, by name, before anything is restored
(:func:`foundry.integrations.common.drift.check_fields`).
"""

from __future__ import annotations

import json
from typing import Any

from foundry.integrations.common.drift import check_fields, config_digest

SERVER_ARGS = (
    "model_path", "revision", "load_format", "dtype", "quantization", "kv_cache_dtype", "context_length",
    "page_size", "mem_fraction_static", "max_total_tokens", "max_running_requests", "chunked_prefill_size",
    "max_prefill_tokens", "attention_backend", "decode_attention_backend", "prefill_attention_backend",
    "sampling_backend", "tp_size", "pp_size", "dp_size", "ep_size", "disable_radix_cache",
    "disable_cuda_graph", "disable_prefill_cuda_graph", "disable_decode_cuda_graph", "cuda_graph_config",
    "cuda_graph_backend_decode", "cuda_graph_backend_prefill", "cuda_graph_max_bs_decode", "cuda_graph_bs_decode",
    "cuda_graph_max_bs_prefill", "cuda_graph_bs_prefill", "triton_attention_num_kv_splits", "enable_memory_saver",
    "enable_torch_compile", "speculative_algorithm", "enable_lora", "enable_pdmux", "skip_tokenizer_init",
    "disable_overlap_schedule",
    # speculative decoding: the draft model, its steps, tree and kernels
    "speculative_draft_model_path", "speculative_draft_model_revision", "speculative_draft_load_format",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_accept_threshold_single", "speculative_accept_threshold_acc", "speculative_use_rejection_sampling",
    "speculative_token_map", "speculative_attention_mode", "speculative_draft_attention_backend",
    "speculative_moe_runner_backend", "speculative_draft_model_quantization", "enable_multi_layer_eagle",
    "speculative_adaptive", "speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth",
    "speculative_ngram_match_type", "speculative_ngram_max_trie_depth", "speculative_ngram_capacity",
    # hybrid models: the linear-attention state pool and the kernels that read it
    "max_mamba_cache_size", "mamba_ssm_dtype", "mamba_full_memory_ratio", "mamba_radix_cache_strategy",
    "mamba_track_interval", "mamba_backend", "linear_attn_backend", "linear_attn_decode_backend",
    "linear_attn_prefill_backend", "linear_attn_verify_backend", "enable_linear_replayssm",
    "linear_replayssm_cache_len", "enable_linear_replayssm_spec",
)  # fmt: skip
# cuda_graph_config is the resolved per-phase configuration after ServerArgs.__post_init__
# (its JSON overrides the per-phase flags); compared through its repr. random_seed is not
# compared: it changes no graph (only dummy weights' values).

#: LOAD's refusal of a server whose record differs from SAVE's (shared with the vLLM plugin).
check_server_args = check_fields


def server_fingerprint(server_args: Any, version: str) -> dict[str, str]:
    """``sglang.<argument>`` -> its value as JSON text, for every argument in
    :data:`SERVER_ARGS` (absent ones as ``null``), plus the SGLang version."""
    record = {f"sglang.{name}": json.dumps(getattr(server_args, name, None), default=str) for name in SERVER_ARGS}
    record["sglang.version"] = version
    return record


def model_config_digest(model_runner: Any) -> str:
    """sha256 of the model's configuration as the server loaded it."""
    return config_digest(getattr(getattr(model_runner, "model_config", None), "hf_config", None))
