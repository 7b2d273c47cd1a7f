"""Candidate retrieval heads at KV-head granularity and their importance signals.

The signal of a candidate (layer, KV head) for one verification pass is what the runtime's
estimator computes for it: the sum over the KV head's query heads and the gamma + 1 queries of
the softmax over the context [0, L), through `dustin_kernels.srh_scores` (`srh_scores_ref` off
CUDA), so offline and online scores are the same numbers."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dustin_runtime.config import ModelConfig


@dataclass(frozen=True)
class Candidate:
    """One KV head of the draft or the target; `query_heads` all score when it is chosen."""

    model: str  # "draft" | "target"
    layer: int
    kv_head: int
    query_heads: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.model[0]}L{self.layer}.{self.kv_head}"


def candidates_of(cfg: ModelConfig, model: str) -> list[Candidate]:
    """Every KV head of a model, by layer then KV head (the search's tie-breaking order)."""
    r = cfg.n_rep
    return [Candidate(model, layer, g, tuple(range(g * r, (g + 1) * r)))
            for layer in range(cfg.num_layers) for g in range(cfg.num_kv_heads)]


def kv_head_signals(
    q: torch.Tensor,  # [B, H, M, D]: queries of one layer, all heads
    k_cache: torch.Tensor,  # [B or 1, G, N, D]: that layer's keys
    lens: torch.Tensor,  # [B] int32: context rows per batch entry
    triton: bool | None = None,  # the Triton kernel (default: on CUDA) or its reference
) -> torch.Tensor:
    """Signals of every KV head of one layer: [G, B, N] fp32, 0 at rows >= lens[b]."""
    B, H, _, _ = q.shape
    G = k_cache.shape[1]
    r = H // G
    if k_cache.shape[0] != B:
        k_cache = k_cache.expand(B, -1, -1, -1)
    from dustin_runtime.ops import kernels

    scores = kernels.srh_scores if (q.device.type == "cuda" if triton is None else triton) else kernels.srh_scores_ref
    out = []
    for g in range(G):
        heads = torch.full((r,), g, dtype=torch.int32, device=q.device)
        out.append(scores(q[:, g * r: (g + 1) * r].contiguous(), heads, k_cache, lens))
    return torch.stack(out)
