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
    assert ba.result_path(Path("results/bench"), cfg).name == "attention-qwen2.5-72b-32768-16-512.json"


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
