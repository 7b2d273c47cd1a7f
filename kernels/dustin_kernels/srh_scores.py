"""Fused retrieval-head (SRH) scoring: softmax mass per context position, no [B, H, M, N] tensor.

score[b, n] = sum (or max) over selected heads h and queries m of
softmax_n(q[b, h, m] . k[b, kv_heads[h], n] * scale), n < cache_lens[b]; 0 beyond.

Two launches, one pass over the keys of the KV heads in use:
1. stats: program (h, split, b) walks its chunk of keys in blocks; per block and query it takes
   the block's max logit c and p~ = exp2(s - c) (in (0, 1]), keeps the running max and sum, and
   (where few queries make that cheaper than re-reading the keys) stores p~ ([B, Hs, blocks, M, BLOCK_N]: each block's tile contiguous, so no power-of-two row
   stride sends a tile's rows to one memory channel; fp16 for 16-bit inputs: 2 M bytes per key and head instead of
   re-reading the key's 2 D bytes; fp32 for fp32 inputs) and c ([B, Hs, blocks, BLOCK_M]); the last
   program of each (b, h) to take a ticket combines the partial sums into a log-sum-exp (lse).
2. scores: program (blocks, b) weights each block's p~ by exp2(c - lse) and reduces over heads and
   queries into out[b, n].
Otherwise (many stacked queries, or more than `PROBS_MAX_BYTES` of scratch) pass 2 recomputes the
logits from the keys: a second pass over the keys, heads outer so each program loads a head's
queries once; it walks the batch in reverse, starting on the keys pass 1 left in L2. At the
runtime's 72B shape (40 stacked queries) both passes run at ~90% of copy bandwidth.
fp16 p~ carries a relative error <= 2^-11 per term (values below 2^-14 of their block's max keep
an absolute error <= 2^-25 of it): scores agree with the fp32 reference to ~5e-4.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dustin_kernels import _util as u

NEG_BIG = tl.constexpr(-1.0e30)
PROBS_MAX_BYTES = 1 << 30  # scratch for the stored probabilities; beyond it, two passes over the keys


@triton.jit
def _tile(M, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Query rows and head-dim lanes of a program's tile, and their masks."""
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    return rm, rd, rm < M, rd < D


