"""Tensor parallelism on CPU (gloo, 2 and 4 processes forked by the `tp_run` fixture) against one
process: logits, greedy and sampled decoding, speculative decoding through every policy, the
verification sets and ARR, batch padding, and bad inputs."""

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.tp import check_gpus, shard_config

PROMPTS = [[(7 * b + 3 * i) % 131 + 1 for i in range(40 + 5 * b)] for b in range(4)]


@pytest.fixture(scope="module")
def models(tmp_path_factory, make_tiny_hf):
    """Tiny targets with 4 KV heads (Qwen2 with q/k/v biases and a tied head; Llama-3 with an o bias,
    GQA 2 and an untied head) and a 1-layer draft, vocabulary 132 (divides by 2 and 4)."""
    root = tmp_path_factory.mktemp("tp-models")
    make_tiny_hf("qwen2", root / "qwen2", vocab_size=132)
    make_tiny_hf("llama3", root / "llama3", 1, vocab_size=132, num_key_value_heads=4, attention_bias=True)
    make_tiny_hf("qwen2", root / "draft", 2, vocab_size=132, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2)
    return {k: str(root / k) for k in ("qwen2", "llama3", "draft")}


@pytest.mark.parametrize("kind,world", [("qwen2", 2), ("qwen2", 4), ("llama3", 2), ("llama3", 4)])
def test_tp_logits_equal_one_process(tp_run, models, kind, world):
    ref = tp_run.one("logits", target=models[kind], prompts=[p[:40] for p in PROMPTS])
    got = tp_run.case("logits", world, target=models[kind], prompts=[p[:40] for p in PROMPTS])
    for out in got:
        for key in ("chunk", "verify"):
            torch.testing.assert_close(out[key], ref[key], atol=1e-5, rtol=0)
        cols = slice(out["vocab_start"], out["vocab_start"] + 132 // world)
        torch.testing.assert_close(out["local"], ref["local"][..., cols], atol=1e-5, rtol=0)
        assert out["kv_heads"] == 4 // world


# target retrieval heads on every KV head of the tiny Llama (4 KV heads, 2 query heads each), a
# draft head for the lookahead; budget 24 of contexts 40..55 so the sets choose
DUSTIN = dict(budget=24, m=6, target_heads=[[0, 0, [0]], [1, 1, [2, 3]], [1, 2, [5]], [0, 3, [6, 7]]],
              draft_heads=[[0, 1, [1]]])


@pytest.mark.parametrize("policy,world", [("full", 2), ("dustin", 2), ("dustin", 4), ("streamingllm", 2),
                                          ("quest", 4), ("dustin-vs", 2), ("oracle", 2)])
def test_tp_greedy_speculative_equals_one_process(tp_run, models, policy, world):
    """Same tokens, accepted counts and (dustin) the same shared [B, S] sets on every rank as one
    process, and ARR averaged over ranks equal to one process's; -vs: drafting over the set."""
    kw = dict(target=models["llama3"], draft=models["draft"], prompts=PROMPTS, policy=policy, max_new=12)
    if policy.endswith("-vs"):
        kw.update(policy=policy.removesuffix("-vs"), draft_kv="verify-set")
        policy = kw["policy"]
    if policy != "full":
        kw.update(DUSTIN if policy == "dustin" else dict(budget=24))
    if policy == "dustin":
        kw.update(trace=True, measure_arr=True)
    ref = tp_run.one("spec", **kw)
    for out in tp_run.case("spec", world, **kw):
        assert out["tokens"] == ref["tokens"]
        assert out["accepted"] == ref["accepted"]
        assert out["sets"] == ref["sets"]
        if policy == "dustin":
            assert len(ref["sets"]) > 3 and out["arr"] == pytest.approx(ref["arr"], abs=1e-6)


def test_tp_refresh_layer_equals_one_process(tp_run, models):
    """A refresh layer scores every KV head of that layer on the rank that owns it; the sum over
    ranks gives one process's per-layer sets, tokens and ARR on every rank."""
    kw = dict(target=models["llama3"], draft=models["draft"], prompts=PROMPTS, policy="dustin", max_new=12,
              **DUSTIN, refresh_layers=[1], trace=True, measure_arr=True)
    ref = tp_run.one("spec", **kw)
    assert {layer for layer, _, _ in ref["sets"]} == {0, 1}
    for out in tp_run.case("spec", 2, **kw):
        assert out["tokens"] == ref["tokens"] and out["accepted"] == ref["accepted"]
        assert out["sets"] == ref["sets"]
        assert out["arr"] == pytest.approx(ref["arr"], abs=1e-6)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_tp_sampling_equals_one_process(tp_run, models, top_p):
    """Sampled autoregressive and speculative decoding draw what one process draws (the same noise,
    sliced per rank; the distribution is the target's either way)."""
    kw = dict(target=models["qwen2"], prompts=PROMPTS[:2], temperature=0.8, top_p=top_p, seed=3)
    ar = dict(min_new=3, eos=[70])  # an EOS id in rank 1's columns, forbidden for 3 tokens
    ref = tp_run.one("autoregressive", **kw, **ar)
    assert all(out == ref for out in tp_run.case("autoregressive", 2, **kw, **ar))
    kw.update(draft=models["draft"], policy="dustin", **DUSTIN, max_new=12)
    kw["target_heads"] = [[0, 0, [0]], [1, 3, [3]]]  # Qwen2 tiny: 4 KV heads of 1 query head
    ref = tp_run.one("spec", **kw)
    for out in tp_run.case("spec", 2, **kw):
        assert out["tokens"] == ref["tokens"] and out["accepted"] == ref["accepted"]


def test_tp_batch_not_dividing_is_padded(tp_run, models):
    """3 sequences on 2 ranks: padded with a one-token prompt that makes nothing; same output."""
    kw = dict(target=models["qwen2"], draft=models["draft"], prompts=PROMPTS[:3], max_new=9, eos=[5])
    ref = tp_run.one("spec", **kw)
    for out in tp_run.case("spec", 2, **kw):
        assert out["tokens"] == ref["tokens"] and out["accepted"] == ref["accepted"] and out["batch"] == 3


def test_tp_size_must_divide_the_kv_heads_and_fit_the_gpus(models):
    from dustin_runtime.loader import read_config, resolve_checkpoint
    from dustin_runtime.tp import TensorParallel

    cfg = read_config(resolve_checkpoint(models["llama3"]))  # 4 KV heads
    assert shard_config(cfg, TensorParallel(1, 2)).num_kv_heads == 2
    with pytest.raises(DustinError, match="--tp 3 does not divide the 4 KV heads"):
        shard_config(cfg, TensorParallel(0, 3))
    check_gpus(4, 4, 8)
    with pytest.raises(DustinError, match="--tp 4 puts 4 processes on this machine, which shows 2 GPUs"):
        check_gpus(4, 4, 2)


def test_collectives_of_a_step(tp_run, models):
    """What one dustin step sends: the draft's tokens and lookahead gathered, one all-reduce of the
    history [B, N], two all-reduces per layer and one for the embedding in each target forward, one
    gather of [2, B, gamma + 1] maxima for the argmax."""
    from dustin_runtime.engine import round_capacity
    from dustin_runtime.generate import cache_capacity

    B, d, L, gamma = 4, 64, 2, 3
    N = round_capacity(cache_capacity(PROMPTS, [6] * B, gamma))  # the caches' rows
    got = tp_run.case("collectives", 2, target=models["llama3"], draft=models["draft"], prompts=PROMPTS,
                      policy="dustin", **DUSTIN)[0]
    assert got["draft"] == [("all_gather", B // 2 * gamma, "torch.int64")]
    assert sorted(got["select"]) == [("all_gather", B // 2 * N, "torch.float32"),
                                     ("all_reduce", B * N, "torch.float32")]
    assert got["verify"] == [("all_reduce", B * (gamma + 1) * d, "torch.float32")] * (1 + 2 * L)
    assert got["accept"] == [("all_gather", 2 * B * (gamma + 1), "torch.float64")]


def test_tp_teacher_forced_equals_one_process(tp_run, models):
    """One window on 2 ranks (padded with a copy): the same NLL and ARR through dustin's sets."""
    seq = [[(5 * i) % 131 + 1 for i in range(64)]]
    kw = dict(target=models["llama3"], draft=models["draft"], sequences=seq, context=40, policy="dustin", **DUSTIN)
    ref = tp_run.one("teacher_forced", **kw)
    assert ref[2] is not None
    for nll, tokens, arr in tp_run.case("teacher_forced", 2, **kw):
        assert tokens == ref[1] and nll == pytest.approx(ref[0], rel=1e-5) and arr == pytest.approx(ref[2], abs=1e-6)


@pytest.mark.parametrize("policy", ["dustin", "streamingllm"])
def test_tp_exact_mode_equals_one_process_and_greedy(tp_run, models, policy):
    """Exact mode at 2 ranks: the tokens and agreement of one process, which are greedy decoding's."""
    kw = dict(target=models["llama3"], draft=models["draft"], prompts=PROMPTS, policy=policy, max_new=12, exact=3,
              **(DUSTIN if policy == "dustin" else dict(budget=8)))
    ref = tp_run.one("spec", **kw)
    assert ref["tokens"] == tp_run.one("autoregressive", target=models["llama3"], prompts=PROMPTS, max_new=12)
    for out in tp_run.case("spec", 2, **kw):
        assert out["tokens"] == ref["tokens"] and out["agreement"] == ref["agreement"]
