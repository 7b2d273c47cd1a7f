"""The CUDA fast paths (fused layer ops, Triton attention backend) against the reference paths, run
through the Triton interpreter on CPU."""

import pytest
import torch

from dustin_runtime.attention import TorchAttention, TritonAttention
from dustin_runtime.loader import load_model
from dustin_runtime.speculative import speculative_generate

pytestmark = pytest.mark.interpreter  # CPU models: on a GPU host the gpu tests (test_graphs_gpu) cover these paths


@pytest.mark.parametrize("kind", ["llama3", "qwen3", "qwen2"])
def test_fused_model_matches_reference(tiny_hf, kind):
    folder, _ = tiny_hf(kind, seed=31)
    ref, _ = load_model(str(folder))
    fast, _ = load_model(str(folder))
    fast.use_kernels()
    assert fast.fused
    g = torch.Generator().manual_seed(32)
    tokens = torch.randint(0, 131, (2, 23), generator=g)
    c1, c2 = ref.allocate_cache(2, 40), fast.allocate_cache(2, 40)
    a = ref(tokens[:, :17], c1, TorchAttention(), phase="prefill", kv_len=17)
    b = fast(tokens[:, :17], c2, TritonAttention(), phase="prefill", kv_len=17)
    assert (a - b).abs().max() <= 1e-4
    c1.advance(17), c2.advance(17)
    c1.lengths[1] -= 3  # ragged: sequence 1 rolls back 3 rows
    c2.lengths[1] -= 3
    a = ref(tokens[:, 17:], c1, TorchAttention(), phase="verify")  # 6 verification queries
    b = fast(tokens[:, 17:], c2, TritonAttention(), phase="verify")
    assert (a - b).abs().max() <= 1e-4
    for layer in range(len(c1.k)):
        n = int(c1.lengths.min()) + 6
        assert torch.allclose(c1.k[layer][:, :, :n], c2.k[layer][:, :, :n], atol=1e-5)
        assert torch.allclose(c1.v[layer][:, :, :n], c2.v[layer][:, :, :n], atol=1e-5)


def test_speculative_with_kernels_equals_reference(tiny_hf):
    folder, _ = tiny_hf("llama3", seed=33)
    dfolder, _ = tiny_hf("llama3", seed=34, num_hidden_layers=1)
    t_ref, _ = load_model(str(folder))
    d_ref, _ = load_model(str(dfolder))
    t_fast, _ = load_model(str(folder))
    d_fast, _ = load_model(str(dfolder))
    t_fast.use_kernels(), d_fast.use_kernels()
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    a = speculative_generate(t_ref, d_ref, prompts, 12, gamma=3)
    import dustin_runtime.speculative as spec

    orig = spec.default_backend
    spec.default_backend = lambda device: TritonAttention()
    try:
        b = speculative_generate(t_fast, d_fast, prompts, 12, gamma=3)
    finally:
        spec.default_backend = orig
    assert a.tokens == b.tokens


@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_skinny_path_matches_reference(tiny_hf, kind, monkeypatch):
    """Forwards of <= 32 rows run wo and the MLP through `skinny_linear` (partial sums into the next
    norm); the logits of every position and of the last one match the reference path's."""
    from dustin_runtime.ops import kernels as sk

    folder, _ = tiny_hf(kind, seed=35)
    ref, _ = load_model(str(folder))
    fast, _ = load_model(str(folder))
    fast.use_kernels()
    assert fast.skinny
    calls = []
    real = sk.skinny_linear
    monkeypatch.setattr(sk, "skinny_linear", lambda *a, **k: calls.append(k) or real(*a, **k))
    g = torch.Generator().manual_seed(36)
    tokens = torch.randint(0, 131, (3, 16), generator=g)
    c1, c2 = ref.allocate_cache(3, 40), fast.allocate_cache(3, 40)
    ref(tokens[:, :11], c1, TorchAttention(), phase="prefill", kv_len=11, logits="none")
    fast(tokens[:, :11], c2, TritonAttention(), phase="prefill", kv_len=11, logits="none")  # 33 rows: cuBLAS
    assert not calls
    c1.advance(11), c2.advance(11)
    for logits in ("all", "last"):  # 3 x 5 = 15 rows: skinny
        a = ref(tokens[:, 11:], c1, TorchAttention(), phase="verify", logits=logits)
        b = fast(tokens[:, 11:], c2, TritonAttention(), phase="verify", logits=logits)
        assert a.shape == b.shape and (a - b).abs().max() <= 1e-4
    assert len(calls) == 2 * 4 * fast.cfg.num_layers and any(k.get("swiglu") for k in calls)
    calls.clear()
    fast(tokens[:, :10], fast.allocate_cache(3, 40), TritonAttention(), phase="prefill", kv_len=10,
         logits="none")  # 30 rows: skinny
    assert len(calls) == 4 * fast.cfg.num_layers
