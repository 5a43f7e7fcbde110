"""A Qwen3-shaped decoder with an explicit KV cache, for SAVE/LOAD recipes and the cold-start benchmark.

Written out rather than taken from transformers so that a decode step is a pure
function of its inputs (token ids, positions) and the KV cache: transformers'
``StaticCache`` advances a counter inside the captured graph on every replay.
Weights are random (seed 0, bf16). Qwen3 pieces: RMSNorm, q/k norms, rotary
embeddings, grouped-query attention, SiLU-gated MLP, untied LM head.

With a :class:`TensorParallel`, each rank keeps its share of the attention heads
and of the MLP (the same random weights, sliced) and sums the partial outputs of
the attention and MLP projections through ``all_reduce``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the usual spelling


@dataclass(frozen=True)
class DecoderConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_len: int
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6


TINY = DecoderConfig(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1024, max_len=64)
# Qwen3-0.6B's shape: 28 layers, hidden 1024, 16 heads of 128, 8 KV heads, MLP 3072, vocab 151,936
QWEN3_06B = DecoderConfig(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072,
                          vocab=151_936, max_len=48)  # fmt: skip
CONFIGS = {"tiny": TINY, "qwen3-0.6b": QWEN3_06B}


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in a tensor-parallel group and the sum over the group."""

    rank: int
    size: int
    all_reduce: Callable[[torch.Tensor], torch.Tensor]


def _shard(layer: dict[str, torch.Tensor], c: DecoderConfig, tp: TensorParallel) -> dict[str, torch.Tensor]:
    """One rank's share of a layer: its heads of q, k, v and o, its part of the MLP."""
    heads, kv, inter, d = c.heads // tp.size, c.kv_heads // tp.size, c.intermediate // tp.size, c.head_dim
    q, k, v = layer["qkv"].split([c.heads * d, c.kv_heads * d, c.kv_heads * d])
    gate, up = layer["gate_up"].chunk(2)
    r = tp.rank
    q_rows, kv_rows, mlp = slice(r * heads * d, (r + 1) * heads * d), slice(r * kv * d, (r + 1) * kv * d), slice(
        r * inter, (r + 1) * inter)  # fmt: skip
    return {
        **layer,
        "qkv": torch.cat([q[q_rows], k[kv_rows], v[kv_rows]]).contiguous(),
        "o": layer["o"][:, q_rows].contiguous(),
        "gate_up": torch.cat([gate[mlp], up[mlp]]).contiguous(),
        "down": layer["down"][:, mlp].contiguous(),
    }


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


# The final norm runs through torch.compile (Inductor/Triton): one compiled region per graph.
compiled_final_norm = torch.compile(rms_norm, dynamic=True)


class Decoder:
    """Weights, KV cache and a decode step for a batch of sequences."""

    def __init__(self, config: DecoderConfig, max_batch: int, device: str = "cuda",
                 tp: TensorParallel | None = None) -> None:  # fmt: skip
        self.config = c = config
        self.tp = tp
        if tp is not None and (c.heads % tp.size or c.kv_heads % tp.size or c.intermediate % tp.size):
            raise ValueError(f"{tp.size} ranks cannot split {c.heads} heads, {c.kv_heads} KV heads and the MLP")
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(*shape: int, scale: float = 0.02) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(torch.bfloat16)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=device, dtype=torch.bfloat16)

        self.embed = weight(c.vocab, c.hidden)
        self.layers = [
            {
                "in_norm": ones(c.hidden),
                "qkv": weight((c.heads + 2 * c.kv_heads) * c.head_dim, c.hidden),
                "q_norm": ones(c.head_dim),
                "k_norm": ones(c.head_dim),
                "o": weight(c.hidden, c.heads * c.head_dim),
                "post_norm": ones(c.hidden),
                "gate_up": weight(2 * c.intermediate, c.hidden),
                "down": weight(c.hidden, c.intermediate),
            }
            for _ in range(c.layers)
        ]
        self.final_norm = ones(c.hidden)
        self.lm_head = weight(c.vocab, c.hidden)
        if tp is not None:  # the same weights, sliced: one rank's heads and MLP columns
            self.layers = [_shard(layer, c, tp) for layer in self.layers]
        self.heads = c.heads // (tp.size if tp else 1)
        self.kv_heads = c.kv_heads // (tp.size if tp else 1)
        shape = (c.layers, 2, max_batch, self.kv_heads, c.max_len, c.head_dim)
        self.cache = torch.zeros(shape, device=device, dtype=torch.bfloat16)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=device, dtype=torch.float32) / c.head_dim))
        angles = torch.outer(torch.arange(c.max_len, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = angles.cos(), angles.sin()
        self.positions = torch.arange(c.max_len, device=device)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def step(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step for ``len(ids)`` sequences at positions ``pos``: writes their
        keys and values into the cache and returns ``(logits float32, greedy next ids)``."""
        c = self.config
        bs = ids.shape[0]
        rows = torch.arange(bs, device=ids.device)
        x = self.embed[ids]
        visible = (self.positions[None, :] <= pos[:, None])[:, None, None, :]  # [bs, 1, 1, max_len]
        heads, kv_heads = self.heads, self.kv_heads
        reduce = self.tp.all_reduce if self.tp is not None else (lambda t: t)
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer["in_norm"], c.eps)
            qkv = F.linear(h, layer["qkv"])
            q, k, v = qkv.split([heads * c.head_dim, kv_heads * c.head_dim, kv_heads * c.head_dim], dim=-1)
            q = self._rope(rms_norm(q.view(bs, heads, c.head_dim), layer["q_norm"], c.eps), pos)
            k = self._rope(rms_norm(k.view(bs, kv_heads, c.head_dim), layer["k_norm"], c.eps), pos)
            keys, values = self.cache[index, 0, :bs], self.cache[index, 1, :bs]
            keys[rows, :, pos] = k
            values[rows, :, pos] = v.view(bs, kv_heads, c.head_dim)
            attn = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=visible, enable_gqa=True)
            x = x + reduce(F.linear(attn.reshape(bs, heads * c.head_dim), layer["o"]))
            h = rms_norm(x, layer["post_norm"], c.eps)
            gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + reduce(F.linear(F.silu(gate) * up, layer["down"]))
        logits = F.linear(compiled_final_norm(x, self.final_norm, c.eps), self.lm_head).float()
        return logits, logits.argmax(-1)


def sample(logits: torch.Tensor, temperature: float = 0.8) -> torch.Tensor:
    """Seeded Gumbel-max sampling from the default CUDA generator (philox)."""
    u = torch.rand_like(logits).clamp_(1e-10, 1.0)
    return (logits / temperature - torch.log(-torch.log(u))).argmax(-1)
