"""Selection of the verification set: sinks + recent window + top-m by one score + fill by another.

Exact radix select on order-preserving uint32 keys of the fp32 scores: four 8-bit passes, each a
histogram of the next digit among the candidates that share the prefix found so far, give the
k-th largest key T and how many entries equal to T to take (the lowest positions first). A last
pass marks the chosen positions and writes them in ascending order through prefix counts.
No sort, no [B, N] temporary, one launch.

Each row is split over P programs (P = SMs // B, so the grid fits on the GPU at once; P = 1 in
the interpreter). After each pass the P programs of a row add their histograms into a global one
and meet at a barrier (an atomic counter they spin on); every program then derives the same
digit. A row's scratch (counters, histograms, per-program counts) is zeroed again by the last
program to leave, so it is zero between launches (`_util.ticket_counters`, namespace "select").
The barrier relies on all P programs of a row being resident together, which holds when nothing
else occupies the GPU's multiprocessors (the usual single-stream decode step).
"""

from __future__ import annotations

import os

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

NBINS = tl.constexpr(256)


@triton.jit
def _ukey(x):
    """fp32 -> uint32 whose unsigned order is the float order."""
    u = x.to(tl.uint32, bitcast=True)
    return u ^ tl.where((u >> 31) == 1, 0xFFFFFFFF, 0x80000000)


@triton.jit
def _barrier(CNT, target, P: tl.constexpr):
    """Wait until the P programs of this row have all arrived `target // P` times in total."""
    if P > 1:
        tl.debug_barrier()  # this program's global writes (histogram atomics, counts) come first
        seen = tl.atomic_add(CNT, 1, sem="acq_rel") + 1
        while seen < target:  # a scalar atomic: one thread per program polls, not all of them
            seen = tl.atomic_add(CNT, 0, sem="acquire")
        tl.debug_barrier()


@triton.jit
def _sum_before(CNTS, p, P: tl.constexpr):
    """Sum of the per-program counts of programs 0..p-1 of this row (after a barrier)."""
    rp = tl.arange(0, P)
    c = tl.load(CNTS + rp, mask=rp < p, other=0, cache_modifier=".cg")
    return tl.sum(c, 0)


@triton.jit
def _radix_select(X, E, lo, hi, k, T_e, k_e, e_off, HIST, CNT, n_bar, P: tl.constexpr,
                  EXCLUDE: tl.constexpr, BLOCK: tl.constexpr):
    """k-th largest key of X[lo:hi] over the row (excluding the entries of E chosen by (T_e, k_e)).

    [lo, hi) is this program's slice; the histograms are summed over the row's P programs.
    Returns (T, k_eq, n_eq, n_bar): the threshold key, how many entries equal to T belong to the
    top k, how many candidates equal T, and the barrier count so far. k = 0 gives T = 0xFFFFFFFF,
    k_eq = 0: nothing selected.
    """
    prefix = tl.zeros([], tl.uint32)
    bins = tl.arange(0, NBINS)
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        hist = tl.zeros([NBINS], tl.int32)
        e_before = e_off
        for start in range(lo, hi, BLOCK):
            n = start + tl.arange(0, BLOCK)
            cand = n < hi
            key = _ukey(tl.load(X + n, mask=cand, other=0.0))
            if EXCLUDE:
                ke = _ukey(tl.load(E + n, mask=cand, other=0.0))
                chosen, e_before = _taken(ke, cand, T_e, k_e, e_before)
                cand = cand & ~chosen
            if p > 0:
                cand = cand & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            digit = tl.where(cand, ((key >> shift) & 255).to(tl.int32), 0)
            hist += tl.histogram(digit, NBINS)
            hist -= tl.where(bins == 0, tl.sum((~cand).to(tl.int32), 0), 0)  # uncounted fill went to bin 0
        if P > 1:
            tl.atomic_add(HIST + p * NBINS + bins, hist, sem="relaxed")
            n_bar += P
            _barrier(CNT, n_bar, P)
            hist = tl.load(HIST + p * NBINS + bins, cache_modifier=".cg")
        ge = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # ge[d] = candidates with digit >= d
        d = tl.sum((ge >= k).to(tl.int32), 0) - 1
        k -= tl.sum(tl.where(bins == d, ge - hist, 0), 0)  # minus those strictly above digit d
        prefix = prefix | (d.to(tl.uint32) << shift)
    n_eq = tl.sum(tl.where(bins == d, hist, 0), 0)  # after the last digit: candidates equal to T
    return prefix, k, n_eq, n_bar


