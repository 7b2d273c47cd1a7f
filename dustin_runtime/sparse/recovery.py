"""Attention Recovery Rate (ARR): the one definition the profiler and the runtime's meter share.

In one verification pass with L context rows, query q (a target layer, one of its query heads and
one of the gamma + 1 verification queries) puts p_q[i] of its attention on context row i < L and the
rest on the new tokens. The ARR of a set I of context rows is the mean over queries of
    sum_{i in I} p_q[i] / sum_{i < L} p_q[i],
the share of each query's attention on the context that the set keeps. The new tokens are always
attended, so their mass is left out: counting it would lift every policy alike and hide differences.
By linearity ARR(I) = sum_{i in I} A[i], where A (`context_attention`) is the mean over queries of
the renormalised rows; `recovery` sums A over sets with an fp64 reduction and clamps to [0, 1] (A
sums to 1 only up to rounding)."""

from __future__ import annotations

import torch


def context_attention(probs: torch.Tensor, lengths: torch.Tensor | int) -> torch.Tensor:
    """probs [..., R, N] (R queries' attention over N rows, context first), lengths [...] or an int
    (context rows L of each leading index) -> A [..., N] fp32: the mean over the R queries of each
    query's attention on rows n < L divided by its attention on all rows < L; 0 for n >= L."""
    N = probs.shape[-1]
    L = torch.as_tensor(lengths, device=probs.device)
    L = L.reshape(*L.shape, *([1] * (probs.dim() - L.dim())))  # [..., 1, 1]
    p = probs.float() * (torch.arange(N, device=probs.device) < L)
    mass = p.sum(-1, keepdim=True, dtype=torch.float64).clamp_min(1e-300)  # [..., R, 1]
    return ((p / mass.float()).sum(-2, dtype=torch.float64) / p.shape[-2]).float()


def recovery(attn: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """ARR of index sets: attn [P, ..., N] (`context_attention`, averaged as wanted), indices
    [P, ..., S] or [P, S] (one set shared by the middle dims) of distinct rows, -1 = none ->
    [P, ...] fp64 in [0, 1]."""
    if indices.dim() < attn.dim():
        shape = (indices.shape[0],) + (1,) * (attn.dim() - indices.dim()) + tuple(indices.shape[1:])
        indices = indices.reshape(shape).expand(*attn.shape[:-1], indices.shape[-1])
    got = attn.gather(-1, indices.clamp_min(0).long()).double() * (indices >= 0)
    return got.sum(-1).clamp(0.0, 1.0)