@triton.jit
def _srh_stats_kernel(
    Q, KVH, K, LENS, LSE, WML, LOCKS, PR, CB,
    qk_scale, chunk, n_splits, n_blocks,
    sqb, sqh, sqm, sqd,
    skb, skg, skn, skd,
    HS: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
    STORE: tl.constexpr = False, QROWS: tl.constexpr = False, PSTRIDE: tl.constexpr = 1,
):
    h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    DT: tl.constexpr = K.dtype.element_ty
    rm, rd, mrow, dmask = _tile(M, D, BLOCK_M, BLOCK_D)
    qb = Q + b64 * sqb + h * sqh
    if QROWS:  # queries as the MMA's M side (>= 64 rows): the per-query reductions stay in a thread
        qm = tl.load(qb + rm[:, None] * sqm + rd[None, :] * sqd,
                     mask=mrow[:, None] & dmask[None, :], other=0.0).to(tl.float32).to(DT)  # [BM, BD]
    else:  # keys as the M side ([BN, D] x [D, BM]): few queries still fill the MMA
        qt = tl.load(qb + rm[None, :] * sqm + rd[:, None] * sqd,
                     mask=mrow[None, :] & dmask[:, None], other=0.0).to(tl.float32).to(DT)  # [BD, BM]
    g = tl.load(KVH + h)
    kb = K + b64 * skb + g.to(tl.int64) * skg
    L = tl.load(LENS + b)
    pair = b * HS + h
    m_i = tl.full([BLOCK_M], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, L)
    for start in range(lo, hi, BLOCK_N):  # chunk is a multiple of BLOCK_N: blocks are global
        rn = start + tl.arange(0, BLOCK_N)
        valid = rn < hi
        k = tl.load(kb + rn[:, None] * skn + rd[None, :] * skd, mask=valid[:, None] & dmask[None, :],
                    other=0.0).to(tl.float32)
        if QROWS:
            s = tl.dot(qm, tl.trans(k.to(DT)), input_precision=PREC) * qk_scale  # [BM, BN], log2 units
            s = tl.where(valid[None, :], s, float("-inf"))
            c = tl.max(s, 1)  # [BM]: every block holds a valid key
            p = tl.exp2(s - c[:, None])
            psum = tl.sum(p, 1)
        else:
            s = tl.dot(k.to(DT), qt, input_precision=PREC) * qk_scale  # [BN, BM]
            s = tl.where(valid[:, None], s, float("-inf"))
            c = tl.max(s, 0)
            p = tl.exp2(s - c[None, :])
            psum = tl.sum(p, 0)
        if STORE:  # PR [B, HS, n_blocks, M, PSTRIDE >= BLOCK_N]: one contiguous tile per block; CB [B, HS, n_blocks, BLOCK_M]
            blk = start // BLOCK_N
            tile = PR + ((b64 * HS + h) * n_blocks + blk) * (M * PSTRIDE)
            rj = tl.arange(0, BLOCK_N)
            if QROWS:
                tl.store(tile + rm[:, None] * PSTRIDE + rj[None, :], p.to(PR.dtype.element_ty),
                         mask=mrow[:, None] & valid[None, :])
            else:
                tl.store(tile + rm[None, :] * PSTRIDE + rj[:, None], p.to(PR.dtype.element_ty),
                         mask=valid[:, None] & mrow[None, :])
            tl.store(CB + ((b64 * HS + h) * n_blocks + blk) * BLOCK_M + rm, c)
        m_new = tl.maximum(m_i, c)
        l_i = l_i * tl.exp2(m_i - m_new) + psum * tl.exp2(c - m_new)
        m_i = m_new
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
def _fold(prev, score, REDUCE_MAX: tl.constexpr):
    """Combine a score with what is already there: max or sum."""
    if REDUCE_MAX:
        return tl.maximum(prev, score)
    return prev + score


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
    rm, rd, mrow, dmask = _tile(M, D, BLOCK_M, BLOCK_D)
    L = tl.load(LENS + b)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_max)
    for h in tl.static_range(HS):  # heads outer: each head's queries loaded once per program
        qt = tl.load(Q + b64 * sqb + h * sqh + rm[None, :] * sqm + rd[:, None] * sqd,
                     mask=mrow[None, :] & dmask[:, None], other=0.0).to(tl.float32).to(DT)  # [BD, BM]
        lse = tl.load(LSE + (b * HS + h) * BLOCK_M + rm, mask=mrow, other=float("inf"))
        kb = K + b64 * skb + tl.load(KVH + h).to(tl.int64) * skg
        for start in range(lo, hi, BLOCK_N):
            rn = start + tl.arange(0, BLOCK_N)
            valid = rn < L
            k = tl.load(kb + rn[:, None] * skn + rd[None, :] * skd, mask=valid[:, None] & dmask[None, :],
                        other=0.0).to(tl.float32)
            s = tl.dot(k.to(DT), qt, input_precision=PREC) * qk_scale  # [BN, BM]
            p = tl.exp2(s - lse[None, :])  # padded query columns: lse = inf -> 0
            if REDUCE_MAX:
                score = tl.max(p, 1)
            else:
                score = tl.sum(p, 1)
            score = tl.where(valid, score, 0.0)
            optrs = OUT + b64 * sob + rn * son
            omask = rn < hi
            if ACCUMULATE or h > 0:  # later heads add to what this program stored for the earlier ones
                score = _fold(tl.load(optrs, mask=omask, other=0.0), score, REDUCE_MAX)
            tl.store(optrs, score, mask=omask)
        if h + 1 < HS:
            tl.debug_barrier()  # this program's stores are visible to its own threads before the next head


