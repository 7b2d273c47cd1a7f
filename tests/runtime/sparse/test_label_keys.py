"""Label keys (score channels): the packed cache follows the KV cache, the scorers use the channels at
the model's scale, every channel in order equals whole keys, and bad channel tables are refused."""

import math
from dataclasses import replace

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.sparse.label_keys import LabelKeys
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

from .policy_cases import MAX_NEW, PROMPTS, config, policy_pair, run, spy_verify

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_tiny_hf):
    return policy_pair(tmp_path_factory.mktemp("labels") / "t", make_tiny_hf)


def channels(cfg, r, seed=0):
    """[Lt][G][r] distinct channels per layer and KV head, in no particular order."""
    g = torch.Generator().manual_seed(seed)
    return tuple(tuple(tuple(torch.randperm(cfg.head_dim, generator=g)[:r].tolist()) for _ in range(cfg.num_kv_heads))
                 for _ in range(cfg.num_layers))


def test_label_keys_write_fill_and_queries():
    """Awkward sizes: 3 KV heads, r = 5 of D = 16, ragged positions, a non-contiguous cache view."""
    torch.manual_seed(0)
    B, G, N, D, r = 2, 3, 37, 16, 5
    ch = torch.stack([torch.randperm(D)[:r] for _ in range(2 * G)]).view(2, G, r)
    lab = LabelKeys(ch, [1], B, N, D, torch.float32, "cpu")
    assert 0 not in lab and 1 in lab and lab.scale == 1 / math.sqrt(D)
    k = torch.randn(B, N, G, D).transpose(1, 2)  # [B, G, N, D], not contiguous
    lab.fill(1, k[:, :, :20])
    want = torch.stack([k[:, g, :, ch[1, g]] for g in range(G)], 1)  # [B, G, N, r]
    assert torch.equal(lab.k[1][:, :, :20], want[:, :, :20]) and not lab.k[1][:, :, 20:].any()
    pos = torch.tensor([[20, 21, 22], [30, 31, 32]])
    lab.write(1, k, pos)
    for b in range(B):
        assert torch.equal(lab.k[1][b, :, pos[b]], want[b, :, pos[b]])
    assert not lab.k[1][0, :, 23:].any()  # nothing else written
    lab.fill(1, k[1:], rows=(1, 2))
    assert torch.equal(lab.k[1][1], want[1])
    q = torch.randn(B, 4, 7, D)  # 4 query heads on KV heads 2, 0, 0, 1
    kv = torch.tensor([2, 0, 0, 1], dtype=torch.int32)
    got = lab.queries(q, lab.head_channels(1, kv))
    for j, g in enumerate(kv.tolist()):
        assert torch.equal(got[:, j], q[:, j][..., ch[1, g]])


def test_every_channel_in_order_equals_whole_keys(pair):
    """r = D in channel order: the label cache is a copy of the keys, so tokens and every set match."""
    target, draft = pair
    cfg = replace(config(target, draft, budget=24), refresh_layers=(1,))
    every = tuple(tuple(tuple(range(target.cfg.head_dim)) for _ in range(target.cfg.num_kv_heads))
                  for _ in range(target.cfg.num_layers))
    a, ha = run(pair, "dustin", cfg, trace=True)
    b, hb = run(pair, "dustin", replace(cfg, score_channels=every), trace=True)
    assert hb.labels is not None and ha.labels is None
    assert a.tokens == b.tokens and len(ha.trace) == len(hb.trace)
    assert all(torch.equal(x[2], y[2]) for x, y in zip(ha.trace, hb.trace, strict=True))


def test_scorers_use_the_channels_at_the_models_scale(pair):
    """With r < D: the refresh layer re-selects from softmax(q_c . k_c / sqrt(D)) over its channels
    (reference scores on the sliced whole keys), the label cache equals the cache's channels over
    every committed row, and the sets differ from whole-key scoring at times (the channels matter)."""
    from dustin_kernels import select_indices_ref, srh_scores_ref

    target, draft = pair
    t = target.cfg
    r = max(1, t.head_dim // 4)
    ch_t = channels(t, r)
    base = replace(config(target, draft, budget=24), refresh_layers=(1,))
    cfg = replace(base, score_channels=ch_t)
    hooks = make_policy("dustin", cfg, target=target, draft=draft)
    hooks.trace = []
    wanted = []

    def observe_verify(layer, q, cache, ctx):
        if layer == 1:
            c = hooks.cfg
            ch = torch.tensor(ch_t[1])  # [G, r]
            heads = torch.arange(t.num_heads) // t.n_rep
            qc = torch.stack([q[:, h][..., ch[g]] for h, g in enumerate(heads.tolist())], 1)
            kc = torch.stack([cache.k[1][:, g][..., ch[g]] for g in range(t.num_kv_heads)], 1)
            score = srh_scores_ref(qc, heads.to(torch.int32), kc, ctx.start, reduce="sum", scale=1 / math.sqrt(t.head_dim))
            wanted.append(select_indices_ref(score, None, ctx.start, budget=24, sinks=c.sinks, window=c.window,
                                             m=c.free))

    spy_verify(hooks, lambda: None, observe_verify)
    out = speculative_generate(target, draft, PROMPTS, MAX_NEW, gamma=3, hooks=hooks)
    refreshed = [idx for layer, _, idx in hooks.trace if layer == 1]
    assert len(refreshed) == len(wanted) == out.stats.steps
    assert all(torch.equal(a, b) for a, b in zip(refreshed, wanted, strict=True))
    lens = hooks.tcache.lengths
    for layer in hooks.labels.k:
        ch = torch.tensor(ch_t[layer])
        for b in range(len(PROMPTS)):
            L = int(lens[b])
            want = torch.stack([hooks.tcache.k[layer][b, g, :L][..., ch[g]] for g in range(t.num_kv_heads)])
            assert torch.equal(hooks.labels.k[layer][b, :, :L], want)
    whole, hw = run(pair, "dustin", base, trace=True)
    assert any(not torch.equal(x[2], y[2]) for x, y in zip(hooks.trace, hw.trace, strict=False))


def test_bad_channel_tables_refused(pair):
    target, draft = pair
    t = target.cfg
    cfg = config(target, draft, budget=24)
    good = channels(t, 3)
    with pytest.raises(DustinError, match="same number"):
        replace(cfg, score_channels=(good[0], (good[1][0][:2],) + good[1][1:]) + good[2:])
    with pytest.raises(DustinError, match="distinct"):
        replace(cfg, score_channels=tuple(tuple((1, 1, 2) for _ in layer) for layer in good))
    with pytest.raises(DustinError, match="distinct channels >= 0"):
        replace(cfg, score_channels=tuple(tuple((0, -1, 2) for _ in layer) for layer in good))
    with pytest.raises(DustinError, match="head dim"):
        replace(cfg, score_channels=tuple(tuple((0, 1, t.head_dim) for _ in layer) for layer in good)).check_models(
            t, draft.cfg)
    with pytest.raises(DustinError, match="layers"):
        replace(cfg, score_channels=good[:-1]).check_models(t, draft.cfg)
    assert replace(cfg, score_channels=good).channels_r == 3
