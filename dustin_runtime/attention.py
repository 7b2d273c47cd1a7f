"""The attention backend seam.

The model computes q, k, v, writes k and v into the KV cache at the new tokens' positions, then
hands attention to a backend object: `attend(layer, q, cache, ctx)`. Backends: `TorchAttention` (pure-torch reference, any device), `TritonAttention` (split-KV
Triton kernel for decode/verify on CUDA, SDPA for prefill). Sparse-verification policies and the
profiler's recorders are backends too, so neither touches model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dustin_runtime.kv_cache import KVCache


@dataclass
class ForwardContext:
    """What one forward pass tells its attention backend."""

    start: torch.Tensor  # [B] int32: cache rows before this pass (position of the first new token)
    positions: torch.Tensor  # [B, T] int64: absolute positions of the new tokens
    num_new: int  # T
    phase: str  # "prefill" | "decode" | "verify" | "draft" | "score"
    kv_len: int | None = None  # host-known bound on start + T (prefill only), lets backends slice
    rows: tuple[int, int] | None = None  # prefill: the batch rows [start, stop) this pass covers
    final: bool = False  # prefill: the last chunk of these sequences' prompts
    memo: dict = field(default_factory=dict)  # per-pass values backends compute once (e.g. masks)


class AttentionBackend:
    """Interface: `attend` returns [B, H, T, D]; `begin`/`end` bracket one forward pass."""

    def begin(self, ctx: ForwardContext) -> None:
        """Called once before the first layer of a forward pass."""

    def attend(
        self,
        layer: int,
        q: torch.Tensor,  # [B, H, T, D], RoPE applied
        cache: KVCache,  # the new tokens' K/V are already in it, at rows ctx.positions
        ctx: ForwardContext,
    ) -> torch.Tensor:
        raise NotImplementedError

    def attend_qkv(
        self,
        layer: int,
        qkv: torch.Tensor,  # [B, T, (H + 2G) * D]: the fused projection, before RoPE
        rope: torch.Tensor,  # [2, N, D] float32 cos | sin
        num_heads: int,
        cache: KVCache,
        ctx: ForwardContext,
    ) -> torch.Tensor | None:
        """Attention with RoPE and the cache write inside, for backends that fuse them (the model
        calls it on its fused path, models without q / k norm): [B, H, T, D], or None to be handed
        RoPE'd queries through `attend` instead (the default)."""
        return None

    def end(self, ctx: ForwardContext) -> None:
        """Called once after the last layer of a forward pass."""


def causal_mask(start: torch.Tensor, T: int, N: int) -> torch.Tensor:
    """Additive float32 mask [B, 1, T, N]: 0 where row n is visible to query t (n <= start[b] + t),
    -inf elsewhere."""
    qpos = start.view(-1, 1).long() + torch.arange(T, device=start.device)  # [B, T]
    visible = torch.arange(N, device=start.device).view(1, 1, N) <= qpos.unsqueeze(-1)  # [B, T, N]
    mask = torch.zeros(visible.shape, dtype=torch.float32, device=start.device)
    return mask.masked_fill_(~visible, float("-inf")).unsqueeze(1)


def reference_attention(
    q: torch.Tensor,  # [B, H, T, D]
    k: torch.Tensor,  # [B, G, N, D]
    v: torch.Tensor,  # [B, G, N, D]
    start: torch.Tensor,  # [B] int: query t of sequence b sits at position start[b] + t
    scale: float | None = None,
    mask: torch.Tensor | None = None,  # causal_mask(start, T, N), when the caller has it already
) -> torch.Tensor:
    """Causal GQA attention in float32; row n is visible to query t iff n <= start[b] + t.
    Returns [B, H, T, D] in q's dtype. (SDPA with an explicit mask: on CPU it matches Hugging
    Face's SDPA path to float32 rounding.)"""
    B, H, T, D = q.shape
    if mask is None:
        mask = causal_mask(start, T, k.shape[2])
    G = k.shape[1]
    if T <= 16:  # decode / verify: grouped matmuls, K and V read once per KV head
        r = H // G
        qg = q.float().reshape(B, G, r * T, D)  # rows (i, t) of the group's heads
        scores = torch.matmul(qg, k.float().transpose(-1, -2)) * (D**-0.5 if scale is None else scale)
        scores = scores.view(B, G, r, T, -1) + mask.unsqueeze(1)  # [B, G, r, T, N]
        probs = torch.softmax(scores, dim=-1).view(B, G, r * T, -1)
        return torch.matmul(probs, v.float()).view(B, H, T, D).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != H,
    )
    return out.to(q.dtype)


def sdpa_prefill(
    q: torch.Tensor,  # [b, H, T, D]
    k: torch.Tensor,  # [b, G, S, D] with S = start + T rows valid in every sequence
    v: torch.Tensor,  # [b, G, S, D]
) -> torch.Tensor:
    """Prefill chunk of sequences at equal lengths: SDPA with a lower-right causal mask."""
    from torch.nn.attention.bias import causal_lower_right

    T, S = q.shape[2], k.shape[2]
    r = q.shape[1] // k.shape[1]
    if r > 1:
        k = k.repeat_interleave(r, dim=1)
        v = v.repeat_interleave(r, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))


class TorchAttention(AttentionBackend):
    """Reference backend: exact float32 attention over the whole cache prefix."""

    def attend(self, layer, q, cache, ctx):
        k, v = cache.k[layer], cache.v[layer]
        if ctx.kv_len is not None:
            k, v = k[:, :, : ctx.kv_len], v[:, :, : ctx.kv_len]
            if q.shape[2] == ctx.kv_len:  # whole prompts of equal length at once: plain causal
                out = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
                )
                return out.to(q.dtype)
        key = ("causal_mask", k.shape[2])
        if key not in ctx.memo:
            ctx.memo[key] = causal_mask(ctx.start, q.shape[2], k.shape[2])
        return reference_attention(q, k, v, ctx.start, mask=ctx.memo[key])


class TritonAttention(AttentionBackend):
    """CUDA backend: the split-KV Triton kernel for decode and verify steps (graph-capturable),
    SDPA (flash) for prefill chunks of one sequence."""

    def attend(self, layer, q, cache, ctx):
        k, v = cache.k[layer], cache.v[layer]
        if ctx.phase == "prefill" and ctx.kv_len is not None:
            return sdpa_prefill(q, k[:, :, : ctx.kv_len], v[:, :, : ctx.kv_len])
        from dustin_runtime.ops import kernels

        return kernels.full_verify_attention(q, k, v, ctx.start)


def default_backend(device: torch.device | str) -> AttentionBackend:
    """Triton kernels on CUDA, the torch reference elsewhere."""
    return TritonAttention() if torch.device(device).type == "cuda" else TorchAttention()