@triton.jit
def _srh_prob_kernel(
    PR, CB, LENS, LSE, OUT, n_max, n_blocks, blocks_per_prog, sob, son,
    HS: tl.constexpr, M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_MP: tl.constexpr, BLOCK_N: tl.constexpr,
    PSTRIDE: tl.constexpr, REDUCE_MAX: tl.constexpr, ACCUMULATE: tl.constexpr,
):
    """Pass 2 from stored probabilities: out[b, n] = sum/max over heads and queries of
    p~[n] * exp2(c[block(n)] - lse), blocks_per_prog pass-1 blocks per program."""
    b = tl.program_id(1)
    b64 = b.to(tl.int64)
    L = tl.load(LENS + b)
    rm = tl.arange(0, BLOCK_MP)
    mrow = rm < M
    blk0 = tl.program_id(0) * blocks_per_prog
    for blk in range(blk0, tl.minimum(blk0 + blocks_per_prog, n_blocks)):
        rn = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = rn < L
        live = blk * BLOCK_N < L  # pass 1 wrote this block's c
        score = tl.zeros([BLOCK_N], tl.float32)
        for h in tl.static_range(HS):
            lse = tl.load(LSE + (b * HS + h) * BLOCK_M + rm, mask=mrow, other=float("inf"))
            c = tl.load(CB + ((b64 * HS + h) * n_blocks + blk) * BLOCK_M + rm, mask=mrow, other=float("-inf"))
            w = tl.exp2(tl.where(live, c, float("-inf")) - lse)  # [BMP]: 0 on padded queries and unwritten blocks
            tile = PR + ((b64 * HS + h) * n_blocks + blk) * (M * PSTRIDE)
            pp = tile + rm[:, None] * PSTRIDE + tl.arange(0, BLOCK_N)[None, :]
            p = tl.load(pp, mask=mrow[:, None] & valid[None, :], other=0.0).to(tl.float32) * w[:, None]  # [BMP, BN]
            if REDUCE_MAX:
                score = tl.maximum(score, tl.max(p, 0))
            else:
                score += tl.sum(p, 0)
        score = tl.where(valid, score, 0.0)
        optrs = OUT + b64 * sob + rn * son
        omask = rn < n_max
        if ACCUMULATE:
            score = _fold(tl.load(optrs, mask=omask, other=0.0), score, REDUCE_MAX)
        tl.store(optrs, score, mask=omask)


