"""Per-layer, per-KV-head sets from a pool: each (sequence, KV head) keeps the S rows of its pool that
its current queries attend most.

out[b, g] = the pool rows of pool[b] (sorted, -1 padded) with the S largest
    mass[n] = sum over the KV head's query heads h and queries m of softmax_n(q[b, h, m] . k[b, g, n] * scale)
(softmax over the pool's rows only), every sink (row < sinks) and window row (row >= cache_lens[b] -
window) kept first; sorted ascending, -1 padded. A pool of at most S rows is copied.

Two launches over a grid of (chunk of the pool, KV head, sequence), ~4 programs per SM (one program
per (b, g) left 12.8% of full attention's time over 80 layers at the 72B shape, 0.55 TB/s: too few
programs for the GPU):
1. stats: each program walks its chunk of the pool's keys in blocks for each stacked query's (every
   query head of the KV head x every query) running max and sum;
2. mass: each program combines every chunk's stats into the softmax's max and sum over the whole
   pool, walks its chunk's keys again (from L2) for the probabilities summed over the queries, and
   stores them in a scratch row; the last program of (b, g) to take a ticket (`_util.ticket_counters`,
   namespace "pool") holds the pool's P masses in registers, takes the exact top S with a bitwise
   threshold search (`select._topk_mask`, ties to the lower pool slot, i.e. the lower row) and writes
   the chosen rows in pool order through a prefix count.
Reads the pool's keys twice per KV head; the attention that follows reads S keys and values.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from dustin_kernels._util import (
    LOG2E,
    cdiv,
    check_lens,
    check_out,
    next_pow2,
    num_sms,
    require,
    ticket_counters,
)
from dustin_kernels.select import _topk_mask, _ukey

POOL_MAX = 8192


@triton.jit
def _logits(Q_T, kb, rows, valid, rd, dmask, skn, skd, qk_scale, DT: tl.constexpr, PREC: tl.constexpr):
    """[BLOCK_N, BLOCK_R] logits (log2 units) of a block of pool keys against the stacked queries."""
    k = tl.load(kb + rows.to(tl.int64)[:, None] * skn + rd[None, :] * skd, mask=valid[:, None] & dmask[None, :],
                other=0.0).to(tl.float32)
    s = tl.dot(k.to(DT), Q_T, input_precision=PREC) * qk_scale
    return tl.where(valid[:, None], s, float("-inf"))


@triton.jit
def _queries(Q, b64, g, rr, rd, sqb, sqh, sqm, sqd, HG: tl.constexpr, M: tl.constexpr, D: tl.constexpr, DT: tl.constexpr):
    """[BLOCK_D, BLOCK_R] stacked queries of KV head g: row r is query head g * HG + r // M, query r % M."""
    rmask = rr < HG * M
    dmask = rd < D
    qp = Q + b64 * sqb + (g * HG + rr // M).to(tl.int64)[None, :] * sqh + (rr % M)[None, :] * sqm + rd[:, None] * sqd
    return tl.load(qp, mask=rmask[None, :] & dmask[:, None], other=0.0).to(tl.float32).to(DT), dmask


@triton.jit
def _pool_stats_kernel(
    Q, K, POOL, ML,
    sqb, sqh, sqm, sqd,
    skb, skg, skn, skd,
    spb, P, chunk, qk_scale,
    HG: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):
    """Pass 1: each stacked query's max and sum over this program's chunk of the pool."""
    split = tl.program_id(0)
    g = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    DT: tl.constexpr = K.dtype.element_ty
    rr = tl.arange(0, BLOCK_R)
    rd = tl.arange(0, BLOCK_D)
    q_t, dmask = _queries(Q, b64, g, rr, rd, sqb, sqh, sqm, sqd, HG, M, D, DT)
    kb = K + b64 * skb + g.to(tl.int64) * skg
    pb = POOL + b64 * spb
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    lo = split * chunk
    for start in range(lo, tl.minimum(lo + chunk, P), BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        rows = tl.load(pb + rn, mask=rn < P, other=-1)
        s = _logits(q_t, kb, rows, rows >= 0, rd, dmask, skn, skd, qk_scale, DT, PREC)
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[None, :]), 0)
        m_i = m_new
    slot = ML + ((b64 * tl.num_programs(1) + g) * tl.num_programs(0) + split) * (2 * BLOCK_R)
    tl.store(slot + rr, m_i)
    tl.store(slot + BLOCK_R + rr, l_i)