@triton.jit
def _taken(key, cand, T, k_eq, eq_before):
    """Candidates chosen by threshold (T, k_eq): key > T, or key == T among the first k_eq (by position)."""
    eq = cand & (key == T)
    ieq = eq.to(tl.int32)
    rank = eq_before + tl.cumsum(ieq, 0) - ieq
    return cand & ((key > T) | (eq & (rank < k_eq))), eq_before + tl.sum(ieq, 0)


@triton.jit
def _count_eq(X, lo, hi, mid_lo, mid_hi, T, E, T_e, k_e, e_off, EXCLUDE: tl.constexpr, BLOCK: tl.constexpr):
    """Entries of this slice equal to T among the candidates (the tie-rank offset for later programs)."""
    c = tl.zeros([], tl.int32)
    e_before = e_off
    for start in range(lo, hi, BLOCK):
        n = start + tl.arange(0, BLOCK)
        mid = (n >= mid_lo) & (n < mid_hi)
        key = _ukey(tl.load(X + n, mask=mid, other=0.0))
        if EXCLUDE:
            ke = _ukey(tl.load(E + n, mask=mid, other=0.0))
            chosen, e_before = _taken(ke, mid, T_e, k_e, e_before)
            mid = mid & ~chosen
        c += tl.sum((mid & (key == T)).to(tl.int32), 0)
    return c


@triton.jit
def _select_kernel(
    P1, S2, LENS, OUT, SCR,
    spb, ssb, sob, scr_stride, slice_len,
    budget, sinks, window, m1, m2,
    P: tl.constexpr, HAS_SEC: tl.constexpr, BLOCK: tl.constexpr,
):
    p = tl.program_id(0)
    b = tl.program_id(1)
    b64 = b.to(tl.int64)
    L = tl.load(LENS + b)
    ob = OUT + b64 * sob
    pb = P1 + b64 * spb
    sb = S2 + b64 * ssb
    # scratch of row b: [barrier counter, exit counter, eq1 counts [P], eq2 counts [P], out counts [P], hist [8, 256]]
    scr = SCR + b64 * scr_stride
    CNT = scr
    EQ1 = scr + 2
    EQ2 = EQ1 + P
    OC = EQ2 + P
    HIST = OC + P
    if L <= budget:
        if p == 0:
            for start in range(0, budget, BLOCK):
                n = start + tl.arange(0, BLOCK)
                tl.store(ob + n, tl.where(n < L, n, -1), mask=n < budget)
    else:
        lo = p * slice_len  # this program's slice of [0, L)
        hi = tl.minimum(lo + slice_len, L)
        mlo = tl.maximum(lo, sinks)  # ... intersected with the middle [sinks, L - window)
        mhi = tl.minimum(hi, L - window)
        n_bar = tl.zeros([], tl.int32)
        T1, k1, q1, n_bar = _radix_select(pb, pb, mlo, mhi, m1, 0, 0, 0, HIST, CNT, n_bar, P, False, BLOCK)
        e1 = tl.zeros([], tl.int32)  # tie-rank offset: entries == T1 in earlier programs' slices
        if P > 1:
            if q1 > k1:  # only ties cut at T1 need ranks across programs (same branch in all of them)
                tl.store(EQ1 + p, _count_eq(pb, mlo, mhi, mlo, mhi, T1, pb, 0, 0, 0, False, BLOCK))
                n_bar += P
                _barrier(CNT, n_bar, P)
                e1 = _sum_before(EQ1, p, P)
        e2 = tl.zeros([], tl.int32)
        if HAS_SEC:
            T2, k2, q2, n_bar = _radix_select(sb, pb, mlo, mhi, m2, T1, k1, e1, HIST + 4 * NBINS, CNT, n_bar, P,
                                              True, BLOCK)
            if P > 1:
                if q2 > k2:
                    tl.store(EQ2 + p, _count_eq(sb, mlo, mhi, mlo, mhi, T2, pb, T1, k1, e1, True, BLOCK))
                    n_bar += P
                    _barrier(CNT, n_bar, P)
                    e2 = _sum_before(EQ2, p, P)
        # count this slice's chosen positions, then write them after those of earlier programs
        written = tl.zeros([], tl.int32)
        if P > 1:
            c = tl.zeros([], tl.int32)
            f1 = e1
            f2 = e2
            for start in range(lo, hi, BLOCK):
                n = start + tl.arange(0, BLOCK)
                mid = (n >= mlo) & (n < mhi)
                key1 = _ukey(tl.load(pb + n, mask=mid, other=0.0))
                sel1, f1 = _taken(key1, mid, T1, k1, f1)
                sel = (n < hi) & ((n < sinks) | (n >= L - window) | sel1)
                if HAS_SEC:
                    key2 = _ukey(tl.load(sb + n, mask=mid, other=0.0))
                    sel2, f2 = _taken(key2, mid & ~sel1, T2, k2, f2)
                    sel = sel | sel2
                c += tl.sum(sel.to(tl.int32), 0)
            tl.store(OC + p, c)
            n_bar += P
            _barrier(CNT, n_bar, P)
            written = _sum_before(OC, p, P)
        for start in range(lo, hi, BLOCK):
            n = start + tl.arange(0, BLOCK)
            mid = (n >= mlo) & (n < mhi)
            key1 = _ukey(tl.load(pb + n, mask=mid, other=0.0))
            sel1, e1 = _taken(key1, mid, T1, k1, e1)
            sel = (n < hi) & ((n < sinks) | (n >= L - window) | sel1)
            if HAS_SEC:
                key2 = _ukey(tl.load(sb + n, mask=mid, other=0.0))
                sel2, e2 = _taken(key2, mid & ~sel1, T2, k2, e2)
                sel = sel | sel2
            isel = sel.to(tl.int32)
            tl.store(ob + written + tl.cumsum(isel, 0) - isel, n, mask=sel)
            written += tl.sum(isel, 0)
        if P > 1:  # the last program to leave zeroes the row's scratch for the next launch
            tl.debug_barrier()
            if tl.atomic_add(CNT + 1, 1, sem="acq_rel") == P - 1:
                for start in range(0, scr_stride, BLOCK):
                    r = start + tl.arange(0, BLOCK)
                    tl.store(scr + r, tl.zeros([BLOCK], tl.int32), mask=r < scr_stride)


