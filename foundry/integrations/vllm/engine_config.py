"""What of a vLLM engine's configuration must match between SAVE and LOAD, and what
the plugin cannot persist.

A restored graph reads memory at the addresses SAVE's worker allocated, with the
kernels its configuration chose: the model, the settings that size memory (KV
cache, sequences, batched tokens, capture sizes) and the ones that choose kernels
or the graph set (compilation, attention backend, dtypes). SAVE records each of
:data:`CONFIG_FIELDS` in the archive's catalog as ``vllm.<section>.<field>``; LOAD
refuses the first that differs, by name, before anything is allocated. The values
are those the worker sees, after vLLM resolved its defaults.
"""

from __future__ import annotations

from typing import Any

from foundry.errors import FoundryError
from foundry.integrations.common.drift import value_text

CONFIG_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model_config", ("model", "revision", "dtype", "max_model_len", "quantization", "enforce_eager", "runner",
                      "convert", "max_logprobs", "logprobs_mode", "disable_sliding_window", "disable_cascade_attn",
                      "enable_sleep_mode", "enable_cumem_allocator", "model_impl", "override_attention_dtype",
                      "hf_overrides", "enable_return_routed_experts")),
    ("cache_config", ("block_size", "gpu_memory_utilization", "cache_dtype", "num_gpu_blocks_override",
                      "enable_prefix_caching", "kv_cache_memory_bytes", "calculate_kv_scales",
                      "kv_sharing_fast_prefill")),
    ("scheduler_config", ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "enable_chunked_prefill",
                          "async_scheduling")),
    ("parallel_config", ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                         "prefill_context_parallel_size", "decode_context_parallel_size", "enable_expert_parallel",
                         "enable_dbo")),
    ("compilation_config", ("mode", "backend", "custom_ops", "splitting_ops", "compile_sizes",
                            "compile_ranges_endpoints", "cudagraph_mode", "cudagraph_num_of_warmups",
                            "cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_copy_inputs",
                            "cudagraph_specialize_lora", "use_inductor_graph_partition", "pass_config",
                            "inductor_compile_config", "dynamic_shapes_config", "cudagraph_mm_encoder")),
    ("attention_config", ("backend", "flash_attn_version", "use_prefill_decode_attention",
                          "flash_attn_max_num_splits_for_cuda_graph", "use_trtllm_attention")),
    ("load_config", ("load_format",)),
    ("", ("optimization_level", "performance_mode", "speculative_config", "lora_config", "kv_transfer_config")),
)  # fmt: skip
# model_config.seed is not compared: it changes no graph (only dummy weights' values).


def field_name(section: str, name: str) -> str:
    """The catalog's name for one setting: ``vllm.<section>.<field>`` (``vllm.<field>`` on VllmConfig)."""
    return f"vllm.{section}.{name}" if section else f"vllm.{name}"


def config_fingerprint(vllm_config: Any, version: str) -> dict[str, str]:
    """Every setting of :data:`CONFIG_FIELDS` as JSON text (absent ones as ``null``),
    and the vLLM version."""
    record = {}
    for section, names in CONFIG_FIELDS:
        owner = getattr(vllm_config, section, None) if section else vllm_config
        for name in names:
            record[field_name(section, name)] = value_text(getattr(owner, name, None))
    record["vllm.version"] = version
    return record


def check_supported(vllm_config: Any) -> None:
    """Refuse, by field, what the plugin cannot persist, before anything is allocated."""
    parallel = getattr(vllm_config, "parallel_config", None)
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                 "prefill_context_parallel_size", "decode_context_parallel_size"):  # fmt: skip
        size = getattr(parallel, name, 1) or 1
        if size != 1:
            raise FoundryError("the vLLM plugin persists single-GPU engines only (every parallel size 1)",
                               field=field_name("parallel_config", name), found=size)  # fmt: skip
    if getattr(parallel, "enable_dbo", False):
        raise FoundryError("micro-batching (dual batch overlap) captures graphs of its own; it is not persisted",
                           field=field_name("parallel_config", "enable_dbo"))  # fmt: skip
    model = getattr(vllm_config, "model_config", None)
    for name, why in (("enforce_eager", "an eager engine captures no graph"),
                      ("enable_sleep_mode", "sleep mode's allocator maps memory behind the region"),
                      ("enable_cumem_allocator", "vLLM's cumem allocator maps memory behind the region")):  # fmt: skip
        if getattr(model, name, False):
            raise FoundryError(f"{why}; it cannot be used with Foundry", field=field_name("model_config", name))
    for name, why in (("speculative_config", "speculative decoding (a drafter's graphs) is not persisted yet"),
                      ("lora_config", "LoRA (graphs per adapter count) is not persisted yet"),
                      ("kv_transfer_config", "KV transfer connectors are not persisted"),
                      ("ec_transfer_config", "encoder-cache transfer is not persisted")):  # fmt: skip
        if getattr(vllm_config, name, None) is not None:
            raise FoundryError(why, field=field_name("", name))
    compilation = getattr(vllm_config, "compilation_config", None)
    mode = getattr(getattr(compilation, "cudagraph_mode", None), "name", None)
    if mode in (None, "NONE"):
        raise FoundryError("this engine captures no CUDA graph (cudagraph_mode NONE)",
                           field=field_name("compilation_config", "cudagraph_mode"), found=mode)  # fmt: skip
    for name, why in (("use_inductor_graph_partition", "Inductor's graph partition captures through its own wrappers"),
                      ("cudagraph_mm_encoder", "encoder graphs are captured by a manager of their own")):  # fmt: skip
        if getattr(compilation, name, False):
            raise FoundryError(f"{why}; not persisted", field=field_name("compilation_config", name))