@triton.jit
def _pool_mass_kernel(
    Q, K, POOL, LENS, OUT, MASS, ML, LOCKS,
    sqb, sqh, sqm, sqd,
    skb, skg, skn, skd,
    spb, sob, sog,
    P, S, chunk, sinks, window, qk_scale,
    HG: tl.constexpr, M: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    PREC: tl.constexpr,
):
    """Pass 2: the chunk's masses from every chunk's stats; the last program of (b, g) to take a
    ticket selects over the whole pool."""
    split = tl.program_id(0)
    g = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    pair = b64 * tl.num_programs(1) + g
    DT: tl.constexpr = K.dtype.element_ty
    rr = tl.arange(0, BLOCK_R)
    rd = tl.arange(0, BLOCK_D)
    q_t, dmask = _queries(Q, b64, g, rr, rd, sqb, sqh, sqm, sqd, HG, M, D, DT)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    for j in range(SPLITS):  # the softmax's max and sum over the whole pool, from every chunk's
        slot = ML + (pair * SPLITS + j) * (2 * BLOCK_R)
        m_j = tl.load(slot + rr)
        l_j = tl.load(slot + BLOCK_R + rr)
        m_new = tl.maximum(m_i, m_j)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + l_j * tl.exp2(m_j - m_safe)
        m_i = m_new
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    inv_l = tl.where((rr < HG * M) & (l_i > 0), 1.0 / tl.where(l_i > 0, l_i, 1.0), 0.0)  # padded rows weigh 0
    kb = K + b64 * skb + g.to(tl.int64) * skg
    pb = POOL + b64 * spb
    mb = MASS + pair * BLOCK_P
    lo = split * chunk
    for start in range(lo, tl.minimum(lo + chunk, P), BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        rows = tl.load(pb + rn, mask=rn < P, other=-1)
        s = _logits(q_t, kb, rows, rows >= 0, rd, dmask, skn, skd, qk_scale, DT, PREC)
        tl.store(mb + rn, tl.sum(tl.exp2(s - m_safe[None, :]) * inv_l[None, :], 1), mask=rn < P)
    tl.debug_barrier()  # this program's masses are written before its ticket (release)
    last = True
    if SPLITS > 1:
        last = tl.atomic_add(LOCKS + pair, 1, sem="acq_rel") == SPLITS - 1
    if last:
        if SPLITS > 1:
            tl.atomic_xchg(LOCKS + pair, 0)  # zero between launches
        L = tl.load(LENS + b)
        rp = tl.arange(0, BLOCK_P)
        rows = tl.load(pb + rp, mask=rp < P, other=-1)
        valid = rows >= 0
        fixed = valid & ((rows < sinks) | (rows >= L - window))
        mass = tl.load(mb + rp, mask=rp < P, other=0.0, cache_modifier=".cg")
        key = tl.where(fixed, 0xFFFFFFFF, _ukey(mass))
        k = tl.minimum(S, tl.sum(valid.to(tl.int32), 0))
        chosen = _topk_mask(key, valid, k)
        ic = chosen.to(tl.int32)
        ob = OUT + b64 * sob + g.to(tl.int64) * sog
        tl.store(ob + tl.cumsum(ic, 0) - ic, rows, mask=chosen)  # in pool order: ascending rows
        for start in range(0, S, BLOCK_N):
            rs = start + tl.arange(0, BLOCK_N)
            tl.store(ob + rs, tl.full([BLOCK_N], -1, tl.int32), mask=(rs >= k) & (rs < S))


def pool_select(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    pool: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    budget: int,
    sinks: int,
    window: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    scratch: torch.Tensor | None = None,
    block_n: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """Each KV head's S = `budget` rows of the pool its queries attend most.

    q [B, H, M, D] (the layer's queries; H a multiple of G), k_cache [B, G, N_max, D], pool [B, P]
    int32 context rows (ascending, -1 padded; P >= 1), cache_lens [B] int32 (the context length the
    sinks and window refer to). Returns out [B, G, S] int32: the pool rows with the most softmax mass
    (over the pool's rows, scale default 1/sqrt(D)) summed over the KV head's query heads and
    queries, every sink (< sinks) and window row (>= cache_lens - window) of the pool first;
    ascending, -1 padded. Requires sinks + window <= S. num_splits: programs per (b, g), each a chunk
    of the pool (default ~4 programs per SM in all); scratch: the masses' buffer (fp32, >= B x G x
    next_pow2(P) elements; default a new one)."""
    require(q.dim() == 4 and k_cache.dim() == 4, f"q and k_cache must be 4-D, got {list(q.shape)}, {list(k_cache.shape)}")
    B, H, M, D = q.shape
    G = k_cache.shape[1]
    require(k_cache.shape[0] == B and k_cache.shape[3] == D and G >= 1 and H % G == 0,
            f"k_cache must be [B={B}, G | {H}, N_max, D={D}], got {list(k_cache.shape)}")
    require(q.dtype == k_cache.dtype and q.dtype in (torch.float16, torch.bfloat16, torch.float32),
            f"q and k_cache must share a float dtype, got {q.dtype}, {k_cache.dtype}")
    require(q.device == k_cache.device, "q and k_cache must be on one device")
    require(pool.dtype == torch.int32 and pool.dim() == 2 and pool.shape[0] == B and pool.shape[1] >= 1,
            f"pool must be int32 [B={B}, P>=1], got {pool.dtype} {list(pool.shape)}")
    require(pool.device == q.device and pool.stride(1) == 1, "pool must be on q's device with unit row stride")
    check_lens(cache_lens, B, q.device)
    require(budget >= 1 and sinks >= 0 and window >= 0 and sinks + window <= budget,
            f"need budget >= 1 and 0 <= sinks + window <= budget, got {budget}, {sinks}, {window}")
    out = check_out(out, (B, G, budget), torch.int32, q.device)
    require(out.stride(2) == 1, "out must have unit stride in its last dimension")
    P = pool.shape[1]
    require(P <= POOL_MAX, f"pools of up to {POOL_MAX} rows are held in registers, got {P}")
    BLOCK_P = max(16, next_pow2(P))
    if num_splits is None:  # ~4 programs per SM in all, each at least one block of the pool
        num_splits = max(1, min(cdiv(4 * num_sms(q.device), B * G), cdiv(P, block_n)))
    chunk = cdiv(cdiv(P, num_splits), block_n) * block_n
    splits = cdiv(P, chunk)
    BLOCK_R = max(16, next_pow2(H // G * M))
    if scratch is None:
        scratch = torch.empty(B * G * BLOCK_P, dtype=torch.float32, device=q.device)
    require(scratch.dtype == torch.float32 and scratch.is_contiguous() and scratch.numel() >= B * G * BLOCK_P
            and scratch.device == q.device, f"scratch must be contiguous fp32 of >= {B * G * BLOCK_P} elements on q's device")
    mass = scratch
    ml = torch.empty(B * G * splits * 2 * BLOCK_R, dtype=torch.float32, device=q.device)
    locks = ticket_counters(q.device, B * G, "pool") if splits > 1 else mass
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    common = dict(HG=H // G, M=M, D=D, BLOCK_R=BLOCK_R, BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(D)),
                  PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps)
    grid = (splits, G, B)
    _pool_stats_kernel[grid](q, k_cache, pool, ml, *q.stride(), *k_cache.stride(), pool.stride(0), P, chunk,
                             scale * LOG2E, **common)
    _pool_mass_kernel[grid](
        q, k_cache, pool, cache_lens, out, mass, ml, locks,
        *q.stride(), *k_cache.stride(), pool.stride(0), out.stride(0), out.stride(1),
        P, budget, chunk, sinks, window, scale * LOG2E, SPLITS=splits, BLOCK_P=BLOCK_P, **common,
    )
    return out
