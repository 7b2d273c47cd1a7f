"""The dustin verification step that `dustin bench decode` times, run on CPU at a tiny shape: with
S covering the context it equals full verification; with a small S it attends the S selected rows
and differs; the retrieval heads and the byte floor are what the docstrings say."""

import pytest
import torch

from dustin_eval.bench_decode import sparse_verify_step, srh_heads
from dustin_runtime.attention import TorchAttention
from dustin_runtime.loader import load_model


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_tiny_hf):
    folder = tmp_path_factory.mktemp("bd") / "t"
    make_tiny_hf("qwen2", folder, seed=5, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4)
    target, _ = load_model(str(folder))
    draft, _ = load_model(str(folder))
    return target, draft


def _cache(model, B, L, M):
    cache = model.allocate_cache(B, L + M + 2)
    g = torch.Generator().manual_seed(3)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    cache.lengths.fill_(L)
    return cache


def test_srh_heads_are_distinct_and_well_formed(pair):
    cfg = pair[0].cfg
    heads = srh_heads(cfg, 4)
    assert len({(layer, g) for layer, g, _ in heads}) == 4
    assert {layer for layer, _, _ in heads} == {cfg.num_layers // 3, 2 * cfg.num_layers // 3}
    assert all(q == tuple(range(g * cfg.n_rep, (g + 1) * cfg.n_rep)) for _, g, q in heads)


def test_step_equals_full_verification_when_the_set_covers_the_context(pair):
    target, draft = pair
    B, L, gamma = 2, 40, 3
    tok = torch.randint(0, target.cfg.vocab_size, (B, gamma + 1), generator=torch.Generator().manual_seed(1))
    full = target(tok, _cache(target, B, L, gamma + 1), TorchAttention(), phase="verify")
    cache = _cache(target, B, L, gamma + 1)
    step, floor = sparse_verify_step(target, draft, cache, tok, budget=64, srh=2, gamma=gamma, window=8)
    for _ in range(2):  # the first pass fills the history the second selects from
        out = step()
    torch.testing.assert_close(out, full, rtol=1e-4, atol=1e-4)
    small_cache = _cache(target, B, L, gamma + 1)
    small, small_floor = sparse_verify_step(target, draft, small_cache, tok, budget=16, srh=2, gamma=gamma,
                                             window=8)
    assert (small() - full).abs().max() > 1e-3  # 16 of 40 rows: a different result
    assert small_floor < floor
