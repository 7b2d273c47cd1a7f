"""lookup_propose against its torch twin (exact: integer work), on histories with repeats, copies in
progress, ends at the first and last positions, several scan blocks, non-contiguous history rows."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import KernelArgumentError, lookup_propose, lookup_propose_ref


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("nmax,nmin", [(4, 2), (3, 1), (1, 1), (7, 7), (5, 3)])
@pytest.mark.parametrize("N,block", [(61, 16), (300, 512), (1029, 128)])
def test_matches_reference(nmax, nmin, N, block):
    dev = _device()
    g = torch.Generator().manual_seed(N + nmax * 10 + nmin)
    B = 7
    wide = torch.full((B, N + 5), -1, dtype=torch.int32)
    hist = wide[:, 2: N + 2]  # rows 5 apart: not contiguous as a whole
    ends = [0, 1, N - 1, N // 2, 3, N - 2, N // 3]
    for b, e in enumerate(ends):
        period = 1 + b % 4
        alphabet = 2 + b
        base = torch.randint(0, alphabet, (period,), generator=g)
        row = base.repeat(e // period + 2)[: e + 1]
        noise = torch.rand(e + 1, generator=g) < 0.2  # the repeats broken here and there
        row = torch.where(noise, torch.randint(0, alphabet, (e + 1,), generator=g), row)
        hist[b, : e + 1] = row.to(torch.int32)
    end = torch.tensor(ends, dtype=torch.int32)
    ptr = torch.tensor([-1, -1, -1, 5, -1, N - 3, -1], dtype=torch.int64)  # two copies in progress
    ptr_ref = ptr.clone()
    hit_ref, tok_ref = lookup_propose_ref(hist, end, ptr_ref, nmax, nmin)
    hist_d, ptr_d = hist.to(dev), ptr.to(dev)
    hit, tok = lookup_propose(hist_d, end.to(dev), ptr_d, nmax, nmin, block=block)
    assert torch.equal(hit.cpu(), hit_ref) and torch.equal(ptr_d.cpu(), ptr_ref)
    assert torch.equal(torch.where(hit.cpu(), tok.cpu(), 0), tok_ref)
    assert hit_ref[3] and ptr_ref[3] == 6 and tok_ref[3] == hist[3, 6]  # the copy goes on
    assert not hit_ref[0]  # one known token: nothing earlier to match
    if nmin <= 3:
        assert hit_ref.sum() >= 4  # the histories repeat: most sequences find a match


def test_most_recent_longest_match():
    # tokens:          0  1  2  3  4  5  6  7  8  9
    hist = torch.tensor([[5, 1, 2, 9, 7, 1, 2, 3, 1, 2]], dtype=torch.int32)
    dev = _device()
    for nmax, nmin, want in ((1, 1, 7), (2, 2, 7), (3, 2, 7), (3, 3, -1)):
        # "2" and "1 2" end at 2 and 6 (the most recent: 6, so position 7 is copied); no "3 1 2" earlier
        ptr = torch.tensor([-1], device=dev)
        hit, tok = lookup_propose(hist.to(dev), torch.tensor([9], device=dev), ptr, nmax, nmin)
        assert int(ptr) == want and bool(hit) == (want >= 0)
        if want >= 0:
            assert int(tok) == int(hist[0, want])


def test_refusals():
    dev = _device()
    h = torch.zeros(2, 10, dtype=torch.int32, device=dev)
    e = torch.zeros(2, dtype=torch.int32, device=dev)
    p = torch.full((2,), -1, dtype=torch.int64, device=dev)
    with pytest.raises(KernelArgumentError):
        lookup_propose(h.long(), e, p, 4, 2)
    with pytest.raises(KernelArgumentError):
        lookup_propose(h, e, p.int(), 4, 2)
    with pytest.raises(KernelArgumentError):
        lookup_propose(h, e, p, 2, 4)
