"""Algorithm 1 on constructed statistics: it finds the planted heads and split, and is deterministic."""

import torch

from dustin_profile.calib_arr import CalibStats
from dustin_profile.search import SearchConfig, greedy_search, m_grid


def planted(seed=0, P=8, N=400, cd=3, ct=6, good_d=1, good_t=3):
    """A splits its mass between 30 positions only draft head `good_d` sees and 30 positions only
    target head `good_t` sees; head good_d - 1 sees half of the draft's positions; the rest is noise."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((P,), N)
    attn = torch.rand(P, N, generator=g) * 0.05 / N
    draft = torch.rand(cd, P, N, generator=g) * 0.3
    target = torch.rand(ct, P, N, generator=g) * 0.3
    for p in range(P):
        perm = torch.randperm(N - 40, generator=g)[:60] + 20  # inside the middle
        x, y = perm[:30], perm[30:]
        attn[p, x] += 0.45 / 30
        attn[p, y] += 0.45 / 30
        draft[good_d, p, x] += 1.0
        draft[good_d - 1, p, x[:15]] += 1.0
        target[good_t, p, y] += 1.0
    return CalibStats(lengths, attn / attn.sum(1, keepdim=True), draft, target)  # A sums to 1 over the context


def test_search_finds_planted_heads_and_split(cands):
    st = planted()
    cs = cands(3, 6)
    res = greedy_search(st, cs, SearchConfig(budget=80, sinks=4, window=16, max_heads=6, epsilon=1e-3))
    assert sorted(res.chosen) == [1, 3 + 3]
    assert res.stop == "epsilon"
    assert res.m == 30 and 30 in m_grid(60, 9)
    assert res.arr > 0.95
    assert [r.arr for r in res.rounds] == sorted(r.arr for r in res.rounds)
    assert len(res.rounds[1].evaluations) == 9 and len(res.rounds[2].evaluations) == 8


def test_search_deterministic_and_ties_to_first_candidate(random_stats, cands):
    st = random_stats(seed=4, cd=3, ct=4)
    cfg = SearchConfig(budget=64, sinks=4, window=16, max_heads=4, epsilon=0.0)
    a = greedy_search(st, cands(3, 4), cfg)
    b = greedy_search(st, cands(3, 4), cfg)
    assert [(r.added, r.m, r.arr, r.evaluations) for r in a.rounds] == [(r.added, r.m, r.arr, r.evaluations) for r in b.rounds]
    # a duplicated candidate: the earlier copy wins
    dup = CalibStats(st.lengths, st.attn, torch.cat([st.draft, st.draft]), st.target)
    c = greedy_search(dup, cands(6, 4), SearchConfig(budget=64, sinks=4, window=16, max_heads=1, epsilon=0.0))
    first = c.chosen[0]
    assert first < 3 or first >= 6
    assert c.stop == "max_heads"


def test_search_stops_at_head_limit(cands):
    st = planted()
    res = greedy_search(st, cands(3, 6), SearchConfig(budget=80, sinks=4, window=16, max_heads=1, epsilon=0.0))
    assert len(res.chosen) == 1 and res.stop == "max_heads"
