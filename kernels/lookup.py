"""Context lookup (prompt lookup drafting): the next draft token copied from a sequence's history.

One program per sequence b. With a copy in progress (ptr[b] >= 0) the proposal is the next position,
ptr + 1. Otherwise the program scans every earlier end position j < end[b] once, counts how many of the
tokens before and at j equal the last ones before and at end[b] (up to NMAX), and keeps the best
score len * N + j over the ends whose match length reaches NMIN: the longest match, then the most
recent. It writes the new ptr (the position copied, -1 for none), the copied token and a hit flag.

    hist [B, N] int32 tokens by position (-1 where unknown), end [B] (the last known position),
    ptr [B] int64 (read and written), tok [B] int64, hit [B] bool

`lookup_propose_ref` (dustin_kernels.reference) is the torch twin. A scan reads the history once
(the k-shifted reloads hit L1): ~128 KB per sequence at 32k positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dustin_kernels._util import next_pow2, require

MAX_NGRAM = 16


@triton.jit
def _lookup_kernel(HIST, END, PTR, TOK, HIT, N, shb,
                   NMAX: tl.constexpr, NMIN: tl.constexpr, NP2: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    hb = HIST + b.to(tl.int64) * shb
    E = tl.load(END + b).to(tl.int64)
    ptr = tl.load(PTR + b)
    if ptr >= 0:  # the copy goes on
        new = ptr + 1
    else:
        kk = tl.arange(0, NP2)
        tail = tl.load(hb + E - kk, mask=(kk < NMAX) & (E - kk >= 0), other=-2)  # [NP2] the last tokens
        best = tl.full([BLOCK], -1, tl.int64)
        for start in range(0, E, BLOCK):
            j = start + tl.arange(0, BLOCK).to(tl.int64)
            run = j < E
            length = tl.zeros([BLOCK], tl.int32)
            for k in tl.static_range(NMAX):
                want = tl.sum(tl.where(kk == k, tail, 0))  # the k-th token back from E (-2: none)
                x = tl.load(hb + j - k, mask=run & (j - k >= 0), other=-1)
                run = run & (x == want)
                length += run.to(tl.int32)
            score = tl.where(length >= NMIN, length.to(tl.int64) * N + j, -1)
            best = tl.maximum(best, score)
        top = tl.max(best, 0)
        new = tl.where(top >= 0, top % N + 1, -1)
    hit = new >= 0
    tok = tl.load(hb + tl.maximum(new, 0), mask=hit, other=0)
    tl.store(PTR + b, new)
    tl.store(TOK + b, tok.to(tl.int64))
    tl.store(HIT + b, hit)


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
    tok = torch.empty(B, dtype=torch.int64, device=hist.device)
    hit = torch.empty(B, dtype=torch.bool, device=hist.device)
    _lookup_kernel[(B,)](hist, end.contiguous(), ptr, tok, hit, N, hist.stride(0),
                         NMAX=max_ngram, NMIN=min_ngram, NP2=max(2, next_pow2(max_ngram)), BLOCK=block,
                         num_warps=4)
    return hit, tok
