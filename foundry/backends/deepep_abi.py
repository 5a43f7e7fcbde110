"""The parameters of DeepEP's kernels, by name, and what each pointer points into.

Names and order come from DeepEP's sources for the kernels ``sgl-deep-ep==0.1.2``
builds: ``internode_ll`` from sgl-project/DeepEP (``csrc/kernels/legacy/internode_ll.cu``,
the fork that adds ``x_global_scale`` and ``combine_overlappable``), ``internode``,
``intranode`` and ``layout`` from deepseek-ai/DeepEP (``csrc/kernels/legacy/``). A
``*`` marks a pointer parameter. ``tests/test_backends.py`` checks every entry
against the real kernels' parameter layouts (``tests/fixtures/kernel_names/deepep.txt``):
one name per parameter, pointers 8 bytes.

Where a pointer points, as DeepEP's host code sets it up:

- ``nvl-peers``: ``buffer_ptrs`` / ``barrier_signal_ptrs``, device tables (at the end of
  this rank's NVL buffer) of every NVLink peer's buffer and barrier cells, opened
  through CUDA IPC;
- ``nvshmem``: DeepEP's RDMA buffer and what is carved from it (low-latency send and
  receive buffers, their counters and flags, the buffer the next call cleans, the
  shrink-mode mask), allocated by NVSHMEM;
- ``workspace``: per-expert atomic counters and the clean flag in DeepEP's own
  ``cudaMalloc`` workspace;
- ``mapped-host``: host-pinned counters the notify kernels report to the CPU through;
- anything else is the application's tensors.
"""

from __future__ import annotations

from foundry.backends.base import ParamRole

PARAMETERS: dict[str, str] = {
    "internode_ll::clean_low_latency_buffer": (
        "clean_0* num_clean_int_0 clean_1* num_clean_int_1 rank num_ranks mask_buffer_ptr* sync_buffer_ptr*"
    ),
    "internode_ll::dispatch": (
        "packed_recv_x* packed_recv_x_scales* packed_recv_src_info* packed_recv_layout_range* packed_recv_count* "
        "mask_buffer_ptr* cumulative_local_expert_recv_stats* dispatch_wait_recv_cost_stats* x_global_scale* "
        "rdma_recv_x* rdma_recv_count* rdma_x* x* topk_idx* atomic_counter_per_expert* "
        "atomic_finish_counter_per_expert* next_clean* num_next_clean_int num_tokens "
        "num_max_dispatch_tokens_per_rank num_topk num_experts rank num_ranks num_warp_groups num_warps_per_group "
        "round_scale phases"
    ),
    "internode_ll::combine": (
        "combined_x* rdma_recv_x* rdma_recv_flag* rdma_send_x* x* topk_idx* topk_weights* src_info* layout_range* "
        "mask_buffer_ptr* combine_wait_recv_cost_stats* next_clean* num_next_clean_int atomic_clean_flag* "
        "num_combined_tokens hidden num_topk num_max_dispatch_tokens_per_rank num_experts rank num_ranks "
        "num_warp_groups num_warps_per_group phases zero_copy"
    ),
    "internode_ll::combine_overlappable": (
        "combined_x* rdma_recv_x* rdma_recv_flag* rdma_send_x* x* topk_idx* topk_weights* src_info* layout_range* "
        "combine_wait_recv_cost_stats* next_clean* num_next_clean_int atomic_clean_flag* num_combined_tokens hidden "
        "num_topk num_max_dispatch_tokens_per_rank num_experts rank num_ranks num_warp_groups num_warps_per_group "
        "phases zero_copy src_signals* src_signal_expect_value"
    ),
    "internode_ll::clean_mask_buffer": "mask_buffer_ptr* num_ranks",
    "internode_ll::query_mask_buffer": "mask_buffer_ptr* num_ranks mask_tensor*",
    "internode_ll::update_mask_buffer": "mask_buffer_ptr* rank_to_mask mask",
    "layout::get_dispatch_layout": (
        "topk_idx* num_tokens_per_rank* num_tokens_per_rdma_rank* num_tokens_per_expert* is_token_in_rank* "
        "num_tokens num_topk num_ranks num_experts"
    ),
    "internode::notify_dispatch": (
        "num_tokens_per_rank* moe_recv_counter_mapped* num_ranks num_tokens_per_rdma_rank* "
        "moe_recv_rdma_counter_mapped* num_tokens_per_expert* moe_recv_expert_counter_mapped* num_experts "
        "is_token_in_rank* num_tokens num_worst_tokens num_channels expert_alignment rdma_clean_offset "
        "rdma_num_int_clean nvl_clean_offset nvl_num_int_clean rdma_channel_prefix_matrix* "
        "recv_rdma_rank_prefix_sum* gbl_channel_prefix_matrix* recv_gbl_rank_prefix_sum* rdma_buffer_ptr* "
        "buffer_ptrs* barrier_signal_ptrs* rank rdma_team"
    ),
    "internode::dispatch": (
        "recv_x* recv_x_scales* recv_topk_idx* recv_topk_weights* recv_src_meta* x* x_scales* topk_idx* "
        "topk_weights* send_rdma_head* send_nvl_head* recv_rdma_channel_prefix_matrix* "
        "recv_gbl_channel_prefix_matrix* rdma_channel_prefix_matrix* recv_rdma_rank_prefix_sum* "
        "gbl_channel_prefix_matrix* recv_gbl_rank_prefix_sum* is_token_in_rank* num_tokens num_worst_tokens "
        "hidden_int4 num_scales num_topk num_experts scale_token_stride scale_hidden_stride rdma_buffer_ptr* "
        "num_max_rdma_chunked_send_tokens num_max_rdma_chunked_recv_tokens buffer_ptrs* "
        "num_max_nvl_chunked_send_tokens num_max_nvl_chunked_recv_tokens rank num_ranks"
    ),
    "internode::cached_notify": (
        "rdma_clean_offset rdma_num_int_clean nvl_clean_offset nvl_num_int_clean combined_rdma_head* "
        "num_combined_tokens num_channels rdma_channel_prefix_matrix* rdma_rank_prefix_sum* combined_nvl_head* "
        "rdma_buffer_ptr* buffer_ptrs* barrier_signal_ptrs* rank num_ranks is_cached_dispatch rdma_team"
    ),
    "internode::combine": (
        "combined_x* combined_topk_weights* is_combined_token_in_rank* x* topk_weights* bias_0* bias_1* "
        "combined_rdma_head* combined_nvl_head* src_meta* rdma_channel_prefix_matrix* rdma_rank_prefix_sum* "
        "gbl_channel_prefix_matrix* num_tokens num_combined_tokens hidden num_topk rdma_buffer_ptr* "
        "num_max_rdma_chunked_send_tokens num_max_rdma_chunked_recv_tokens buffer_ptrs* "
        "num_max_nvl_chunked_send_tokens num_max_nvl_chunked_recv_tokens rank num_ranks"
    ),
    "intranode::notify_dispatch": (
        "num_tokens_per_rank* moe_recv_counter_mapped* num_tokens_per_expert* moe_recv_expert_counter_mapped* "
        "num_experts num_tokens num_channels is_token_in_rank* channel_prefix_matrix* rank_prefix_matrix_copy* "
        "num_memset_int expert_alignment buffer_ptrs* barrier_signal_ptrs* rank"
    ),
    "intranode::cached_notify_dispatch": "rank_prefix_matrix* num_memset_int buffer_ptrs* barrier_signal_ptrs* rank",
    "intranode::cached_notify_combine": (
        "buffer_ptrs* send_head* num_channels num_recv_tokens num_memset_int barrier_signal_ptrs* rank"
    ),
    "intranode::barrier": "barrier_signal_ptrs* rank",
    "intranode::dispatch": (
        "recv_x* recv_x_scales* recv_src_idx* recv_topk_idx* recv_topk_weights* recv_channel_offset* send_head* x* "
        "x_scales* topk_idx* topk_weights* is_token_in_rank* channel_prefix_matrix* num_tokens num_worst_tokens "
        "hidden_int4 num_topk num_experts num_scales scale_token_stride scale_hidden_stride buffer_ptrs* rank "
        "num_max_send_tokens num_recv_buffer_tokens"
    ),
    "intranode::combine": (
        "recv_x* recv_topk_weights* x* topk_weights* bias_0* bias_1* src_idx* rank_prefix_matrix* "
        "channel_prefix_matrix* send_head* num_tokens num_recv_tokens hidden num_topk buffer_ptrs* rank "
        "num_max_send_tokens num_recv_buffer_tokens"
    ),
}

