"""Synthetic calibration statistics for the profiler's tests."""

import torch

from dustin_profile.calib_arr import CalibStats
from dustin_profile.candidates import Candidate


def random_stats(P=6, N=300, cd=3, ct=5, seed=0, lengths=None, ties=False) -> CalibStats:
    """Random A (a softmax-like distribution over each pass's context, summing to 1) and random
    candidate signals; `ties` quantises the signals so many values are equal."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths if lengths is not None else [N - 7 * i for i in range(P)])
    pos = torch.arange(N)
    valid = pos < lengths.view(-1, 1)
    raw = torch.rand(P, N, generator=g) ** 8 * valid
    attn = raw / raw.sum(1, keepdim=True)

    def sig(c):
        s = torch.rand(c, P, N, generator=g) * valid
        return (s * 4).floor() / 4 if ties else s

    return CalibStats(lengths, attn, sig(cd), sig(ct))


def cands(cd, ct):
    return ([Candidate("draft", i, 0, (i,)) for i in range(cd)]
            + [Candidate("target", i, 0, (i,)) for i in range(ct)])
