"""Prompts decoded in batches that fit memory (`pipeline.batch_size`, `memory.plan_decode_batch`):
many prompts under a small memory limit go through in several batches, and every sequence's
tokens are those it gets decoded alone."""

from pathlib import Path

import pytest
import torch

from dustin_runtime import pipeline
from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError
from dustin_runtime.generate import generate
from dustin_runtime.memory import GIB, decode_batch_size, plan_decode_batch
from dustin_runtime.speculative import speculative_generate
from dustin_runtime.tokenizer import encode, eos_ids


@pytest.fixture(scope="module")
def pair(small_models, one_thread):
    return pipeline.load_pair(str(small_models["target"]), str(small_models["draft"]), dtype=torch.float32,
                              device="cpu")


def prompts(n: int) -> list[pipeline.PromptSpec]:
    """n prompts of 1 to 6 words, 3 or 5 new tokens each."""
    words = ["river", "house", "morning", "light", "stone", "garden", "window"]
    return [pipeline.PromptSpec(" ".join(words[(i + j) % 7] for j in range(1 + i % 6)), 3 + 2 * (i % 2))
            for i in range(n)]


def limit_for(tgt, drf, specs, batch: int, gamma: int) -> int:
    """The memory that fits exactly `batch` of these prompts (the plan `pipeline.batch_size` checks)."""
    ids = [encode(tgt.tokenizer, p.text) for p in specs]
    return pipeline.batch_plan(tgt, drf, ids, [p.max_new_tokens for p in specs], gamma=gamma)(batch).total


def test_300_prompts_in_batches_equal_each_prompt_alone(pair):
    tgt, drf = pair
    specs = prompts(300)
    memory = limit_for(tgt, drf, specs, 37, 3)
    out = pipeline.decode(tgt, drf, specs, gamma=3, memory=memory)
    assert out.meta["batch_size"] == 37 and out.meta["batches"] == 9  # ceil(300 / 37)
    assert out.stats.batch == 300 and len(out.tokens) == 300 and len(out.stats.accepted[0]) == 300
    eos = eos_ids(tgt.tokenizer, tgt.model.cfg.eos_token_ids)
    for i, p in enumerate(specs):
        ids = encode(tgt.tokenizer, p.text)
        alone = speculative_generate(tgt.model, drf.model, [ids], p.max_new_tokens, gamma=3, eos_ids=eos)
        assert out.tokens[i] == alone.tokens[0], i
    assert sum(out.stats.new_tokens) == sum(map(len, out.tokens))
    steps = [sum(a >= 0 for a in row) for row in out.stats.accepted]
    assert len(steps) == out.stats.steps and all(s >= 1 for s in steps)  # every step belongs to one batch


def test_autoregressive_batches_equal_one_batch(pair):
    tgt, _ = pair
    specs = prompts(40)
    whole = pipeline.decode(tgt, None, specs)
    assert whole.meta["batches"] == 1
    split = pipeline.decode(tgt, None, specs, memory=limit_for(tgt, None, specs, 6, 0))
    assert split.meta["batches"] == 7 and split.tokens == whole.tokens  # ceil(40 / 6)
    ids = [encode(tgt.tokenizer, p.text) for p in specs[:3]]
    assert whole.tokens[:3] == generate(tgt.model, ids, [p.max_new_tokens for p in specs[:3]],
                                        eos_ids=eos_ids(tgt.tokenizer, tgt.model.cfg.eos_token_ids)).tokens


def test_no_room_for_one_prompt_is_one_line(pair):
    tgt, drf = pair
    with pytest.raises(DustinError, match="memory: one prompt of this decode needs .* free on the host"):
        pipeline.decode(tgt, drf, prompts(3), memory=1 << 20)


def test_ten_thousand_prompts_of_smollm2_shapes_are_planned_in_batches():
    """SmolLM2-135M shapes (vocabulary 49152): 10,000 prompts of 100 tokens and 128 new ones at 4 GiB
    go in batches whose plan fits, not all at once (their logits alone are ~ 6 GB in fp32)."""
    cfg = ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, max_position_embeddings=8192)

    def plan_at(b):
        return plan_decode_batch(cfg, cfg, batch=b, rows=100 + 128 + 11, prompt=100, gamma=4, dtype_bytes=4)

    size = decode_batch_size(plan_at, 10_000, 4 * GIB)
    assert 1 < size < 10_000 and plan_at(size).total <= 4 * GIB < plan_at(size + 1).total
    assert plan_at(10_000).part("activations") > 6e9


@pytest.mark.gpu
def test_decode_batches_stay_inside_their_plan_on_cuda():
    """The SmolLM2 pair (bf16, CUDA graphs): 600 prompts under a limit that fits a quarter of them
    go in batches, and the memory the decode allocates beside the loaded models peaks under the
    limit (the equality of the sequences' tokens across batch splits is the fp32 CPU test's)."""
    repo = Path(__file__).resolve().parents[2]
    tgt, drf = pipeline.load_pair("smollm2", str(repo / "models" / "smollm2-draft"), dtype=torch.bfloat16,
                                  device="cuda")
    specs = [pipeline.PromptSpec(("The river ran past the house every morning. " * (4 + i % 9)) + str(i), 16)
             for i in range(600)]
    memory = limit_for(tgt, drf, specs, 150, 4)
    whole = pipeline.decode(tgt, drf, specs, gamma=4, memory=1 << 40)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    split = pipeline.decode(tgt, drf, specs, gamma=4, memory=memory)
    peak = torch.cuda.max_memory_allocated() - base
    assert whole.meta["batches"] == 1 and split.meta["batches"] == 4, (whole.meta, split.meta)
    assert peak <= memory, (peak, memory)
    assert len(split.tokens) == 600 and sum(split.stats.new_tokens) > 0
