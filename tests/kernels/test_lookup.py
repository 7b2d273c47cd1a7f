"""lookup_draft against its torch twin (exact: integer work), on histories with repeats, copies in
progress, ends at the first and last positions, several scan blocks, non-contiguous history rows,
copies at or above the vocabulary, finished rows; and a hand-checked history."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import KernelArgumentError, lookup_draft, lookup_draft_ref
from dustin_kernels.checks import kernel_device


def _histories(B, N, ends, g):
    wide = torch.full((B, N + 5), -1, dtype=torch.int32)
    hist = wide[:, 2: N + 2]  # rows 5 apart: not contiguous as a whole
    for b, e in enumerate(ends):
        period, alphabet = 1 + b % 4, 2 + b
        row = torch.randint(0, alphabet, (period,), generator=g).repeat(e // period + 2)[: e + 1]
        noise = torch.rand(e + 1, generator=g) < 0.2  # the repeats broken here and there
        hist[b, : e + 1] = torch.where(noise, torch.randint(0, alphabet, (e + 1,), generator=g), row).to(torch.int32)
    return hist


@pytest.mark.parametrize("nmax,nmin", [(4, 2), (3, 1), (1, 1), (7, 7), (5, 3)])
@pytest.mark.parametrize("N,block", [(61, 16), (300, 512), (1029, 128)])
def test_matches_reference(nmax, nmin, N, block):
    dev = kernel_device()
    g = torch.Generator().manual_seed(N + nmax * 10 + nmin)
    B = 7
    ends = [0, 1, N - 2, N // 2, 3, N - 3, N // 3]
    hist = _histories(B, N, ends, g)
    vocab = 5  # rows 5 and 6 hold tokens >= 5: their copies fall back to the model's token
    end = torch.tensor(ends, dtype=torch.int32)
    ptr = torch.tensor([-1, -1, -1, 5, -1, N - 4, -1], dtype=torch.int64)  # two copies in progress
    model = torch.tensor([100 + b for b in range(B)], dtype=torch.int64)
    done = torch.tensor([False, False, True, False, False, False, True])
    counts = torch.tensor([[3, 9]] * B, dtype=torch.int64)
    want = [t.clone() for t in (hist, ptr, counts)]
    tok_ref, hit_ref = lookup_draft_ref(want[0], end, want[1], model, done, want[2], nmax, nmin, vocab)
    got = [t.to(dev) for t in (hist, ptr, counts)]
    tok, hit = lookup_draft(got[0], end.to(dev), got[1], model.to(dev), done.to(dev), got[2], nmax, nmin, vocab,
                            block=block)
    assert torch.equal(hit.cpu(), hit_ref) and torch.equal(tok.cpu(), tok_ref)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.cpu(), b)
    assert hit_ref[3] and want[1][3] == 6 and tok_ref[3] == hist[3, 6]  # the copy goes on
    assert not hit_ref[0] and tok_ref[0] == 100  # one known token: nothing to copy, the model's
    for b, e in enumerate(ends):  # the token joins the history; the rest is untouched
        assert want[0][b, e + 1] == tok_ref[b] and torch.equal(want[0][b, : e + 1], hist[b, : e + 1])
    assert torch.equal(want[2][:, 1], torch.tensor([9 + (not d) for d in done.tolist()]))
    assert torch.equal(want[2][:, 0], 3 + (hit_ref & ~done).long())
    if nmin <= 3:
        assert hit_ref.sum() >= 3  # the histories repeat: most sequences find a match


def test_most_recent_longest_match():
    # tokens:          0  1  2  3  4  5  6  7  8  9
    row = [5, 1, 2, 9, 7, 1, 2, 3, 1, 2]
    dev = kernel_device()
    for nmax, nmin, want in ((1, 1, 7), (2, 2, 7), (3, 2, 7), (3, 3, -1)):
        # "2" and "1 2" end at 2 and 6 (the most recent: 6, so position 7 is copied); no "3 1 2" earlier
        hist = torch.tensor([row + [-1]], dtype=torch.int32, device=dev)
        ptr = torch.tensor([-1], device=dev)
        counts = torch.zeros(1, 2, dtype=torch.int64, device=dev)
        tok, hit = lookup_draft(hist, torch.tensor([9], device=dev), ptr, torch.tensor([42], device=dev),
                                torch.tensor([False], device=dev), counts, nmax, nmin, 10)
        assert int(ptr) == want and bool(hit) == (want >= 0)
        assert int(tok) == (row[want] if want >= 0 else 42) == int(hist[0, 10])
        assert counts.tolist() == [[int(want >= 0), 1]]


def test_refusals():
    dev = kernel_device()
    h = torch.zeros(2, 10, dtype=torch.int32, device=dev)
    e = torch.zeros(2, dtype=torch.int32, device=dev)
    p = torch.full((2,), -1, dtype=torch.int64, device=dev)
    m = torch.zeros(2, dtype=torch.int64, device=dev)
    d = torch.zeros(2, dtype=torch.bool, device=dev)
    c = torch.zeros(2, 2, dtype=torch.int64, device=dev)
    for args in ((h.long(), e, p, m, d, c, 4, 2, 9), (h, e, p.int(), m, d, c, 4, 2, 9), (h, e, p, m, d, c, 2, 4, 9),
                 (h, e, p, m.int(), d, c, 4, 2, 9), (h, e, p, m, d, c[:, :1], 4, 2, 9)):
        with pytest.raises(KernelArgumentError):
            lookup_draft(*args)
