"""Layer groups on constructed statistics: the segmentation is the best one (brute force), the
search finds planted groups and their heads, and dynamic m is scored against fixed m."""

import itertools

import pytest
import torch

from dustin_profile.baselines import layer_oracle, oracle
from dustin_profile.calib_arr import CalibStats, arr_exact
from dustin_profile.dynamic_m import analyse
from dustin_profile.groups import LayerAttention, best_segments, search_groups, segment_oracles
from dustin_profile.heldout import groups_arr
from dustin_profile.search import SearchConfig


def two_regimes(seed=0, P=6, N=300, Lt=5, split=2, ct=4):
    """Layers [0, split) attend 40 rows X, layers [split, Lt) 40 other rows Y (plus noise); target
    head 1 sees X, head 2 sees Y, heads 0 and 3 see noise. A set of 60 free rows holds one of X, Y."""
    g = torch.Generator().manual_seed(seed)
    la = torch.rand(P, Lt, N, generator=g) * 0.02 / N
    target = torch.rand(ct, P, N, generator=g) * 0.3
    draft = torch.rand(1, P, N, generator=g) * 0.3
    for p in range(P):
        perm = torch.randperm(N - 60, generator=g)[:80] + 20
        x, y = perm[:40], perm[40:]
        la[p, :split, x] += 1.0 / 40
        la[p, split:, y] += 1.0 / 40
        target[1, p, x] += 1.0
        target[2, p, y] += 1.0
    la = la / la.sum(-1, keepdim=True)
    return CalibStats(torch.full((P,), N), la.mean(1), draft, target, layer_attn=la.half().float())


def test_best_segments_is_the_brute_force_optimum():
    g = torch.Generator().manual_seed(3)
    n = 7
    orc = {(a, b): float(torch.rand(1, generator=g)) for a in range(n) for b in range(a + 1, n + 1)}
    for k in range(1, 5):
        segs, val = best_segments(orc, n, k)
        assert [s[0] for s in segs][0] == 0 and segs[-1][1] == n and len(segs) == k
        assert all(a[1] == b[0] for a, b in itertools.pairwise(segs))
        best = max(sum((b - a) / n * orc[(a, b)] for a, b in zip((0, *cuts), (*cuts, n), strict=True))
                   for cuts in itertools.combinations(range(1, n), k - 1))
        assert val == pytest.approx(best, abs=1e-12)
        assert sum((b - a) / n * orc[(a, b)] for a, b in segs) == pytest.approx(val, abs=1e-12)


def test_segment_means_and_the_oracles():
    st = two_regimes()
    la = LayerAttention(st)
    assert la.mean(0, 5) is st.attn  # the whole range is the recorded all-layer A
    torch.testing.assert_close(la.mean(1, 4), st.layer_attn[:, 1:4].mean(1), rtol=0, atol=1e-6)
    orc = segment_oracles(la, 48)
    assert orc[(0, 5)] == pytest.approx(float(oracle(st, 48).mean()))
    per_layer = float(layer_oracle(st, 48).mean())
    assert sum(orc[(i, i + 1)] for i in range(5)) / 5 == pytest.approx(per_layer, abs=1e-6)
    assert per_layer > orc[(0, 5)] + 0.2  # one set cannot hold X and Y; each layer's own can


def test_groups_find_the_planted_split_and_heads(cands):
    st = two_regimes()
    cs = cands(1, 4)
    cfg = SearchConfig(budget=80, sinks=4, window=16, max_heads=2, epsilon=1e-3)
    res = search_groups(st, cs, cfg, [80], max_groups=3)
    assert [(g.start, g.stop) for g in res.groups] == [(0, 2), (2, 5)]
    assert [g.search.chosen[0] for g in res.groups] == [1 + 1, 1 + 2]  # target heads 1 then 2
    assert res.stop == "epsilon" and [t["groups"] for t in res.trials] == [1, 2, 3]
    single, two = res.trials[0]["arr"], res.trials[1]["arr"]
    assert two == pytest.approx(res.arr) and two > single + 0.2 and two > 0.9
    assert res.arr == pytest.approx(groups_arr(st, cs, res.groups, 80, 4, 16), abs=1e-9)  # the held-out path agrees
    assert [len(res.tried[k]) for k in (1, 2, 3)] == [1, 2, 3]
    one = search_groups(st, cs, cfg, [80], max_groups=1)
    assert len(one.groups) == 1 and one.arr == pytest.approx(single) and one.stop == "max_groups"


def test_dynamic_m_against_fixed_m(random_stats):
    """The per-pass oracle bounds every rule and fixed m; each rule's grid ARR equals the ARR of
    select_indices with one m per pass; a feature that tells the best m apart is learnt."""
    def stats(seed):
        st = random_stats(P=16, N=200, cd=1, ct=1, seed=seed)
        # half the passes put their mass where the draft signal points, half where the target's does
        g = torch.Generator().manual_seed(seed)
        conf = torch.rand(16, 3, generator=g)
        attn = st.attn.clone() * 0.1
        for p in range(16):
            src = st.draft[0, p] if conf[p].mean() > 0.5 else st.target[0, p]
            top = src.topk(40).indices
            attn[p, top] += 0.9 / 40
        st.attn, st.confidence = attn / attn.sum(1, keepdim=True), conf
        return st

    cal, held = stats(1), stats(2)
    sig = {k: (s.draft[0], s.target[0]) for k, s in (("calibration", cal), ("heldout", held))}
    out = analyse(cal, held, sig, budget=60, sinks=2, window=8, points=11)
    assert out["fixed"]["heldout"] <= out["oracle"]["heldout"] + 1e-12
    for r in out["rules"]:
        assert r["heldout"] <= out["oracle"]["heldout"] + 1e-12
        assert r["heldout_select_indices"] == pytest.approx(r["heldout"], abs=1e-9)
    conf2 = next(r for r in out["rules"] if r["feature"] == "confidence" and r["bins"] == 2)
    low, high = conf2["m"]
    assert low < 25 < high  # low confidence: mostly the target's rows; high: mostly the draft's
    assert conf2["heldout"] > out["fixed"]["heldout"] + 0.1
    assert out["best_rule"]["feature"] == "confidence" and out["heldout_gain"] > 0.1
    assert out["best_m_rank_correlation"]["confidence"] > 0.5  # high confidence: the larger m
    m_row = torch.where(held.confidence.mean(1) > 0.5, 50, 0).int()
    exact = arr_exact(held, held.draft[0], held.target[0], budget=60, sinks=2, window=8, m=m_row)
    assert float(exact.mean()) == pytest.approx(out["oracle"]["heldout"], abs=0.05)
