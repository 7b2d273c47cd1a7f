"""Prefill and autoregressive decoding over the static cache, with the per-sequence bookkeeping
(ragged prompts, EOS and max-new-tokens per sequence) that speculative decoding shares.

Convention: after prefill the cache holds every prompt token but the last one, which becomes the
`cur` token of the first step; each step feeds `cur` (plus drafts), so decode and verify steps have
static shapes and no host sync. The loop syncs once per step to test whether all are done."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dustin_runtime.attention import AttentionBackend, default_backend
from dustin_runtime.errors import DustinError
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.model import Transformer
from dustin_runtime.sampling import SamplingConfig, next_token
from dustin_runtime.stats import DecodeStats, PhaseTimer

PREFILL_CHUNK = 2048


@dataclass
class GenerationResult:
    """New tokens per sequence (EOS included when it ended the sequence) and the run's stats."""

    tokens: list[list[int]]
    finish_reasons: list[str]  # "eos" | "length"
    stats: DecodeStats


def check_prompts(prompts: list[list[int]], max_new: list[int], model: Transformer, extra: int = 0) -> None:
    """Refuse empty prompts, unknown ids and prompts that do not fit the model's context."""
    limit = model.cfg.max_position_embeddings
    for i, (p, m) in enumerate(zip(prompts, max_new, strict=True)):
        if len(p) == 0:
            raise DustinError(f"prompt {i} is empty")
        if m < 0:
            raise DustinError(f"prompt {i}: max new tokens must be >= 0")
        if len(p) + m > limit:
            raise DustinError(
                f"prompt {i} has {len(p)} tokens; with {m} new tokens it exceeds the model's "
                f"context of {limit} tokens"
            )
        if max(p) >= model.cfg.vocab_size or min(p) < 0:
            raise DustinError(f"prompt {i} has token ids outside the vocabulary ({model.cfg.vocab_size})")
        window = model.cfg.sliding_window
        if window is not None and len(p) + m + extra > window:
            raise DustinError(f"prompt {i} would exceed the sliding window ({window}), which is not supported")


def cache_capacity(prompts: list[list[int]], max_new: list[int], gamma: int = 0) -> int:
    """Rows needed per sequence: prompt + new tokens + room for one step's overshoot."""
    return max(len(p) for p in prompts) + max(max_new) + 2 * (gamma + 1) + 1


def prefill(
    model: Transformer,
    cache: KVCache,
    prompts: list[list[int]],
    backend: AttentionBackend,
    *,
    chunk: int = PREFILL_CHUNK,
    tail: int = 0,
    start: int = 0,
) -> None:
    """Write every prompt token but the last into the cache, in chunks (no N x N score matrix).
    Consecutive prompts of equal length go through together; others one run at a time. With
    `tail` > 0 the last `tail` of those tokens form their own final chunk (a policy can take its
    first target-history signal from those queries). With `start` > 0 the first `start` tokens of
    every prompt are already in the cache (a continued prefill)."""
    b = 0
    while b < len(prompts):
        e = b + 1
        while e < len(prompts) and len(prompts[e]) == len(prompts[b]):
            e += 1
        ids = torch.tensor([p[start:-1] for p in prompts[b:e]], dtype=torch.long, device=model.device)
        view, n = cache.rows(b, e), ids.shape[1]
        cut = max(n - tail, 0) if tail else n
        bounds = [(s, min(s + chunk, cut)) for s in range(0, cut, chunk)]
        if cut < n:
            bounds.append((cut, n))
        for s, stop in bounds:
            model(ids[:, s:stop], view, backend, phase="prefill", logits="none", kv_len=start + stop,
                  rows=(b, e), final=stop == n)
            view.advance(stop - s)
        b = e


