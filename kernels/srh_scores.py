"""Fused retrieval-head (SRH) scoring: softmax mass per context position, no [B, H, M, N] tensor.

score[b, n] = sum (or max) over selected heads h and queries m of
softmax_n(q[b, h, m] . k[b, kv_heads[h], n] * scale), n < cache_lens[b]; 0 beyond.

Two launches, one pass over the keys of the KV heads in use:
1. stats: program (h, split, b) keeps the running max and sum of exp of its chunk's logits per
   query and stores the logits (fp32, [B, Hs, M, N_max]: 4 M bytes per key position and head
   instead of re-reading the 2 D bytes of its key); the last program of each (b, h) to take a
   ticket combines the partial sums into a log-sum-exp.
2. scores: program (chunk, b) turns the stored logits into probabilities with the log-sum-exp and
   reduces over heads and queries into out[b, chunk].
Where the logits would need more than `LOGITS_MAX_BYTES` of scratch, pass 2 instead recomputes
them from the keys (a second pass over the keys; it walks the batch in reverse, so it starts on
the keys pass 1 left in L2).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from dustin_kernels._util import (
    cdiv,
    check_lens,
    check_out,
    next_pow2,
    num_sms,
    require,
    ticket_counters,
)

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)
LOGITS_MAX_BYTES = 1 << 30  # scratch for the stored logits; beyond it, two passes over the keys


@triton.jit
def _srh_stats_kernel(
    Q, KVH, K, LENS, LSE, WML, LOCKS, LG,
    qk_scale, chunk, n_splits, n_max,
    sqb, sqh, sqm, sqd,
    skb, skg, skn, skd,
    HS: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
    STORE_LOGITS: tl.constexpr = False,
):
    h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    DT: tl.constexpr = K.dtype.element_ty
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    mrow = rm < M
    dmask = rd < D
    qt = tl.load(Q + b64 * sqb + h * sqh + rm[None, :] * sqm + rd[:, None] * sqd,
                 mask=mrow[None, :] & dmask[:, None], other=0.0).to(tl.float32).to(DT)  # [BD, BM]
    g = tl.load(KVH + h)
    kb = K + b64 * skb + g.to(tl.int64) * skg
    L = tl.load(LENS + b)
    m_i = tl.full([BLOCK_M], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, L)
    for start in range(lo, hi, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        valid = rn < hi
        k = tl.load(kb + rn[:, None] * skn + rd[None, :] * skd, mask=valid[:, None] & dmask[None, :],
                    other=0.0).to(tl.float32)
        s = tl.dot(k.to(DT), qt, input_precision=PREC) * qk_scale  # [BN, BM]: keys as the MMA's M side
        if STORE_LOGITS:  # LG [B, HS, M, n_max]
            lp = LG + ((b64 * HS + h) * M + rm[None, :]) * n_max + rn[:, None]
            tl.store(lp, s, mask=valid[:, None] & mrow[None, :])
        s = tl.where(valid[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[None, :]), 0)
        m_i = m_new
    pair = b * HS + h
    if n_splits == 1:  # specialised at compile time
        tl.store(LSE + pair * BLOCK_M + rm, m_i + tl.log2(tl.where(mrow, l_i, 1.0)), mask=mrow)
    else:
        slot = (pair * n_splits + split).to(tl.int64) * (2 * BLOCK_M)
        tl.store(WML + slot + rm, m_i, mask=mrow)
        tl.store(WML + slot + BLOCK_M + rm, l_i, mask=mrow)
        tl.debug_barrier()  # every thread's partial is written before the ticket (release)
        ticket = tl.atomic_add(LOCKS + pair, 1, sem="acq_rel")
        if ticket == n_splits - 1:
            m_r = tl.full([BLOCK_M], NEG_BIG, tl.float32)
            l_r = tl.zeros([BLOCK_M], tl.float32)
            for s in range(n_splits):
                ws = (pair * n_splits + s).to(tl.int64) * (2 * BLOCK_M)
                m_s = tl.load(WML + ws + rm, mask=mrow, other=NEG_BIG, cache_modifier=".cg")
                l_s = tl.load(WML + ws + BLOCK_M + rm, mask=mrow, other=0.0, cache_modifier=".cg")
                m_n = tl.maximum(m_r, m_s)
                l_r = l_r * tl.exp2(m_r - m_n) + l_s * tl.exp2(m_s - m_n)
                m_r = m_n
            tl.store(LSE + pair * BLOCK_M + rm, m_r + tl.log2(tl.where(mrow, l_r, 1.0)), mask=mrow)
            tl.atomic_xchg(LOCKS + pair, 0)


@triton.jit
def _srh_score_kernel(
    Q, KVH, K, LENS, LSE, OUT,
    qk_scale, chunk, n_max, n_batch,
    sqb, sqh, sqm, sqd,
    skb, skg, skn, skd,
    sob, son,
    HS: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    REDUCE_MAX: tl.constexpr, ACCUMULATE: tl.constexpr, PREC: tl.constexpr,
):
    split = tl.program_id(0)
    b = n_batch - 1 - tl.program_id(1)  # reverse batch order: start where pass 1 ended (L2)
    b64 = b.to(tl.int64)
    DT: tl.constexpr = K.dtype.element_ty
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    mrow = rm < M
    dmask = rd < D
    L = tl.load(LENS + b)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_max)
    for start in range(lo, hi, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        valid = rn < L
        score = tl.zeros([BLOCK_N], tl.float32)
        for h in tl.static_range(HS):
            qt = tl.load(Q + b64 * sqb + h * sqh + rm[None, :] * sqm + rd[:, None] * sqd,
                         mask=mrow[None, :] & dmask[:, None], other=0.0).to(tl.float32).to(DT)  # [BD, BM]
            lse = tl.load(LSE + (b * HS + h) * BLOCK_M + rm, mask=mrow, other=float("inf"))
            kb = K + b64 * skb + tl.load(KVH + h).to(tl.int64) * skg
            k = tl.load(kb + rn[:, None] * skn + rd[None, :] * skd, mask=valid[:, None] & dmask[None, :],
                        other=0.0).to(tl.float32)
            s = tl.dot(k.to(DT), qt, input_precision=PREC) * qk_scale  # [BN, BM]
            p = tl.exp2(s - lse[None, :])  # padded query columns: lse = inf -> 0
            if REDUCE_MAX:
                score = tl.maximum(score, tl.max(p, 1))
            else:
                score += tl.sum(p, 1)
        score = tl.where(valid, score, 0.0)
        optrs = OUT + b64 * sob + rn * son
        omask = rn < hi
        if ACCUMULATE:
            prev = tl.load(optrs, mask=omask, other=0.0)
            if REDUCE_MAX:
                score = tl.maximum(prev, score)
            else:
                score = prev + score
        tl.store(optrs, score, mask=omask)


@triton.jit
def _srh_prob_kernel(
    LG, LENS, LSE, OUT, n_max, sob, son,
    HS: tl.constexpr, M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_MP: tl.constexpr, BLOCK_N: tl.constexpr,
    REDUCE_MAX: tl.constexpr, ACCUMULATE: tl.constexpr,
):
    """Pass 2 from stored logits: out[b, chunk] = sum/max over heads and queries of exp2(s - lse)."""
    b = tl.program_id(1)
    b64 = b.to(tl.int64)
    L = tl.load(LENS + b)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_MP)
    mrow = rm < M
    valid = rn < L
    score = tl.zeros([BLOCK_N], tl.float32)
    for h in tl.static_range(HS):
        lse = tl.load(LSE + (b * HS + h) * BLOCK_M + rm, mask=mrow, other=float("inf"))
        lp = LG + ((b64 * HS + h) * M + rm[:, None]) * n_max + rn[None, :]
        s = tl.load(lp, mask=mrow[:, None] & valid[None, :], other=float("-inf"))  # [BMP, BN]
        p = tl.exp2(s - lse[:, None])
        if REDUCE_MAX:
            score = tl.maximum(score, tl.max(p, 0))
        else:
            score += tl.sum(p, 0)
    score = tl.where(valid, score, 0.0)
    optrs = OUT + b64 * sob + rn * son
    omask = rn < n_max
    if ACCUMULATE:
        prev = tl.load(optrs, mask=omask, other=0.0)
        if REDUCE_MAX:
            score = tl.maximum(prev, score)
        else:
            score = prev + score
    tl.store(optrs, score, mask=omask)


def srh_scores(
    q: torch.Tensor,
    kv_heads: torch.Tensor,
    k_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    reduce: str = "sum",
    scale: float | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    store_logits: bool | None = None,
    pass2: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """Importance of every context position from the selected retrieval heads of one layer.

    q [B, Hs, M, D]: queries of the selected heads; kv_heads [Hs] int32: the KV head (index into
    G of k_cache [B, G, N_max, D]) each uses; cache_lens [B] int32. Returns out [B, N_max] fp32:
    sum (reduce="sum") or max (reduce="max") over heads and queries of the softmax over
    n < cache_lens[b] of q . k * scale (default 1/sqrt(D)); 0 for n >= cache_lens[b].
    accumulate=True adds into (sum) or maxes into (max) the given `out` instead, leaving entries
    n >= cache_lens[b] as they were. Reads only the keys of the KV heads used: once, or twice where
    the stored logits would exceed `LOGITS_MAX_BYTES`.
    Query heads that share a KV head are best passed as one head with their queries stacked
    (M = heads x queries: the same softmax rows, the keys read once for all of them).
    store_logits: None picks the cheaper pass 2 (stored fp32 logits cost 8 M bytes per key and
    head, re-reading the key D x element bytes); True / False force it (tests, probes).
    pass2 (block_n, num_warps, num_stages, programs per sequence) tunes the second key pass
    separately (default: pass 1's settings, 4 x SMs / B programs).
    """
    require(reduce in ("sum", "max"), f"reduce must be 'sum' or 'max', got {reduce!r}")
    require(q.dim() == 4, f"q must be [B, Hs, M, D], got {list(q.shape)}")
    B, HS, M, D = q.shape
    require(k_cache.dim() == 4 and k_cache.shape[0] == B and k_cache.shape[3] == D,
            f"k_cache must be [B={B}, G, N_max, D={D}], got {list(k_cache.shape)}")
    require(k_cache.dtype == q.dtype, "q and k_cache must share a dtype")
    require(q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}")
    require(kv_heads.dtype == torch.int32 and tuple(kv_heads.shape) == (HS,),
            f"kv_heads must be int32 [{HS}], got {kv_heads.dtype} {list(kv_heads.shape)}")
    require(kv_heads.device == q.device, "kv_heads must be on the same device as q")
    check_lens(cache_lens, B, q.device)
    require(not accumulate or out is not None, "accumulate=True needs out")
    N = k_cache.shape[2]
    out = check_out(out, (B, N), torch.float32, q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    BLOCK_M = max(16, next_pow2(M))
    BLOCK_D = max(16, next_pow2(D))
    if block_n is None:  # measured on the H200 (results/bench/probe-srh-*.json): 128 for stacked query heads
        block_n = 128 if BLOCK_M >= 32 else 64
    if num_warps is None:
        num_warps = 4
    if num_stages is None:
        num_stages = 3
    if num_splits is None:
        num_splits = max(1, min(cdiv(4 * num_sms(q.device), B * HS), cdiv(N, block_n)))
    chunk = cdiv(cdiv(N, num_splits), block_n) * block_n
    splits = cdiv(N, chunk)
    lse = torch.empty(B * HS * BLOCK_M, dtype=torch.float32, device=q.device)
    wml = torch.empty(B * HS * splits * 2 * BLOCK_M if splits > 1 else 1, dtype=torch.float32, device=q.device)
    locks = ticket_counters(q.device, B * HS) if splits > 1 else lse
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    qk_scale = scale * LOG2E
    logits_bytes = B * HS * M * N * 4
    if store_logits is None:
        store_logits = 8 * M <= D * k_cache.element_size()
    store_logits = bool(store_logits) and logits_bytes <= LOGITS_MAX_BYTES
    lg = torch.empty(B * HS * M * N if store_logits else 1, dtype=torch.float32, device=q.device)
    _srh_stats_kernel[(HS, splits, B)](
        q, kv_heads, k_cache, cache_lens, lse, wml, locks, lg, qk_scale, chunk, splits, N,
        *q.stride(), *k_cache.stride(),
        HS=HS, M=M, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D, PREC=prec,
        STORE_LOGITS=store_logits, num_warps=num_warps, num_stages=num_stages,
    )
    if store_logits:
        block_p = 512
        _srh_prob_kernel[(cdiv(N, block_p), B)](
            lg, cache_lens, lse, out, N, *out.stride(),
            HS=HS, M=M, BLOCK_M=BLOCK_M, BLOCK_MP=next_pow2(M), BLOCK_N=block_p,
            REDUCE_MAX=reduce == "max", ACCUMULATE=accumulate, num_warps=4,
        )
        return out
    bn2, w2, st2, p2 = pass2 or (block_n, num_warps, num_stages, cdiv(4 * num_sms(q.device), B))
    chunk2 = cdiv(cdiv(N, max(1, min(p2, cdiv(N, bn2)))), bn2) * bn2
    _srh_score_kernel[(cdiv(N, chunk2), B)](
        q, kv_heads, k_cache, cache_lens, lse, out, qk_scale, chunk2, N, B,
        *q.stride(), *k_cache.stride(), *out.stride(),
        HS=HS, M=M, D=D, BLOCK_M=BLOCK_M, BLOCK_N=bn2, BLOCK_D=BLOCK_D,
        REDUCE_MAX=reduce == "max", ACCUMULATE=accumulate, PREC=prec,
        num_warps=w2, num_stages=st2,
    )
    return out
