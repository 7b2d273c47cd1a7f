"""A vocabulary that does not divide by the rank count (61 at 2 and 3 ranks, gloo on CPU): each
rank's share padded to ceil(61 / P) rows whose logits are -inf, so logits, greedy speculative
decoding and sampling equal one process's."""

import pytest
import torch

from dustin_runtime.tp import TensorParallel, padded_vocab, shard_config

V = 61
PROMPTS = [[(7 * b + 3 * i) % V for i in range(30 + 4 * b)] for b in range(3)]


@pytest.fixture(scope="module")
def odd(tmp_path_factory, make_tiny_hf):
    """A Qwen2 tiny target with 6 KV heads (divides by 2 and 3), untied, and a 1-layer draft."""
    root = tmp_path_factory.mktemp("odd-vocab")
    make_tiny_hf("qwen2", root / "target", vocab_size=V, hidden_size=96, num_attention_heads=6,
                 num_key_value_heads=6, tie_word_embeddings=False)
    make_tiny_hf("qwen2", root / "draft", 2, vocab_size=V, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2)
    return {k: str(root / k) for k in ("target", "draft")}


def test_shares_cover_the_vocabulary_padded():
    from dataclasses import replace

    from dustin_runtime.presets import preset

    cfg = replace(preset("qwen2.5-72b"), vocab_size=151669)  # the issue's: Qwen's tokenizer-sized vocabulary
    for world in (2, 4, 8):
        per = shard_config(cfg, TensorParallel(0, world)).vocab_size
        assert per * world == padded_vocab(cfg.vocab_size, world) >= cfg.vocab_size > per * (world - 1)


@pytest.mark.parametrize("world", [2, 3])
def test_odd_vocab_logits_equal_one_process(tp_run, odd, world):
    ref = tp_run.one("logits", target=odd["target"], prompts=[p[:30] for p in PROMPTS])
    per = -(-V // world)
    for out in tp_run.case("logits", world, target=odd["target"], prompts=[p[:30] for p in PROMPTS]):
        for key in ("chunk", "verify"):
            assert out[key].shape[-1] == V
            torch.testing.assert_close(out[key], ref[key], atol=1e-5, rtol=0)
        start = out["vocab_start"]
        real = min(per, V - start)
        torch.testing.assert_close(out["local"][..., :real], ref["local"][..., start: start + real], atol=1e-5, rtol=0)
        assert out["local"].shape[-1] == per and bool((out["local"][..., real:] == float("-inf")).all())


@pytest.mark.parametrize("world", [2, 3])
def test_odd_vocab_decoding_equals_one_process(tp_run, odd, world):
    kw = dict(target=odd["target"], draft=odd["draft"], prompts=PROMPTS, max_new=10)
    ref = tp_run.one("spec", **kw)
    for out in tp_run.case("spec", world, **kw):
        assert out["tokens"] == ref["tokens"] and out["accepted"] == ref["accepted"]
    kw = dict(target=odd["target"], prompts=PROMPTS[:2], temperature=0.8, top_p=0.9, seed=3, min_new=2, eos=[60])
    ref = tp_run.one("autoregressive", **kw)
    assert all(0 <= i < V for t in ref for i in t) and sum(map(len, ref)) > 2
    assert all(out == ref for out in tp_run.case("autoregressive", world, **kw))
