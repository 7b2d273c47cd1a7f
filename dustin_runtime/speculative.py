"""Batched speculative decoding (Leviathan et al. 2023) over static caches.

One step per batch, static shapes, no host sync inside:
  draft:  feed cur, d_1, .., d_gamma to the draft (gamma + 1 forwards; the last one only writes
          d_gamma's K/V and gives the lookahead queries of every verification position);
  select: the verification policy's hook (nothing for full verification);
  verify: one target forward over [cur, d_1..d_gamma];
  accept: greedy matching or rejection sampling -> n accepted and the next token per sequence;
  commit: both caches keep cur, d_1..d_n (length += n + 1); rejected rows are dropped by length.
"""

from __future__ import annotations

import time

import torch

from dustin_runtime.attention import AttentionBackend, default_backend
from dustin_runtime.errors import DustinError
from dustin_runtime.generate import (
    PREFILL_CHUNK,
    Bookkeeper,
    GenerationResult,
    cache_capacity,
    check_prompts,
    prefill,
)
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.model import Transformer
from dustin_runtime.sampling import SamplingConfig, probs_from_logits, sample, speculative_accept
from dustin_runtime.stats import DecodeStats, PhaseTimer


class SpecHooks:
    """Where a verification policy plugs into the loop. The default is full verification: the
    target's backend attends over the whole cache and no hook does anything."""

    name = "full"

    def target_backend(self, default: AttentionBackend) -> AttentionBackend:
        """The backend for the target's prefill and verification passes."""
        return default

    def draft_backend(self, default: AttentionBackend) -> AttentionBackend:
        """The backend for the draft's prefill and drafting passes."""
        return default

    def setup(self, target_cache: KVCache, draft_cache: KVCache, gamma: int) -> None:
        """Called once after the caches are allocated, before prefill."""

    def prefill_tail(self, gamma: int) -> int:
        """How many trailing prompt tokens prefill should process as their own final chunk."""
        return 0

    def before_draft(self) -> None:
        """Called before each drafting phase."""

    def drafted(self, tokens: torch.Tensor) -> None:
        """Called after drafting with this step's verification tokens [B, gamma + 1] (cur, d_1..d_gamma)."""

    def before_verify(self) -> None:
        """Called between drafting and verification (selection happens here)."""

    def after_verify(self, accepted: torch.Tensor, advance: torch.Tensor) -> None:
        """Called after acceptance with n [B] and the committed advance [B] (0 for finished ones)."""

    def summary(self) -> dict:
        """Policy-specific statistics added to the run's stats."""
        return {}


def _common_vocab(target: Transformer, draft: Transformer) -> int:
    return min(target.cfg.vocab_size, draft.cfg.vocab_size)


