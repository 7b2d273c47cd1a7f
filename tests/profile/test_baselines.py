"""The profiler's Quest baseline is the runtime's Quest policy: the same set per KV head on the
same keys and queries (after the policy has kept its pages through a few commits), and its ARR is
the share of each query's context attention on that set; the set itself against a direct reading
of the definition."""

import pytest
import torch

from dustin_profile import baselines
from dustin_runtime.attention import ForwardContext
from dustin_runtime.config import ModelConfig
from dustin_runtime.loader import random_model
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy

PAGE = 16


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig("llama", 64, 32, 48, 2, 6, 2, 16, 512)  # 2 layers, GQA 3, head_dim 16
    return random_model(cfg, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("budget,sinks,window", [(48, 4, 16), (64, 0, 0), (37, 3, 5)])
def test_quest_sets_are_the_runtime_policy_sets(tiny, budget, sinks, window):
    g = torch.Generator().manual_seed(budget)
    B, M, gamma = 3, 4, 3
    G, H, D = tiny.cfg.num_kv_heads, tiny.cfg.num_heads, tiny.cfg.head_dim
    cache = tiny.allocate_cache(B, 200)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    policy = make_policy("quest", SparseConfig(budget=budget, sinks=sinks, window=window), target=tiny, draft=tiny)
    policy.setup(cache, tiny.allocate_cache(B, 8), gamma)
    lens = torch.tensor([150, 61, 30], dtype=torch.int32)  # the last one fits the budget whole
    cache.lengths.copy_(lens)
    policy.after_prefill()  # every page, as after the prompt; the steps then update the last ones
    for step in range(3):  # commits in between: the policy updates its pages, the baseline starts afresh
        q = torch.randn(B, H, M, D, generator=g)
        ctx = ForwardContext(start=lens, positions=lens.long().view(B, 1) + torch.arange(M), num_new=M,
                             phase="verify")
        for layer in range(tiny.cfg.num_layers):
            got = policy.layer_indices(layer, q, cache, ctx)  # [B, G, S]
            for b in range(B):
                L = int(lens[b])
                bounds = baselines.quest_bounds(q[b].view(G, H // G, M, D), cache.k[layer][b, :, :L], PAGE)
                want = baselines.quest_sets(bounds, L, budget, PAGE, sinks=sinks, window=window)
                assert torch.equal(got[b], want), (step, layer, b)
        lens = lens + torch.tensor([gamma + 1, 2, 0], dtype=torch.int32)


def _direct_set(q, k, L, budget, sinks, window, page):
    """Per KV head: sinks, window, then middle rows by their page's bound (lower row first on ties)."""
    G = k.shape[0]
    sets = []
    for gi in range(G):
        if L <= budget:
            sets.append(set(range(L)))
            continue
        ub = []
        for s in range(0, L, page):
            rows = k[gi, s: min(s + page, L)]
            kmax, kmin = rows.amax(0), rows.amin(0)
            ub.append(float(torch.maximum(q[gi] * kmax, q[gi] * kmin).sum(-1).amax()))
        middle = sorted(range(sinks, L - window), key=lambda n: (-ub[n // page], n))
        sets.append(set(range(sinks)) | set(range(L - window, L)) | set(middle[: budget - sinks - window]))
    return sets


@pytest.mark.parametrize("L,budget,sinks,window", [(53, 32, 0, 0), (100, 40, 4, 8), (90, 33, 1, 6), (30, 32, 4, 8)])
def test_quest_masses_are_the_mass_on_the_quest_set(L, budget, sinks, window):
    g = torch.Generator().manual_seed(L)
    G, r, M, D = 2, 3, 4, 8
    q, k = torch.randn(G, r, M, D, generator=g), torch.randn(G, L, D, generator=g)
    p = torch.softmax(torch.randn(G, r, M, L, generator=g), -1)  # each query's share of its context attention
    got = baselines.quest_masses(q, k, p, (budget,), PAGE, sinks=sinks, window=window)
    sets = _direct_set(q, k, L, budget, sinks, window, PAGE)
    idx = baselines.quest_sets(baselines.quest_bounds(q, k, PAGE), L, budget, PAGE, sinks=sinks, window=window)
    for gi in range(G):
        assert set(idx[gi][idx[gi] >= 0].tolist()) == sets[gi]
        assert int((idx[gi] >= 0).sum()) == min(L, budget)
    want = sum(float(p[gi][..., sorted(sets[gi])].sum(-1).mean()) for gi in range(G)) / G
    assert float(got[0]) == pytest.approx(want, abs=1e-6)


def test_quest_masses_monotone_in_the_budget_and_one_when_it_covers_the_context():
    g = torch.Generator().manual_seed(0)
    G, r, M, D, L = 2, 3, 5, 16, 100
    q, k = torch.randn(G, r, M, D, generator=g), torch.randn(G, L + M, D, generator=g)
    p = torch.softmax(torch.einsum("grmd,gnd->grmn", q, k), -1)[..., :L]
    budgets = (16, 32, 48, 64, 96, 112, 128)
    got = baselines.quest_masses(q, k[:, :L], p / p.sum(-1, keepdim=True), budgets, sinks=2, window=8)
    assert (got[1:] >= got[:-1] - 1e-7).all()
    assert float(got[-1]) == pytest.approx(1.0, abs=1e-5)
