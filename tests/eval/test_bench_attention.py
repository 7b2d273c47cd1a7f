"""The CPU-side parts of `dustin bench attention`: option parsing, result names, the no-GPU error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dustin_eval import bench_attention as ba
from dustin_runtime.errors import DustinError
from dustin_runtime.presets import preset


def test_parse_list_and_result_path():
    assert ba.parse_list("8192,16384, 65536") == [8192, 16384, 65536]
    assert ba.parse_list("qwen2.5-72b,qwen2.5-7b", str) == ["qwen2.5-72b", "qwen2.5-7b"]
    with pytest.raises(DustinError, match="bad list"):
        ba.parse_list("8k")
    cfg = ba.BenchConfig(shape="qwen2.5-72b", context=32768, batch=16, budget=512)
    assert ba.result_path(Path("results/kernels-attention"), cfg).name == "attention-qwen2.5-72b-32768-16-512.json"


def test_shapes_come_from_the_presets():
    s = ba.attention_shape("qwen2.5-72b")
    assert (s.name, s.heads, s.kv_heads, s.head_dim, s.layers) == ("qwen2.5-72b", 64, 8, 128, 80)
    c = preset("llama-3-70b")  # an alias keeps its name in the record
    s = ba.attention_shape("llama-3-70b")
    assert (s.name, s.heads, s.kv_heads, s.head_dim, s.layers) == (
        "llama-3-70b", c.num_heads, c.num_kv_heads, c.head_dim, c.num_layers)
    with pytest.raises(DustinError, match="unknown model shape 'gpt-9'"):
        ba.attention_shape("gpt-9")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_needs_a_gpu():
    with pytest.raises(DustinError, match="CUDA GPU"):
        ba.run_attention_bench(ba.BenchConfig(shape="qwen2.5-72b", context=1024, batch=1, budget=64), "test")


def test_set_estimate_on_cpu_matches_the_references():
    """The bench's estimate of the set (srh_scores calls of its heads, accumulated, then
    select_indices) runs the launchers (the Triton interpreter off GPU) and equals the references;
    the cost model adds heads and selects as its docstring says."""
    from dustin_kernels import select_indices_ref, srh_scores_ref

    g = torch.Generator().manual_seed(0)
    B, G, r, M, D, N, S = 2, 4, 2, 3, 16, 203, 40
    calls = [2, 1]
    q = [torch.randn(B, h, r * M, D, generator=g) for h in calls]
    heads = [torch.tensor([3, 0][:h], dtype=torch.int32) for h in calls]
    keys = [torch.randn(B, G, N, D, generator=g) for _ in calls]
    lens = torch.tensor([N, 150], dtype=torch.int32)
    sec = torch.rand(B, N, generator=g)
    scores = torch.full((B, N), 7.0)
    out = torch.full((B, S), -7, dtype=torch.int32)
    kw = dict(budget=S, sinks=2, window=8, m=12)
    ba.estimate_set(q, heads, keys, lens, scores, sec, out, **kw)
    want = sum(srh_scores_ref(qi, hi, ki, lens) for qi, hi, ki in zip(q, heads, keys, strict=True))
    torch.testing.assert_close(scores, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(out, select_indices_ref(want, sec, lens, **kw))
    assert ba.estimate_cost_ms(1, 4, 2, srh_ms=0.1, select_ms=0.04) == pytest.approx(0.24)
    assert ba.estimate_cost_ms(3, 3, 2, srh_ms=0.1, select_ms=0.04) == pytest.approx(3 * (0.15 + 0.04))


def test_refresh_step_on_cpu_matches_the_references():
    """The bench's refresh layer (srh_scores of every KV head of one layer, normalised, select on that
    signal alone) equals the references and the runtime's re-selection rule; it is named in the file."""
    from dustin_kernels import select_indices_ref, srh_scores_ref

    g = torch.Generator().manual_seed(1)
    B, G, r, M, D, N, S = 2, 3, 3, 2, 16, 177, 37
    q = torch.randn(B, G, r * M, D, generator=g)
    heads = torch.arange(G, dtype=torch.int32)
    keys = torch.randn(B, G, N + 5, D, generator=g)[:, :, :N]  # a view, as a cache slice is
    lens = torch.tensor([N, 120], dtype=torch.int32)
    scores = torch.full((B, N), 3.0)
    out = torch.full((B, S), -9, dtype=torch.int32)
    kw = dict(budget=S, sinks=2, window=5, m=S - 7)
    ba.refresh_step(q, heads, keys, lens, scores, out, **kw)
    want = srh_scores_ref(q, heads, keys, lens)
    want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(scores, want, rtol=1e-5, atol=1e-7)
    assert torch.equal(out, select_indices_ref(want, None, lens, **kw))
    assert (out[1] < 120).all() and (out >= 0).all()
    cfg = ba.BenchConfig(shape="qwen2.5-72b", context=32768, batch=16, budget=512, refresh_layers=2)
    assert ba.result_path(Path("r"), cfg).name == "attention-qwen2.5-72b-32768-16-512-r2.json"