@torch.inference_mode()
def speculative_generate(
    target: Transformer,
    draft: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int | list[int],
    *,
    gamma: int = 4,
    sampling: SamplingConfig = SamplingConfig(),
    eos_ids: tuple[int, ...] = (),
    hooks: SpecHooks | None = None,
    seed: int = 0,
    prefill_chunk: int = PREFILL_CHUNK,
    min_new_tokens: int = 0,
    prefilled: tuple[KVCache, KVCache, int] | None = None,
) -> GenerationResult:
    """Speculative decoding of a batch of prompts of any lengths with ragged acceptance (EOS ids
    are forbidden before `min_new_tokens` new tokens, in the draft and the target alike).
    `prefilled` = (target cache, draft cache, rows): the first `rows` tokens of every prompt already
    prefilled with the plain backend (shared by several runs); they are copied and prefill goes on
    from there, exactly as if it had started from zero."""
    if gamma < 1:
        raise DustinError("gamma must be >= 1")
    if target.device != draft.device:
        raise DustinError("target and draft must be on the same device")
    max_new = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    check_prompts(prompts, max_new, target, extra=gamma + 1)
    check_prompts(prompts, max_new, draft, extra=gamma + 1)
    hooks = hooks or SpecHooks()
    device, B, V = target.device, len(prompts), _common_vocab(target, draft)
    base = default_backend(device)
    t_backend, d_backend = hooks.target_backend(base), hooks.draft_backend(base)
    gen = torch.Generator(device=device).manual_seed(seed)
    timer = PhaseTimer(device)
    t0 = time.perf_counter()
    capacity = cache_capacity(prompts, max_new, gamma)
    tcache = target.allocate_cache(B, capacity)
    dcache = draft.allocate_cache(B, capacity)
    start = 0
    if prefilled is not None:
        start = prefilled[2]
        for dst, src in zip((tcache, dcache), prefilled[:2], strict=True):
            for a, b in zip(dst.k + dst.v, src.k + src.v, strict=True):
                a[:, :, :start].copy_(b[:, :, :start])
            dst.lengths.fill_(start)
    hooks.setup(tcache, dcache, gamma)
    with timer.phase("prefill"):
        tail = hooks.prefill_tail(gamma)
        prefill(target, tcache, prompts, t_backend, chunk=prefill_chunk, tail=tail, start=start)
        prefill(draft, dcache, prompts, d_backend, chunk=prefill_chunk, tail=tail, start=start)
    book = Bookkeeper(prompts, max_new, eos_ids, gamma + 1, device, min_new_tokens)
    cur = torch.tensor([p[-1] for p in prompts], device=device)
    steps = 0
    while not book.all_done():
        with timer.phase("draft"):
            hooks.before_draft()
            tok, drafted, qs = cur, [], []
            for i in range(gamma):
                logits = draft(tok.view(-1, 1), dcache, d_backend, phase="draft")[..., :V]
                logits = book.mask_early_stops(logits, offset=i)[:, -1]
                dcache.advance(1)
                if sampling.greedy:
                    tok = logits.argmax(-1)
                else:
                    q = probs_from_logits(logits, sampling)
                    tok = sample(q, gen)
                    qs.append(q)
                drafted.append(tok)
            draft(tok.view(-1, 1), dcache, d_backend, phase="draft", logits="none")
            d = torch.stack(drafted, dim=1)  # [B, gamma]
            vt = torch.cat([cur.view(-1, 1), d], dim=1)  # [B, gamma + 1]
            hooks.drafted(vt)
        with timer.phase("select"):
            hooks.before_verify()
        with timer.phase("verify"):
            logits = book.mask_early_stops(target(vt, tcache, t_backend, phase="verify")[..., :V])  # [B, g+1, V]
        with timer.phase("other"):
            q_all = torch.stack(qs, dim=1) if qs else None
            n, nxt = speculative_accept(d, q_all, logits, sampling, gen)
            emitted = torch.cat([d, torch.zeros_like(nxt).view(-1, 1)], dim=1)
            emitted.scatter_(1, n.view(-1, 1), nxt.view(-1, 1))  # [B, gamma + 1]
            live = ~book.done
            advance = book.emit(emitted, n + 1)
            tcache.advance(advance.to(torch.int32))
            dcache.set_lengths(tcache.lengths)
            cur = torch.where(advance > 0, nxt, cur)
            book.accepted.append(torch.where(live, n, torch.full_like(n, -1)))
            hooks.after_verify(n, advance)
        steps += 1
    tokens, reasons = book.results(max_new)
    accepted = torch.stack(book.accepted).cpu().tolist() if book.accepted else []
    seconds = timer.totals()
    seconds["total"] = time.perf_counter() - t0
    stats = DecodeStats(
        mode="speculative",
        batch=B,
        prompt_tokens=[len(p) for p in prompts],
        new_tokens=[len(t) for t in tokens],
        steps=steps,
        gamma=gamma,
        seconds=seconds,
        accepted=accepted,
        policy=hooks.name,
        extra=hooks.summary(),
    )
    return GenerationResult(tokens, reasons, stats)