class Bookkeeper:
    """Device-side outputs of a batch: per-step emitted tokens, EOS and length limits."""

    def __init__(self, prompts, max_new, eos_ids, width: int, device, min_new: int = 0):
        B = len(prompts)
        self.device = device
        self.min_new = min_new
        self.max_new = torch.tensor(max_new, device=device)
        self.produced = torch.zeros(B, dtype=torch.long, device=device)
        self.done = self.max_new <= 0
        self.eos = torch.tensor(sorted(set(eos_ids)) or [-1], device=device)
        self.out = torch.zeros(B, max(max_new) + 2 * width + 1, dtype=torch.long, device=device)
        self.trash = self.out.shape[1] - 1
        self.accepted: list[torch.Tensor] = []

    def mask_early_stops(self, logits: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Forbid end-of-sequence ids before `min_new` tokens: logits [B, T, V] (token t of the pass
        would be new token produced + offset + t) get -inf on those ids. No host sync."""
        if self.min_new <= 0:
            return logits
        T = logits.shape[1]
        pos = self.produced.view(-1, 1) + offset + torch.arange(T, device=self.device)  # [B, T]
        early = (pos < self.min_new).unsqueeze(-1)  # [B, T, 1]
        cols = logits[:, :, self.eos]
        logits[:, :, self.eos] = torch.where(early, torch.full_like(cols, float("-inf")), cols)
        return logits

    def emit(self, emitted: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Append emitted[b, :count[b]] ([B, W], [B]) for live sequences; returns the per-sequence
        advance (count for live ones, 0 for finished ones)."""
        W = emitted.shape[1]
        live = ~self.done
        j = torch.arange(W, device=self.device)
        valid = (j.view(1, W) < count.view(-1, 1)) & live.view(-1, 1)  # [B, W]
        pos = (self.produced.view(-1, 1) + j).clamp_max(self.trash - 1)
        self.out.scatter_(1, torch.where(valid, pos, self.trash), emitted)
        hit_eos = (torch.isin(emitted, self.eos) & valid).any(1)
        advance = torch.where(live, count, torch.zeros_like(count))
        self.produced += advance
        self.done = self.done | hit_eos | (self.produced >= self.max_new)
        return advance

    def all_done(self) -> bool:
        return bool(self.done.all())

    def results(self, max_new) -> tuple[list[list[int]], list[str]]:
        out, produced = self.out.cpu().tolist(), self.produced.cpu().tolist()
        eos = set(self.eos.cpu().tolist())
        tokens, reasons = [], []
        for b, row in enumerate(out):
            row = row[: min(produced[b], max_new[b])]
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            if cut is not None:
                tokens.append(row[: cut + 1])
                reasons.append("eos")
            else:
                tokens.append(row)
                reasons.append("length")
        return tokens, reasons


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int | list[int],
    *,
    sampling: SamplingConfig = SamplingConfig(),
    eos_ids: tuple[int, ...] = (),
    backend: AttentionBackend | None = None,
    seed: int = 0,
    prefill_chunk: int = PREFILL_CHUNK,
    min_new_tokens: int = 0,
) -> GenerationResult:
    """Autoregressive decoding of a batch of prompts of any lengths (EOS ids are forbidden
    before `min_new_tokens` new tokens)."""
    max_new = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    check_prompts(prompts, max_new, model)
    device = model.device
    backend = backend or default_backend(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    timer = PhaseTimer(device)
    t0 = time.perf_counter()
    cache = model.allocate_cache(len(prompts), cache_capacity(prompts, max_new))
    with timer.phase("prefill"):
        prefill(model, cache, prompts, backend, chunk=prefill_chunk)
    book = Bookkeeper(prompts, max_new, eos_ids, 1, device, min_new_tokens)
    cur = torch.tensor([p[-1] for p in prompts], device=device)
    steps = 0
    one = torch.ones(len(prompts), dtype=torch.long, device=device)
    while not book.all_done():
        with timer.phase("decode"):
            logits = book.mask_early_stops(model(cur.view(-1, 1), cache, backend, phase="decode"))[:, -1]
        with timer.phase("other"):
            nxt = next_token(logits, sampling, gen)
            advance = book.emit(nxt.view(-1, 1), one)
            cache.advance(advance.to(torch.int32))
            cur = torch.where(advance > 0, nxt, cur)
        steps += 1
    tokens, reasons = book.results(max_new)
    seconds = timer.totals()
    seconds["total"] = time.perf_counter() - t0
    stats = DecodeStats(
        mode="autoregressive",
        batch=len(prompts),
        prompt_tokens=[len(p) for p in prompts],
        new_tokens=[len(t) for t in tokens],
        steps=steps,
        seconds=seconds,
    )
    return GenerationResult(tokens, reasons, stats)
