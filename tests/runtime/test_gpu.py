"""The runtime on a CUDA GPU: bf16 fast paths (fused layer ops, Triton attention, CUDA graphs)
against the fp32 reference path on the same device."""

import pytest
import torch

from dustin_runtime.attention import TorchAttention, TritonAttention
from dustin_runtime.loader import load_model
from dustin_runtime.speculative import speculative_generate

pytestmark = pytest.mark.gpu


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "qwen3"])
def test_bf16_fast_path_matches_fp32_reference(tiny_hf, kind):
    folder, _ = tiny_hf(kind, seed=41, hidden_size=256, num_attention_heads=4,
                        **({"head_dim": 64} if kind == "qwen3" else {}))
    ref, _ = load_model(str(folder), dtype=torch.float32, device="cuda")
    fast, _ = load_model(str(folder), dtype=torch.bfloat16, device="cuda")
    fast.use_kernels()
    assert fast.fused
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, 131, (3, 300), device="cuda", generator=g)
    c1, c2 = ref.allocate_cache(3, 320), fast.allocate_cache(3, 320)
    a = ref(tokens[:, :295], c1, TorchAttention(), phase="prefill", kv_len=295)
    b = fast(tokens[:, :295], c2, TritonAttention(), phase="prefill", kv_len=295)
    assert rel(b, a) < 2e-2
    c1.advance(295), c2.advance(295)
    a = ref(tokens[:, 295:], c1, TorchAttention(), phase="verify")
    b = fast(tokens[:, 295:], c2, TritonAttention(), phase="verify")
    assert rel(b, a) < 2e-2


def test_decode_step_captures_in_a_cuda_graph(tiny_hf):
    folder, _ = tiny_hf("llama3", seed=42, hidden_size=256, num_attention_heads=4)
    model, _ = load_model(str(folder), dtype=torch.bfloat16, device="cuda")
    model.use_kernels()
    cache = model.allocate_cache(4, 256)
    cache.lengths.copy_(torch.tensor([10, 50, 99, 200], dtype=torch.int32))
    tok = torch.randint(0, 131, (4, 5), device="cuda")
    backend = TritonAttention()
    eager = model(tok, cache, backend, phase="verify")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        model(tok, cache, backend, phase="verify")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(tok, cache, backend, phase="verify")
    cache.lengths.copy_(torch.tensor([10, 50, 99, 200], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_greedy_speculative_on_gpu_equals_autoregressive(tiny_hf):
    from dustin_runtime.generate import generate

    folder, _ = tiny_hf("qwen3", seed=43, hidden_size=256, num_attention_heads=4, head_dim=64)
    dfolder, _ = tiny_hf("qwen3", seed=43, hidden_size=256, num_attention_heads=4, head_dim=64,
                         num_hidden_layers=1)
    t, _ = load_model(str(folder), dtype=torch.float32, device="cuda")
    d, _ = load_model(str(dfolder), dtype=torch.float32, device="cuda")
    t.use_kernels(), d.use_kernels()
    prompts = [[1, 2, 3, 4, 5] * 20, [7, 8, 9], [11] * 64]
    ar = generate(t, prompts, 24)
    sd = speculative_generate(t, d, prompts, 24, gamma=4)
    assert sd.tokens == ar.tokens
