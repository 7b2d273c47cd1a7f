"""Teacher-forced verification: the speculative loop with the true continuation as the "drafts",
every window accepted. It measures what a verification policy costs in quality (the perplexity
of the target when each window of gamma + 1 tokens attends through the policy's set) without the
noise of acceptance. With full verification it equals one causal forward.

Several policies share one prefill: the prompt up to its last `gamma + 1` tokens is prefilled
once with the plain backend and copied; each policy then prefills that tail itself (its first
target-history signal) and runs the windows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dustin_runtime.attention import default_backend
from dustin_runtime.errors import DustinError
from dustin_runtime.generate import prefill
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.model import Transformer
from dustin_runtime.sparse.measures import PER_SEQUENCE
from dustin_runtime.speculative import SpecHooks


@dataclass
class TeacherForcedResult:
    """Summed negative log-likelihood (nats) and scored tokens per sequence, for one policy;
    `nll_by_offset[b][i]`: the part of nll[b] scored at offset i of the gamma + 1 window queries
    (offset gamma predicts the token after the window: no query of the window has seen it)."""

    nll: list[float]
    tokens: list[int]
    windows: int
    extra: dict = field(default_factory=dict)
    nll_by_offset: list[list[float]] = field(default_factory=list)


def _copy(cache: KVCache) -> KVCache:
    return KVCache([t.clone() for t in cache.k], [t.clone() for t in cache.v], cache.lengths.clone())


@torch.inference_mode()
def teacher_forced_nll(
    target: Transformer,
    draft: Transformer | None,
    sequences: list[list[int]],
    context: int,
    *,
    gamma: int = 4,
    hooks: list[SpecHooks | None] | SpecHooks | None = None,
    prefill_chunk: int = 2048,
) -> list[TeacherForcedResult] | TeacherForcedResult:
    """NLL under each policy in `hooks` (a list gives a list of results) of the tokens after the
    first `context` of equal-length sequences, in whole windows: [cur, t_1..t_gamma] is verified
    and t_1..t_gamma+1 scored, so floor((len - context) / (gamma + 1)) * (gamma + 1) tokens are
    scored (a partial last window would leave a policy's lookahead slots unfilled). The draft (if
    any) runs the same tokens so policies get their lookahead signals; it is skipped for a policy
    that wraps no draft backend (nothing of its passes is read)."""
    single = not isinstance(hooks, list)
    runs = [hooks] if single else hooks
    if len({len(s) for s in sequences}) != 1:
        raise DustinError("teacher-forced sequences must have equal lengths")
    total = len(sequences[0])
    if not gamma + 2 <= context <= total - (gamma + 1):
        raise DustinError(f"context {context} must be in [{gamma + 2}, {total - gamma - 1}] (at least one "
                          f"window of gamma + 1 = {gamma + 1} tokens after it)")
    if draft is None and any(h is not None and h.name != "full" for h in runs):
        raise DustinError("a verification policy needs the draft")
    asked, tp = len(sequences), target.tp  # tensor parallel: the draft runs this rank's rows of the batch
    if tp is not None and asked % tp.world:  # padded with copies of the last sequence, scored and dropped
        sequences = sequences + [sequences[-1]] * (-asked % tp.world)
    device, B = target.device, len(sequences)
    rows = slice(None) if tp is None else tp.rows(B)
    base = default_backend(device)
    prompts = [s[:context] for s in sequences]
    shared = context - 1 - (gamma + 1)  # rows every policy shares; the last gamma + 1 are its own
    capacity = total + gamma + 2
    tbase = target.allocate_cache(B, capacity)
    prefill(target, tbase, [p[: shared + 1] for p in prompts], base, chunk=prefill_chunk)
    dbase = None
    if draft is not None:
        dbase = draft.allocate_cache(len(prompts[rows]), capacity)
        prefill(draft, dbase, [p[: shared + 1] for p in prompts[rows]], base, chunk=prefill_chunk)
    results = []
    for h in runs:
        res = _run_one(target, draft, sequences, context, gamma, h or SpecHooks(), _copy(tbase),
                       None if dbase is None else _copy(dbase), shared, base)
        extra = {k: v[:asked] if k.endswith(PER_SEQUENCE) else v for k, v in res.extra.items()}
        results.append(TeacherForcedResult(res.nll[:asked], res.tokens[:asked], res.windows, extra,
                                           res.nll_by_offset[:asked]))
    return results[0] if single else results


def _run_one(target, draft, sequences, context, gamma, hooks, tcache, dcache, shared, base):
    device, B, total = target.device, len(sequences), len(sequences[0])
    rows = slice(None) if target.tp is None else target.tp.rows(B)
    hooks.setup(tcache, dcache, gamma)  # first: the backends a policy wraps depend on its setup
    t_backend = hooks.target_backend(base)
    d_backend = hooks.draft_backend(base) if draft is not None else None
    if d_backend is base:  # the policy reads nothing of the draft's passes: its tokens are the true ones anyway
        draft = None
    prompts = [s[:context] for s in sequences]
    tail = hooks.prefill_tail(gamma)
    prefill(target, tcache, prompts, t_backend, tail=tail, start=shared)
    if draft is not None:
        prefill(draft, dcache, prompts[rows], d_backend, tail=tail, start=shared)
    hooks.after_prefill()
    ids = torch.tensor(sequences, device=device)  # [B, total]
    nll = torch.zeros(B, gamma + 1, dtype=torch.float64, device=device)  # [B, w] by window offset
    count, windows, p = 0, 0, context - 1  # position of `cur`
    w = gamma + 1
    while p + w < total:
        window = ids[:, p : p + w]  # [B, w]: cur and the next w - 1 true tokens
        hooks.before_draft()
        if draft is not None:  # as the loop drafts: [prev, cur] from p - 1, then t_1 .. t_(gamma - 1)
            dcache.set_lengths(tcache.lengths[rows] - 1)
            draft(ids[rows, p - 1 : p + 1], dcache, d_backend, phase="draft", logits="none")
            dcache.advance(2)
            for i in range(1, gamma):
                draft(window[rows, i : i + 1], dcache, d_backend, phase="draft", logits="none")
                dcache.advance(1)
        hooks.drafted(window)
        hooks.before_verify()
        logits = target(window, tcache, t_backend, phase="verify")  # [B, w, V]
        targets = ids[:, p + 1 : p + 1 + w]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        nll -= lp.double()
        count += w
        advance = torch.full((B,), w, dtype=torch.int32, device=device)
        tcache.advance(advance)
        if dcache is not None:
            dcache.set_lengths(tcache.lengths[rows])
        hooks.after_verify(torch.full((B,), w - 1, device=device), advance)
        windows += 1
        p += w
    return TeacherForcedResult(nll.sum(1).cpu().tolist(), [count] * B, windows, hooks.summary(), nll.cpu().tolist())
