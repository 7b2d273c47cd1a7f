"""Context lookup (prompt lookup drafting): the next draft token copied from a sequence's history.

Programs (block of BLOCK end positions, sequence b). With a copy in progress (ptr[b] >= 0) the
proposal is the next position, ptr + 1. Otherwise each program takes the end positions j < end[b] of
its block, counts how many of the tokens before and at j equal the last ones before and at end[b] (up
to NMAX), and folds the best score len * N + j over the ends whose match length reaches NMIN (the
longest match, then the most recent) into a per-sequence slot with an atomic max; the last program of
b to arrive (a ticket) writes the new ptr (the position copied, -1 for none), the copied token and a
hit flag, and resets the slot and the ticket. (The first version, one program per sequence scanning
block after block, was latency-bound: the lookup took dustin-vs from 9.24 to 9.66 ms a step at the
7B / 0.5B shapes, 32k, batch 16, H200.)

    hist [B, N] int32 tokens by position (-1 where unknown), end [B] (the last known position),
    ptr [B] int64 (read and written), tok [B] int64, hit [B] bool

`lookup_propose_ref` (dustin_kernels.reference) is the torch twin. A search reads the history once
(the k-shifted reloads hit L1): 128 KB per sequence at 32k positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dustin_kernels._util import cdiv, next_pow2, require, ticket_counters

MAX_NGRAM = 16


@triton.jit
def _lookup_kernel(HIST, END, PTR, TOK, HIT, BEST, LOCKS, N, shb, n_blocks,
                   NMAX: tl.constexpr, NMIN: tl.constexpr, NP2: tl.constexpr, BLOCK: tl.constexpr):
    blk = tl.program_id(0)
    b = tl.program_id(1)
    hb = HIST + b.to(tl.int64) * shb
    E = tl.load(END + b).to(tl.int64)
    ptr = tl.load(PTR + b)
    start = blk.to(tl.int64) * BLOCK
    if (ptr < 0) & (start < E):  # a search, and this block holds candidate ends j < E
        kk = tl.arange(0, NP2)
        tail = tl.load(hb + E - kk, mask=(kk < NMAX) & (E - kk >= 0), other=-2)  # [NP2] the last tokens
        j = start + tl.arange(0, BLOCK).to(tl.int64)
        run = j < E
        length = tl.zeros([BLOCK], tl.int32)
        for k in tl.static_range(NMAX):
            want = tl.sum(tl.where(kk == k, tail, 0))  # the k-th token back from E (-2: none)
            x = tl.load(hb + j - k, mask=run & (j - k >= 0), other=-1)
            run = run & (x == want)
            length += run.to(tl.int32)
        score = tl.where(length >= NMIN, length.to(tl.int64) * N + j + 1, 0)  # 0: no match
        tl.atomic_max(BEST + b, tl.max(score, 0), sem="relaxed")
    tl.debug_barrier()
    ticket = tl.atomic_add(LOCKS + b, 1, sem="acq_rel")
    if ticket == n_blocks - 1:  # the last block of sequence b to arrive: the proposal
        top = tl.atomic_xchg(BEST + b, 0) - 1  # read and reset for the next launch
        new = tl.where(ptr >= 0, ptr + 1, tl.where(top >= 0, top % N + 1, -1))
        hit = new >= 0
        tok = tl.load(hb + tl.maximum(new, 0), mask=hit, other=0)
        tl.store(PTR + b, new)
        tl.store(TOK + b, tok.to(tl.int64))
        tl.store(HIT + b, hit)
        tl.atomic_xchg(LOCKS + b, 0)


def lookup_propose(
    hist: torch.Tensor,  # [B, N] int32
    end: torch.Tensor,  # [B] int32 / int64: the last known position of each sequence
    ptr: torch.Tensor,  # [B] int64, read and written: the position copied by the previous forward (-1: none)
    max_ngram: int,
    min_ngram: int,
    *,
    block: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hit [B] bool, token [B] int64) of one draft forward; ptr is updated in place."""
    require(hist.dim() == 2 and hist.dtype == torch.int32 and hist.stride(1) == 1,
            "hist must be a [B, N] int32 tensor with contiguous rows")
    B, N = hist.shape
    require(end.shape == (B,) and ptr.shape == (B,) and ptr.dtype == torch.int64 and ptr.is_contiguous(),
            f"end and ptr must be [{B}] (ptr int64, contiguous)")
    require(1 <= min_ngram <= max_ngram <= MAX_NGRAM, f"n-grams need 1 <= min <= max <= {MAX_NGRAM}")
    require(hist.device == end.device == ptr.device, "hist, end and ptr must share a device")
    require(block >= 16 and block & (block - 1) == 0, "block must be a power of two >= 16")
    tok = torch.empty(B, dtype=torch.int64, device=hist.device)
    hit = torch.empty(B, dtype=torch.bool, device=hist.device)
    best = _scratch(hist.device, B)
    locks = ticket_counters(hist.device, B, name="lookup")
    n_blocks = cdiv(N, block)
    _lookup_kernel[(n_blocks, B)](hist, end.contiguous(), ptr, tok, hit, best, locks, N, hist.stride(0), n_blocks,
                                  NMAX=max_ngram, NMIN=min_ngram, NP2=max(2, next_pow2(max_ngram)), BLOCK=block,
                                  num_warps=4)
    return hit, tok


_BEST: dict = {}


def _scratch(device: torch.device, n: int) -> torch.Tensor:
    """n int64 best-score slots that are zero between launches (the kernel resets what it used);
    grown outside CUDA graph capture only (the launcher's first call is a warm-up)."""
    key = (device.type, device.index)
    buf = _BEST.get(key)
    if buf is None or buf.numel() < n:
        require(not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()),
                "dustin_kernels: run lookup_propose once before CUDA graph capture (warm-up)")
        buf = torch.zeros(max(n, 1024), dtype=torch.int64, device=device)
        _BEST[key] = buf
    return buf
