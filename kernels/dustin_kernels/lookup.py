"""Context lookup (prompt lookup drafting): a draft token copied from a sequence's history.

Programs (block of BLOCK end positions, sequence b). With a copy in progress (ptr[b] >= 0) the
proposal is the next position, ptr + 1. Otherwise each program takes the end positions j < end[b] of
its block, counts how many of the tokens before and at j equal the last ones before and at end[b] (up
to NMAX), and folds the best score len * N + j over the ends whose match length reaches NMIN (the
longest match, then the most recent) into a per-sequence slot with an atomic max; the last program of
b to arrive (a ticket) takes the copy where there is one (and its token is below `vocab`), else the
draft model's token, writes it to the history at end + 1, counts it, stores the new ptr (the position
copied, -1 for none), and resets the slot and the ticket: one launch per draft forward. (The first version, one program per sequence scanning
block after block, was latency-bound: the lookup took dustin-vs from 9.24 to 9.66 ms a step at the
7B / 0.5B shapes, 32k, batch 16, H200.)

    hist [B, N] int32 tokens by position (-1 where unknown; end + 1 written), end [B] (the last known
    position), ptr [B] int64 (read and written), model [B] int64 (the draft model's tokens), done [B]
    bool, counts [B, 2] int64 (copied, made; added to) -> token [B] int64, copied [B] bool

`lookup_draft_ref` (dustin_kernels.reference) is the torch twin. A search reads the history once
(the k-shifted reloads hit L1): 128 KB per sequence at 32k positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dustin_kernels._util import cdiv, next_pow2, require, ticket_counters

MAX_NGRAM = 16


@triton.jit
def _lookup_kernel(HIST, END, PTR, MODEL, DONE, COUNTS, TOK, HIT, BEST, LOCKS, N, shb, n_blocks, vocab,
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
        copy = tl.load(hb + tl.maximum(new, 0), mask=new >= 0, other=0).to(tl.int64)
        hit = (new >= 0) & (copy < vocab)
        tok = tl.where(hit, copy, tl.load(MODEL + b))
        tl.store(PTR + b, tl.where(hit, new, -1))
        tl.store(TOK + b, tok)
        tl.store(HIT + b, hit)
        tl.store(hb + E + 1, tok.to(tl.int32), mask=E + 1 < N)  # the draft joins the history
        live = tl.load(DONE + b) == 0
        tl.store(COUNTS + 2 * b, tl.load(COUNTS + 2 * b) + (hit & live).to(tl.int64))
        tl.store(COUNTS + 2 * b + 1, tl.load(COUNTS + 2 * b + 1) + live.to(tl.int64))
        tl.atomic_xchg(LOCKS + b, 0)


def lookup_draft(
    hist: torch.Tensor,  # [B, N] int32, read and written (position end + 1)
    end: torch.Tensor,  # [B] int32 / int64: the last known position of each sequence
    ptr: torch.Tensor,  # [B] int64, read and written: the position copied by the previous forward (-1: none)
    model: torch.Tensor,  # [B] int64: the draft model's token for position end + 1
    done: torch.Tensor,  # [B] bool: finished sequences (not counted)
    counts: torch.Tensor,  # [B, 2] int64, added to: (drafts copied, drafts made) of live sequences
    max_ngram: int,
    min_ngram: int,
    vocab: int,
    *,
    block: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft forward's token: (token [B] int64, copied [B] bool). The copy where the history
    holds one below `vocab`, else the model's; written to hist[b, end + 1]."""
    require(hist.dim() == 2 and hist.dtype == torch.int32 and hist.stride(1) == 1,
            "hist must be a [B, N] int32 tensor with contiguous rows")
    B, N = hist.shape
    require(end.shape == (B,) and ptr.shape == (B,) and ptr.dtype == torch.int64 and ptr.is_contiguous(),
            f"end and ptr must be [{B}] (ptr int64, contiguous)")
    require(model.shape == (B,) and model.dtype == torch.int64, f"model must be [{B}] int64")
    require(done.shape == (B,) and done.dtype == torch.bool, f"done must be [{B}] bool")
    require(counts.shape == (B, 2) and counts.dtype == torch.int64 and counts.is_contiguous(),
            f"counts must be a contiguous [{B}, 2] int64 tensor")
    require(1 <= min_ngram <= max_ngram <= MAX_NGRAM, f"n-grams need 1 <= min <= max <= {MAX_NGRAM}")
    require(len({t.device for t in (hist, end, ptr, model, done, counts)}) == 1, "the tensors must share a device")
    require(block >= 16 and block & (block - 1) == 0, "block must be a power of two >= 16")
    tok = torch.empty(B, dtype=torch.int64, device=hist.device)
    hit = torch.empty(B, dtype=torch.bool, device=hist.device)
    best = ticket_counters(hist.device, B, name="lookup-best", dtype=torch.int64)  # best score + 1 (0: none)
    locks = ticket_counters(hist.device, B, name="lookup")
    n_blocks = cdiv(N, block)
    _lookup_kernel[(n_blocks, B)](hist, end.contiguous(), ptr, model.contiguous(), done.contiguous(), counts, tok, hit,
                                  best, locks, N, hist.stride(0), n_blocks, vocab,
                                  NMAX=max_ngram, NMIN=min_ngram, NP2=max(2, next_pow2(max_ngram)), BLOCK=block,
                                  num_warps=4)
    return tok, hit