_NVL_PEERS = ("buffer_ptrs", "barrier_signal_ptrs")
_NVSHMEM = ("rdma_buffer_ptr", "rdma_recv_x", "rdma_recv_count", "rdma_recv_flag", "rdma_x", "rdma_send_x",
            "next_clean", "clean_0", "clean_1", "mask_buffer_ptr", "sync_buffer_ptr")  # fmt: skip
_WORKSPACE = ("atomic_counter_per_expert", "atomic_finish_counter_per_expert", "atomic_clean_flag")
_MAPPED_HOST = ("moe_recv_counter_mapped", "moe_recv_rdma_counter_mapped", "moe_recv_expert_counter_mapped")
MEMORY: dict[str, str] = {
    **dict.fromkeys(_NVL_PEERS, "nvl-peers"),
    **dict.fromkeys(_NVSHMEM, "nvshmem"),
    **dict.fromkeys(_WORKSPACE, "workspace"),
    **dict.fromkeys(_MAPPED_HOST, "mapped-host"),
}


def abi(family: str) -> tuple[ParamRole, ...] | None:
    """The parameters of kernel ``family`` (``internode_ll::dispatch``), or None when unknown."""
    spec = PARAMETERS.get(family)
    if spec is None:
        return None
    return tuple(ParamRole(i, word.rstrip("*"), word.endswith("*")) for i, word in enumerate(spec.split()))


def memory_of(role: ParamRole) -> str | None:
    """Where a pointer parameter points (see module docstring); None for a scalar."""
    return MEMORY.get(role.role, "tensor") if role.pointer else None


def needs_nvshmem(family: str) -> bool:
    """Whether the kernel takes memory NVSHMEM allocated (the RDMA buffer)."""
    return any(memory_of(role) == "nvshmem" for role in abi(family) or ())
