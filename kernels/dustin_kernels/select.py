"""Selection of the verification set: sinks + recent window + top-m by one score + fill by another.

Two launchers, chosen on the host by shape only:

Candidates + one ticket (default). Each row's middle [sinks, L - window) is split over P programs
that hold their slice in registers. With the total order "larger key first, then lower position",
the global top-m1 of a slice is among the slice's own top-m1 (U), and the global second pick in a
slice is among U plus the slice's top-m2 of the secondary outside U; so each program writes at
most m1 + m2 candidates (position, both keys) in position order, takes a ticket, and the last
program of the row selects exactly over the P candidate lists and writes the sorted output. No
program waits for another (no spin barrier). Each exact top-k is a bitwise threshold search on
order-preserving uint32 keys (one block reduction per bit) that stops as soon as exactly k keys
are at or above the threshold; when ties at the k-th key are cut, the lowest positions win via a
prefix count.

Radix with barriers (shapes whose slices or candidate lists do not fit in registers): four 8-bit
passes, each a histogram of the next digit among the candidates that share the prefix found so
far, give the k-th largest key T and how many entries equal to T to take (the lowest positions
first). A last pass marks the chosen positions and writes them in ascending order through prefix
counts. Each row is split over P programs (P = SMs // B, so the grid fits on the GPU at once; P = 1
in the interpreter). After each pass the P programs of a row add their histograms into a global
one and meet at a barrier (an atomic counter they spin on); every program then derives the same
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


# ---------------------------------------------------------------- candidates + one ticket


@triton.jit
def _topk_mask(key, valid, k):
    """Mask of the k largest keys among `valid` (uint32 order; ties: lower index in the block first).

    Requires 0 <= k <= count(valid). Builds the threshold T bit by bit from the top, keeping
    count(valid & key >= T) >= k, and stops as soon as that count is exactly k (then no tie is cut).
    After all 32 bits T is the k-th largest key and its ties are ranked by a prefix count.
    """
    T = tl.zeros([], tl.uint32)
    n_ge = tl.sum(valid.to(tl.int32), 0)
    bit = tl.full([], 31, tl.int32)
    while (n_ge != k) & (bit >= 0):
        cand = T | (tl.full([], 1, tl.uint32) << bit.to(tl.uint32))
        c = tl.sum((valid & (key >= cand)).to(tl.int32), 0)
        take = c >= k
        T = tl.where(take, cand, T)
        n_ge = tl.where(take, c, n_ge)
        bit -= 1
    chosen = valid & (key >= T)
    if n_ge != k:  # ties at the k-th key are cut: the lowest positions first
        gt = valid & (key > T)
        ieq = (valid & (key == T)).to(tl.int32)
        need = k - tl.sum(gt.to(tl.int32), 0)
        chosen = gt | ((ieq > 0) & (tl.cumsum(ieq, 0) - ieq < need))
    return chosen


@triton.jit
def _select_ticket_kernel(
    P1, S2, LENS, OUT, CPOS, CK1, CK2, CCNT, LOCKS,
    spb, ssb, sob, slice_len, n_prog, budget, sinks, window, m1, m2,
    HAS_SEC: tl.constexpr, BLOCK: tl.constexpr, CAPS: tl.constexpr, BLOCK2: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    p = tl.program_id(0)
    b = tl.program_id(1)
    b64 = b.to(tl.int64)
    L = tl.load(LENS + b)
    ob = OUT + b64 * sob
    if L <= budget:  # the whole context, then -1
        if p == 0:
            for start in range(0, budget, BLOCK_W):
                n = start + tl.arange(0, BLOCK_W)
                tl.store(ob + n, tl.where(n < L, n, -1), mask=n < budget)
    else:
        # phase 1: this program's slice of the middle [sinks, L - window), in registers
        r = tl.arange(0, BLOCK)
        n = sinks + p * slice_len + r
        valid = (r < slice_len) & (n < L - window)
        key1 = _ukey(tl.load(P1 + b64 * spb + n, mask=valid, other=0.0))
        c = tl.sum(valid.to(tl.int32), 0)
        k1 = tl.minimum(m1, c)
        cand = _topk_mask(key1, valid, k1)
        key2 = key1
        if HAS_SEC:
            key2 = _ukey(tl.load(S2 + b64 * ssb + n, mask=valid, other=0.0))
            cand = cand | _topk_mask(key2, valid & ~cand, tl.minimum(m2, c - k1))
        ic = cand.to(tl.int32)
        slot = (b * n_prog + p).to(tl.int64) * CAPS
        off = slot + tl.cumsum(ic, 0) - ic
        tl.store(CPOS + off, n, mask=cand)
        tl.store(CK1 + off, key1.to(tl.int32, bitcast=True), mask=cand)
        if HAS_SEC:
            tl.store(CK2 + off, key2.to(tl.int32, bitcast=True), mask=cand)
        tl.store(CCNT + b * n_prog + p, tl.sum(ic, 0))
        tl.debug_barrier()  # every thread's candidates are written before the ticket (release)
        if tl.atomic_add(LOCKS + b, 1, sem="acq_rel") == n_prog - 1:
            # phase 2 (last program of the row): exact selection over the candidate lists
            j = tl.arange(0, BLOCK2)
            jp = j // CAPS
            jj = j % CAPS
            cnt = tl.load(CCNT + b * n_prog + jp, mask=jp < n_prog, other=0, cache_modifier=".cg")
            ok = jj < cnt
            src = (b * n_prog + jp).to(tl.int64) * CAPS + jj
            pos = tl.load(CPOS + src, mask=ok, other=0, cache_modifier=".cg")
            ck1 = tl.load(CK1 + src, mask=ok, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
            sel = _topk_mask(ck1, ok, m1)
            if HAS_SEC:
                ck2 = tl.load(CK2 + src, mask=ok, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
                sel = sel | _topk_mask(ck2, ok & ~sel, m2)
            for start in range(0, sinks, BLOCK_W):
                w = start + tl.arange(0, BLOCK_W)
                tl.store(ob + w, w, mask=w < sinks)
            isel = sel.to(tl.int32)
            tl.store(ob + sinks + tl.cumsum(isel, 0) - isel, pos, mask=sel)
            for start in range(0, window, BLOCK_W):
                w = start + tl.arange(0, BLOCK_W)
                tl.store(ob + (budget - window) + w, L - window + w, mask=w < window)
            tl.atomic_xchg(LOCKS + b, 0)



MAX_SLICE = 8192  # ticket launcher: a program's slice of the middle, in registers (sm_90: no spills)
MAX_CANDIDATES = 8192  # ticket launcher: the last program's candidate lists, in registers


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
    (budget - sinks - window - m) of secondary over what remains; ties go to the lower position
    (the caller guarantees sinks + window + m <= budget).
    Tuning keywords default to heuristics (`block`: the most scores one program handles at a time).
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
    plan = _ticket_plan(B, N, budget, sinks, window, m1, m2, primary.device, programs_per_row, block)
    if plan is None:
        return _select_barrier(primary, secondary, cache_lens, out, budget, sinks, window, m1, m2,
                               programs_per_row, block, num_warps)
    return _select_ticket(primary, secondary, cache_lens, out, budget, sinks, window, m1, m2, plan, num_warps)


def _ticket_plan(B, N, budget, sinks, window, m1, m2, device, programs_per_row=None, block=None):
    """(P, slice, BLOCK, CAPS, BLOCK2) for the ticket launcher, or None where it does not fit."""
    span = max(1, N - sinks - window)  # the middle of any row lies in [sinks, N - window)
    caps = max(16, next_pow2(m1 + m2))
    if programs_per_row is not None:
        P = max(1, int(programs_per_row))
    else:  # one row per SM group, slices of >= 256 scores, candidate lists that fit the last program
        P = max(1, min(num_sms(device) // B, MAX_CANDIDATES // caps, cdiv(span, 256)))
        P = max(P, cdiv(span, block if block is not None else MAX_SLICE))  # large B x N: more programs than SMs
    slice_len = cdiv(span, P)
    BLOCK = max(16, next_pow2(slice_len))
    BLOCK2 = max(16, next_pow2(P * caps))
    if BLOCK > MAX_SLICE or BLOCK2 > MAX_CANDIDATES:
        return None
    return P, slice_len, BLOCK, caps, BLOCK2


def _select_ticket(primary, secondary, cache_lens, out, budget, sinks, window, m1, m2, plan, num_warps=None):
    B = primary.shape[0]
    P, slice_len, BLOCK, caps, BLOCK2 = plan
    dev = primary.device
    sec = secondary if secondary is not None else primary
    cpos = torch.empty(B * P * caps, dtype=torch.int32, device=dev)
    ck1 = torch.empty(B * P * caps, dtype=torch.int32, device=dev)
    ck2 = torch.empty(B * P * caps, dtype=torch.int32, device=dev) if secondary is not None else ck1
    ccnt = torch.empty(B * P, dtype=torch.int32, device=dev)
    locks = ticket_counters(dev, B, name="select_ticket")
    if num_warps is None:  # registers: ~200 per thread at 16 scores a thread (two keys, position, masks)
        num_warps = 8 if BLOCK <= 4096 and BLOCK2 <= 8192 else 16
        if B * P > num_sms(dev):  # more programs than SMs: 4 warps fit two a SM (B 32, 64k: 111 -> 85 us)
            num_warps = 4
    _select_ticket_kernel[(P, B)](
        primary, sec, cache_lens, out, cpos, ck1, ck2, ccnt, locks,
        primary.stride(0), sec.stride(0), out.stride(0), slice_len, P, budget, sinks, window, m1, m2,
        HAS_SEC=secondary is not None, BLOCK=BLOCK, CAPS=caps, BLOCK2=BLOCK2, BLOCK_W=128, num_warps=num_warps,
    )
    return out


def _select_barrier(primary, secondary, cache_lens, out, budget, sinks, window, m1, m2,
                    programs_per_row=None, block=None, num_warps=None):
    """The radix launcher (module doc): rows split over P programs that meet at spin barriers."""
    B, N = primary.shape
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
        primary, sec, cache_lens, out, scratch,
        primary.stride(0), sec.stride(0), out.stride(0), scr_stride, slice_len, budget, sinks, window, m1, m2,
        P=P, HAS_SEC=secondary is not None, BLOCK=block, num_warps=num_warps,
    )
    return out