def select_indices(
    primary: torch.Tensor,
    secondary: torch.Tensor | None,
    cache_lens: torch.Tensor,
    *,
    budget: int,
    sinks: int,
    window: int,
    m: int,
    out: torch.Tensor | None = None,
    programs_per_row: int | None = None,
    block: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """The verification set per sequence: [B, budget] int32, sorted ascending, unique.

    primary, secondary: [B, N_max] fp32 scores (secondary None: m covers the whole remainder).
    For L = cache_lens[b] <= budget: 0..L-1 then -1. Otherwise sinks [0, sinks), the window
    [L - window, L), the top-m of primary over [sinks, L - window), then the top
    (budget - sinks - window - m) of secondary over what remains; ties go to the lower position.
    The caller guarantees sinks + window + m <= budget. Tuning keywords default to heuristics.
    """
    require(primary.dim() == 2 and primary.dtype == torch.float32, "primary must be [B, N_max] float32")
    B, N = primary.shape
    if secondary is not None:
        require(secondary.shape == primary.shape and secondary.dtype == torch.float32,
                "secondary must be float32 with primary's shape")
        require(secondary.device == primary.device, "secondary must be on primary's device")
    check_lens(cache_lens, B, primary.device)
    require(budget > 0 and min(sinks, window, m) >= 0, "budget must be positive; sinks, window, m >= 0")
    require(sinks + window + m <= budget, f"sinks + window + m = {sinks + window + m} exceeds budget {budget}")
    require(primary.stride(1) == 1 and (secondary is None or secondary.stride(1) == 1),
            "score rows must be contiguous")
    out = check_out(out, (B, budget), torch.int32, primary.device)
    require(out.stride(1) == 1, "out rows must be contiguous")
    m1 = m if secondary is not None else budget - sinks - window
    m2 = budget - sinks - window - m1
    sec = secondary if secondary is not None else primary
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" or primary.device.type != "cuda"
    if programs_per_row is None:  # the whole grid must be resident at once (spin barriers)
        programs_per_row = 1 if interpreted else max(1, min(num_sms(primary.device) // B, cdiv(N, 1024)))
    P = next_pow2(programs_per_row) if programs_per_row > 1 else 1
    P = P if P <= programs_per_row else P // 2  # a power of two <= programs_per_row
    slice_len = cdiv(N, P)
    if block is None:
        block = min(4096, max(256, next_pow2(slice_len)))
    if num_warps is None:
        num_warps = max(4, min(8, block // 512))
    scr_stride = 2 + 3 * P + 8 * 256
    scratch = ticket_counters(primary.device, B * scr_stride, name="select") if P > 1 else out
    _select_kernel[(P, B)](
        primary, sec, cache_lens, out, scratch, primary.stride(0), sec.stride(0), out.stride(0),
        scr_stride, slice_len, budget, sinks, window, m1, m2,
        P=P, HAS_SEC=secondary is not None, BLOCK=block, num_warps=num_warps,
    )
    return out
