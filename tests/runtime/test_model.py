"""Our decoder against Hugging Face transformers, and cache consistency."""

import pytest
import torch

from dustin_runtime.attention import TorchAttention
from dustin_runtime.loader import load_model


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(tokens).logits.float()


def test_logits_match_transformers(tiny_hf, tiny_kind):
    folder, hf = tiny_hf(tiny_kind)
    ours, _ = load_model(str(folder))
    tokens = torch.randint(0, ours.cfg.vocab_size, (3, 45), generator=torch.Generator().manual_seed(1))
    ref = hf_logits(hf, tokens)
    cache = ours.allocate_cache(3, 64)
    out = ours(tokens, cache, TorchAttention(), phase="prefill")
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("kind", ["llama3", "qwen3", "mistral"])
def test_chunked_prefill_then_decode_equals_one_forward(tiny_hf, kind):
    folder, _ = tiny_hf(kind, seed=3)
    model, _ = load_model(str(folder))
    T = 53
    tokens = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(2))
    full = model(tokens, model.allocate_cache(1, 80), TorchAttention(), phase="prefill")  # [1, T, V]
    cache = model.allocate_cache(1, 80)
    got = []
    for s in range(0, 31, 7):  # prefill in odd chunks of 7 up to 31 tokens
        e = min(s + 7, 31)
        got.append(model(tokens[:, s:e], cache, TorchAttention(), phase="prefill", kv_len=e))
        cache.advance(e - s)
    for t in range(31, T):  # then one token at a time
        got.append(model(tokens[:, t : t + 1], cache, TorchAttention(), phase="decode"))
        cache.advance(1)
    got = torch.cat(got, dim=1)
    assert (got - full).abs().max().item() <= 1e-4
    assert int(cache.lengths[0]) == T


def test_ragged_batch_decode_matches_each_sequence(tiny_hf):
    """Sequences at different lengths in one batch step give their own single-sequence logits."""
    folder, _ = tiny_hf("qwen2", seed=5)
    model, _ = load_model(str(folder))
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 131, (1, n), generator=g) for n in (5, 17, 30)]
    cache = model.allocate_cache(3, 40)
    for b, s in enumerate(seqs):
        model(s[:, :-1], cache.sequence(b), TorchAttention(), phase="prefill")
        cache.sequence(b).advance(s.shape[1] - 1)
    last = torch.cat([s[:, -1:] for s in seqs], dim=0)  # [3, 1]
    batched = model(last, cache, TorchAttention(), phase="decode")[:, -1]
    for b, s in enumerate(seqs):
        alone = model(s, model.allocate_cache(1, 40), TorchAttention(), phase="prefill")[:, -1]
        assert (batched[b] - alone[0]).abs().max().item() <= 1e-4


def test_rollback_by_length_overwrites_rejected_rows(tiny_hf):
    folder, _ = tiny_hf("llama3", seed=6)
    model, _ = load_model(str(folder))
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, 131, (1, 20), generator=g)
    junk = torch.randint(0, 131, (1, 5), generator=g)
    nxt = torch.randint(0, 131, (1, 3), generator=g)
    cache = model.allocate_cache(1, 40)
    model(prefix, cache, TorchAttention(), phase="prefill")
    cache.advance(20)
    model(junk, cache, TorchAttention(), phase="verify")  # rejected: rows 20..24 written, length kept
    out = model(nxt, cache, TorchAttention(), phase="verify")
    ref = model(torch.cat([prefix, nxt], 1), model.allocate_cache(1, 40), TorchAttention(), phase="prefill")
    assert (out - ref[:, 20:]).abs().max().item() <= 1e-4


def test_half_precision_close_to_fp32(tiny_hf):
    folder, _ = tiny_hf("qwen3", seed=8)
    m32, _ = load_model(str(folder))
    m16, _ = load_model(str(folder), dtype=torch.bfloat16)
    tokens = torch.randint(0, 131, (2, 19), generator=torch.Generator().manual_seed(9))
    a = m32(tokens, m32.allocate_cache(2, 32), TorchAttention(), phase="prefill")
    b = m16(tokens, m16.allocate_cache(2, 32), TorchAttention(), phase="prefill")
    assert m16.dtype == torch.bfloat16 and m16.allocate_cache(1, 4).k[0].dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