def srh_scores(
    q: torch.Tensor,
    kv_heads: torch.Tensor,
    k_cache: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    reduce: str = "sum",
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    store_probs: bool | None = None,
    queries_as_m: bool | None = None,
    counters: str = "srh",
    sms: int | None = None,
) -> torch.Tensor:
    """Importance of every context position from the selected retrieval heads of one layer.

    q [B, Hs, M, D]: queries of the selected heads; kv_heads [Hs] int32: the KV head (index into
    G of k_cache [B, G, N_max, D]) each uses; cache_lens [B] int32. Returns out [B, N_max] fp32:
    sum (reduce="sum") or max (reduce="max") over heads and queries of the softmax over
    n < cache_lens[b] of q . k / sqrt(D); 0 for n >= cache_lens[b].
    accumulate=True adds into (sum) or maxes into (max) the given `out` instead, leaving entries
    n >= cache_lens[b] as they were. Reads only the keys of the KV heads used: once, or twice where
    the stored probabilities would exceed `PROBS_MAX_BYTES`.
    Query heads that share a KV head are best passed as one head with their queries stacked
    (M = heads x queries: the same softmax rows, the keys read once for all of them).
    store_probs: None stores the probabilities where they are at most a quarter of the key bytes
    (4 M x their element size <= D x the keys'; storing slows pass 1 down, measured on the H200),
    else pass 2 re-reads the keys; True / False force either path. queries_as_m: which operand is
    the MMA's M side in pass 1 (default: the queries from 64 rows up). Pass 2 runs with pass 1's
    block, warps and stages over 4 x SMs / B programs per sequence (16 x SMs / B from stored
    probabilities). counters: the namespace of the split combine's ticket counters
    (`_util.ticket_counters`): launches that may run at the same time on different streams take
    different names. sms: size the grids for a GPU of this many SMs (default: the device's); a scoring
    that runs beside latency-bound kernels on another stream leaves them the rest. A stored tile's
    rows are one element longer than the block: an unaligned row is stored straight from the MMA
    layout, ~1.8x faster than a vectorised store after a shared-memory shuffle (measured on the H200).
    """
    u.require(reduce in ("sum", "max"), f"reduce must be 'sum' or 'max', got {reduce!r}")
    u.require(q.dim() == 4, f"q must be [B, Hs, M, D], got {list(q.shape)}")
    B, HS, M, D = q.shape
    u.require(k_cache.dim() == 4 and k_cache.shape[0] == B and k_cache.shape[3] == D,
            f"k_cache must be [B={B}, G, N_max, D={D}], got {list(k_cache.shape)}")
    u.require(k_cache.dtype == q.dtype, "q and k_cache must share a dtype")
    u.require(q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}")
    u.require(kv_heads.dtype == torch.int32 and tuple(kv_heads.shape) == (HS,),
            f"kv_heads must be int32 [{HS}], got {kv_heads.dtype} {list(kv_heads.shape)}")
    u.require(kv_heads.device == q.device and kv_heads.is_contiguous(), "kv_heads must be contiguous, on q's device")
    u.check_lens(cache_lens, B, q.device)
    u.require(not accumulate or out is not None, "accumulate=True needs out")
    N = k_cache.shape[2]
    out = u.check_out(out, (B, N), torch.float32, q.device)
    scale = 1.0 / math.sqrt(D)
    BLOCK_M = max(16, u.next_pow2(M))
    BLOCK_D = max(16, u.next_pow2(D))
    if block_n is None:  # measured on the H200 (kernels/NOTES.md): 128 at 5 and at 40 queries
        block_n = 128
    if num_warps is None:
        num_warps = 4
    if num_stages is None:
        num_stages = 3
    if queries_as_m is None:
        queries_as_m = BLOCK_M >= 64
    n_sm = u.num_sms(q.device) if sms is None else max(1, int(sms))
    if num_splits is None:
        num_splits = max(1, min(u.cdiv(4 * n_sm, B * HS), u.cdiv(N, block_n)))
    chunk = u.cdiv(u.cdiv(N, num_splits), block_n) * block_n
    splits = u.cdiv(N, chunk)
    n_blocks = u.cdiv(N, block_n)
    lse = torch.empty(B * HS * BLOCK_M, dtype=torch.float32, device=q.device)
    wml = torch.empty(B * HS * splits * 2 * BLOCK_M if splits > 1 else 1, dtype=torch.float32, device=q.device)
    locks = u.ticket_counters(q.device, B * HS, counters) if splits > 1 else lse
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    qk_scale = scale * u.LOG2E
    p_dtype = torch.float32 if q.dtype == torch.float32 else torch.float16
    p_size = torch.finfo(p_dtype).bits // 8
    if store_probs is None:  # measured (kernels/NOTES.md): with stores pass 1 runs at ~60% of bandwidth, ~90% without
        store_probs = 4 * M * p_size <= D * k_cache.element_size()
    pstride = block_n + 1  # unaligned rows: stored straight from the MMA layout
    store_probs = bool(store_probs) and B * HS * M * n_blocks * pstride * p_size <= PROBS_MAX_BYTES
    pr = torch.empty(B * HS * M * n_blocks * pstride if store_probs else 1, dtype=p_dtype, device=q.device)
    cb = torch.empty(B * HS * n_blocks * BLOCK_M if store_probs else 1, dtype=torch.float32, device=q.device)
    _srh_stats_kernel[(HS, splits, B)](
        q, kv_heads, k_cache, cache_lens, lse, wml, locks, pr, cb, qk_scale, chunk, splits, n_blocks,
        *q.stride(), *k_cache.stride(),
        HS=HS, M=M, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D, PREC=prec,
        STORE=store_probs, QROWS=bool(queries_as_m), PSTRIDE=pstride, num_warps=num_warps, num_stages=num_stages,
    )
    p2 = u.cdiv((16 if store_probs else 4) * n_sm, B)  # stored: a few blocks per program
    if store_probs:
        per_prog = u.cdiv(n_blocks, max(1, min(p2, n_blocks)))
        _srh_prob_kernel[(u.cdiv(n_blocks, per_prog), B)](
            pr, cb, cache_lens, lse, out, N, n_blocks, per_prog, *out.stride(),
            HS=HS, M=M, BLOCK_M=BLOCK_M, BLOCK_MP=u.next_pow2(M), BLOCK_N=block_n, PSTRIDE=pstride,
            REDUCE_MAX=reduce == "max", ACCUMULATE=accumulate, num_warps=num_warps, num_stages=num_stages,
        )
        return out
    chunk2 = u.cdiv(u.cdiv(N, max(1, min(p2, u.cdiv(N, block_n)))), block_n) * block_n
    _srh_score_kernel[(u.cdiv(N, chunk2), B)](
        q, kv_heads, k_cache, cache_lens, lse, out, qk_scale, chunk2, N, B,
        *q.stride(), *k_cache.stride(), *out.stride(),
        HS=HS, M=M, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D,
        REDUCE_MAX=reduce == "max", ACCUMULATE=accumulate, PREC=prec,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
