"""Rotary position embeddings: default, linear, Llama-3 and YaRN frequency schedules (as Hugging
Face computes them), a cos/sin table per model, and the rotate-half application."""

from __future__ import annotations

import math

import torch

from dustin_runtime.config import ModelConfig, RopeConfig


def _llama3(inv_freq: torch.Tensor, r: RopeConfig) -> torch.Tensor:
    old_len = r.original_max_position_embeddings or 8192
    low_wavelen = old_len / r.low_freq_factor
    high_wavelen = old_len / r.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq)
    smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
    smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, r: RopeConfig, max_pos: int) -> tuple[torch.Tensor, float]:
    base, factor = r.theta, r.factor
    omax = r.original_max_position_embeddings or max_pos

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = r.attention_factor
    if attention is None:
        if r.mscale and r.mscale_all_dim:
            attention = get_mscale(factor, r.mscale) / get_mscale(factor, r.mscale_all_dim)
        else:
            attention = get_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(omax / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


def inv_freq_and_scale(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [D/2] (float32) and the cos/sin attention scaling of the model's RoPE."""
    r, dim = cfg.rope, cfg.head_dim
    if r.type == "yarn":
        return _yarn(dim, r, cfg.max_position_embeddings)
    inv_freq = 1.0 / (r.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if r.type == "linear":
        inv_freq = inv_freq / r.factor
    elif r.type == "llama3":
        inv_freq = _llama3(inv_freq, r)
    return inv_freq, 1.0


def rope_table(cfg: ModelConfig, max_len: int, device: torch.device | str) -> torch.Tensor:
    """cos and sin for positions [0, max_len): float32 [2, max_len, D] (halves repeated, HF layout)."""
    inv_freq, scale = inv_freq_and_scale(cfg)
    t = torch.arange(max_len, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # [N, D/2], float32 like Hugging Face (the models' training)
    emb = torch.cat([freqs, freqs], dim=-1)  # [N, D]
    return torch.stack([emb.cos() * scale, emb.sin() * scale]).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by cos/sin [B, 1, T, D] (float32 math, result in x's dtype)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)
