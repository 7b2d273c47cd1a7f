"""Sampling without host syncs: temperature / top-p distributions, draws through exponential noise
(argmax of p / E, E ~ Exp(1), is a draw from p), greedy as temperature 0, and the acceptance rule
of speculative decoding (greedy matching, or exact rejection sampling, Leviathan et al. 2023)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dustin_runtime.errors import DustinError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_p 1.0 keeps the whole distribution."""

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self):
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise DustinError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:  # NaN fails too
            raise DustinError(f"top-p must be in (0, 1] (1 keeps the whole distribution), got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (float32) after temperature and top-p. Greedy gives
    the one-hot of the argmax, so greedy decoding is the temperature -> 0 limit of the same code."""
    logits = logits.float()
    if cfg.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # the smallest prefix with mass >= top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of probs [..., V] -> [...] int64; no host sync."""
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, V] -> tokens [B]: argmax when greedy, else a draw from the adjusted distribution."""
    if cfg.greedy:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, cfg), generator)


def speculative_accept(
    draft_tokens: torch.Tensor,  # [B, K] the drafted tokens d_1..d_K
    draft_probs: torch.Tensor | None,  # [B, K, V] q_i(.) each d_i was drawn from (None if greedy)
    target_logits: torch.Tensor,  # [B, K + 1, V] target logits at positions of cur, d_1..d_K
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    forced: torch.Tensor | None = None,  # [B] accepted counts that replace the decision (replay)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted-prefix lengths n [B] (0..K) and the next token [B]: the target's correction at the
    first rejection, or its bonus token after K accepts. With `forced`, n is forced and the next
    token is the target's at n as above (the random draws of a real decision are still made, so
    forcing the counts a real run found reproduces that run).

    Greedy: d_i is accepted while it equals the target's argmax, so the output equals greedy
    decoding of the target. Sampling: d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)),
    a rejection resamples from norm(max(0, p - q)); the output is distributed exactly as the
    target's samples."""
    B, K = draft_tokens.shape
    if cfg.greedy:
        t = target_logits.argmax(-1)  # [B, K + 1]
        ok = (t[:, :K] == draft_tokens).int()
        n = ok.cumprod(dim=1).sum(dim=1) if forced is None else forced  # [B]
        return n, t.gather(1, n.view(B, 1)).squeeze(1)
    p = probs_from_logits(target_logits, cfg)  # [B, K + 1, V]
    p_d = p[:, :K].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    q_d = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [B, K]
    u = torch.rand(B, K, device=p.device, generator=generator)
    ok = (u * q_d <= p_d).int()  # u <= p / q without dividing by q
    n = ok.cumprod(dim=1).sum(dim=1) if forced is None else forced  # [B]
    p_n = p.gather(1, n.view(B, 1, 1).expand(B, 1, p.shape[-1])).squeeze(1)  # [B, V]
    q_pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)  # [B, K + 1, V]
    q_n = q_pad.gather(1, n.view(B, 1, 1).expand(B, 1, p.shape[-1])).squeeze(1)  # zero after K accepts
    residual = (p_n - q_n).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)  # p == q: residual is p
    return n, sample(residual, generator)
