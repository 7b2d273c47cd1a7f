"""Selection pieces on their own: streamingllm indices, Quest's incremental page bounds (kept equal
to a recomputation across commits and rollbacks, and true upper bounds), Quest's page selection,
retrieval-head signals against a direct softmax, the true attention of a side pass and ARR."""

import math

import pytest
import torch

from dustin_runtime.attention import ForwardContext, reference_attention
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.ops import SparseOps
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.measures import ArrMeter, TrueAttention, attention_probs
from dustin_runtime.sparse.selection import QuestPages, quest_indices, streaming_indices
from dustin_runtime.sparse.signals import DraftLookahead, TargetHistory

REF = SparseOps(triton=False)


def test_streaming_indices():
    out = torch.empty(3, 8, dtype=torch.int32)
    streaming_indices(torch.tensor([5, 8, 30], dtype=torch.int32), 2, out)
    assert out[0].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    assert out[1].tolist() == list(range(8))
    assert out[2].tolist() == [0, 1, 24, 25, 26, 27, 28, 29]


def _pages_from_scratch(k, lens, page):
    B, G, N, D = k.shape
    P = -(-N // page)
    lo = torch.zeros(B, G, P, D)
    hi = torch.zeros(B, G, P, D)
    for b in range(B):
        L = int(lens[b])
        for p in range(-(-L // page)):
            rows = k[b, :, p * page: min((p + 1) * page, L)]
            lo[b, :, p], hi[b, :, p] = rows.amin(1), rows.amax(1)
    return lo, hi


def test_quest_pages_follow_commits_and_rollbacks():
    g = torch.Generator().manual_seed(0)
    B, G, N, D, page, span = 3, 2, 90, 8, 16, 5
    k = torch.randn(B, G, N, D, generator=g)
    lens = torch.tensor([20, 33, 47], dtype=torch.int32)
    pages = QuestPages(1, B, G, N, D, page, span, torch.float32, "cpu")
    for i in range(8):
        pages.refresh(0, k, lens, full=i == 0)
        lo, hi = _pages_from_scratch(k, lens, page)
        live = -(-int(lens.max()) // page)
        for b in range(B):
            n = -(-int(lens[b]) // page)
            assert torch.equal(pages.kmin[0][b, :, :n], lo[b, :, :n])
            assert torch.equal(pages.kmax[0][b, :, :n], hi[b, :, :n])
        assert live <= pages.P
        # a verification pass writes span rows past L (garbage for rejected ones), then commits 0..span
        for b in range(B):
            L = int(lens[b])
            k[b, :, L: L + span] = torch.randn(G, span, D, generator=g) * 5
        lens = lens + torch.randint(0, span + 1, (B,), generator=g).to(torch.int32)


def test_quest_bounds_are_upper_bounds_and_pick_the_hot_page():
    g = torch.Generator().manual_seed(1)
    B, G, H, M, N, D, page = 2, 2, 4, 3, 96, 8, 16
    k = torch.randn(B, G, N, D, generator=g)
    q = torch.randn(B, H, M, D, generator=g)
    lens = torch.tensor([96, 70], dtype=torch.int32)
    k[:, :, 40] = q.view(B, G, -1, D).mean(2) * 8  # row 40 (page 2) aligns with every query of its group
    pages = QuestPages(1, B, G, N, D, page, 4, torch.float32, "cpu")
    pages.refresh(0, k, lens, full=True)
    ub = pages.bounds(0, q)  # [B, G, P]
    logits = torch.einsum("bgrd,bgnd->bgrn", q.view(B, G, -1, D), k)  # [B, G, HG * M, N]
    for b in range(B):
        for p in range(-(-int(lens[b]) // page)):
            rows = logits[b, :, :, p * page: min((p + 1) * page, int(lens[b]))]
            assert (rows.amax(dim=(1, 2)) <= ub[b, :, p] + 1e-5).all()
    S, sinks, window = 24, 2, 4
    out = torch.empty(B * G, S, dtype=torch.int32)
    idx = quest_indices(ub, lens, page, N, sinks, window, REF, out)  # [B, G, S]
    assert idx.shape == (B, G, S)
    for b in range(B):
        for grp in range(G):
            row = idx[b, grp].tolist()
            assert row == sorted(set(row)) and 40 in row and len(row) == S
            L = int(lens[b])
            assert set(range(sinks)) | set(range(L - window, L)) <= set(row)
            chosen = [i for i in row if sinks <= i < L - window]
            best = int(ub[b, grp, : -(-L // page)].argmax())
            assert set(range(best * page, best * page + page)) & set(range(sinks, L - window)) <= set(chosen)


def _softmax_mass(q, k, L):
    """Sum over heads and queries of softmax(q . k / sqrt(D)) over rows [0, L): [L]."""
    s = torch.einsum("hmd,hnd->hmn", q, k[:, :L]) / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1).sum(dim=(0, 1))


def test_signals_equal_a_direct_softmax():
    g = torch.Generator().manual_seed(2)
    B, H, G, N, D, gamma = 2, 4, 2, 40, 8, 3
    k = [torch.randn(B, G, N, D, generator=g) for _ in range(3)]
    lens = torch.tensor([17, 30], dtype=torch.int32)
    heads = ((0, 1, (2, 3)), (2, 0, (1,)))
    look = DraftLookahead(heads, B, gamma, D, torch.float32, "cpu", "sum", REF)
    qs = [torch.randn(B, H, 1, D, generator=g) for _ in range(gamma)]  # one per draft forward
    first = torch.cat([torch.randn(B, H, 1, D, generator=g), qs[0]], dim=2)  # the first forward: [prev, cur]
    for j in reversed(range(gamma)):  # any order: each forward's last query lands in its slot
        for layer in look.layers:
            look.stash(layer, first if j == 0 else qs[j], j)
    out = torch.full((B, N), 7.0)
    look.score(k, lens, out)
    q = torch.cat(qs, dim=2)  # [B, H, gamma, D]
    for b in range(B):
        L = int(lens[b])
        want = _softmax_mass(q[b, 2:4], k[0][b, 1].expand(2, N, D), L) + _softmax_mass(q[b, 1:2], k[2][b, 0:1], L)
        assert torch.allclose(out[b, :L], want, atol=1e-5) and (out[b, L:] == 0).all()
    hist = TargetHistory(heads, "cpu", "sum", REF)
    out2 = torch.full((B, N), 7.0)
    for layer in range(3):
        hist.score(layer, q, k[layer], lens, out2)
    assert torch.allclose(out2, out, atol=1e-5)


def test_true_attention_and_arr_of_a_set():
    g = torch.Generator().manual_seed(3)
    B, H, G, M, N, D = 2, 4, 2, 3, 30, 8
    q = torch.randn(B, H, M, D, generator=g)
    cache = KVCache([torch.randn(B, G, N, D, generator=g)], [torch.randn(B, G, N, D, generator=g)],
                    torch.tensor([20, 11], dtype=torch.int32))
    start = cache.lengths.clone()
    ctx = ForwardContext(start, start.view(B, 1).long() + torch.arange(M), M, "verify")
    p = attention_probs(q, cache.k[0], start)  # [B, G, HG * M, N]
    for b in range(B):  # query j sees rows <= start + j
        for r in range(2 * M):
            assert (p[b, :, r, int(start[b]) + r % M + 1:] == 0).all()
    true = TrueAttention(B, N, 1, G, "cpu", per_layer=True)
    true.begin(ctx)
    out = true.attend(0, q, cache, ctx)
    assert torch.allclose(out, reference_attention(q, cache.k[0], cache.v[0], start), atol=1e-5)
    # A: each query's attention on the context, renormalised (the new tokens' mass is left out)
    share = p * (torch.arange(N) < start.view(B, 1, 1, 1))
    share = share / share.sum(-1, keepdim=True)  # [B, G, HG * M, N]
    assert torch.allclose(true.ctx, share.mean(dim=(1, 2)), atol=1e-6)
    assert torch.allclose(true.ctx.sum(1), torch.ones(B))
    assert (true.ctx[0, 20:] == 0).all() and (true.ctx[1, 11:] == 0).all()
    assert torch.allclose(true.layer_ctx[0].mean(1), true.ctx)
    every = torch.where(torch.arange(N) < start.view(B, 1), torch.arange(N), -1).to(torch.int32)
    meter = ArrMeter(B, 1, "cpu")
    meter.shared(true, every)
    assert torch.allclose(meter.step, torch.ones(B, dtype=torch.float64))
    some = every[:, :8].contiguous()
    meter.shared(true, some)
    want = true.ctx[:, :8].sum(1)
    assert torch.allclose(meter.step.float(), want) and (want < 1).all()
    meter.begin_layers()
    meter.layer(true, 0, some.view(B, 1, 8).expand(B, G, 8))
    assert torch.allclose(meter.step.float(), want)


def test_config_budget_rules():
    cfg = SparseConfig(budget=512, sinks=4, window=64, m=222)
    small = cfg.with_budget(128)
    assert small.m == round(222 / 444 * 60) and small.free == 60
    with pytest.raises(Exception, match="smaller than sinks"):
        cfg.with_budget(60)


def test_arr_stays_in_unit_interval_under_rounding():
    """A set covering the context has ARR exactly 1 however fp32 rounds A's terms; a query whose
    attention sits almost all on the new tokens counts as much as any other."""
    from dustin_runtime.sparse.recovery import context_attention, recovery

    g = torch.Generator().manual_seed(5)
    P, R, N = 64, 40, 997
    logits = torch.randn(P, R, N, generator=g) * 6
    logits[:, :, -5:] += 12.0  # most of the mass on the (last 5) new tokens
    probs = torch.softmax(logits, -1)
    L = torch.full((P,), N - 5)
    A = context_attention(probs, L)  # [P, N]
    ctx = probs[..., : N - 5]
    want = (ctx / ctx.sum(-1, keepdim=True)).double().mean(1)
    torch.testing.assert_close(A[:, : N - 5].double(), want, atol=1e-7, rtol=1e-5)
    assert (A[:, N - 5:] == 0).all()
    every = torch.arange(N, dtype=torch.int32).expand(P, N).clone()  # budget above the context
    every[:, N - 5:] = -1
    arr = recovery(A, every)
    assert arr.dtype == torch.float64 and (arr <= 1.0).all() and (arr > 1 - 1e-6).all()
    half = every[:, : (N - 5) // 2].contiguous()
    torch.testing.assert_close(recovery(A, half), A[:, : (N - 5) // 2].double().sum(1))
    meter = ArrMeter(P, 1, "cpu")
    meter.step.copy_(recovery(A * (1 + 1e-6), every))  # rounding upwards is clamped
    meter.commit(torch.ones(P, dtype=torch.bool))
    s = meter.summary()
    assert s["arr"] <= 1.0 and max(s["arr_per_sequence"]) <= 1.0
