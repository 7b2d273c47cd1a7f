"""The draft's vocabulary-subset head (FR-Spec, `--draft-vocab`): logits only for the kept tokens,
probability zero elsewhere, greedy speculative decoding stays exact (sampled: the joint-law test in
test_decoding.py); the token-counts artifact round trip and its refusals."""

import json

import pytest
import torch

from dustin_runtime.attention import TorchAttention
from dustin_runtime.draft_vocab import parse_spec, read_counts, subset_for, top_ids
from dustin_runtime.errors import DustinError
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model
from dustin_runtime.sampling import SamplingConfig, probs_from_logits
from dustin_runtime.speculative import speculative_generate


def test_head_over_a_subset_keeps_those_logits_and_zeroes_the_rest(tiny_hf):
    folder, _ = tiny_hf("llama3", seed=41)  # untied head
    full, _ = load_model(str(folder))
    sub, _ = load_model(str(folder))
    keep = torch.tensor([100, 3, 7, 3, 64, 0])  # unsorted, a duplicate
    sub.restrict_head(keep)
    assert sub.head_ids.tolist() == [0, 3, 7, 64, 100]
    toks = torch.randint(0, 131, (2, 9), generator=torch.Generator().manual_seed(42))
    a = full(toks, full.allocate_cache(2, 16), TorchAttention(), phase="prefill")
    b = sub(toks, sub.allocate_cache(2, 16), TorchAttention(), phase="prefill")
    assert b.shape == a.shape
    # the same dot products over d channels, summed in another order by a GEMM of 5 columns instead of
    # 131: |error| <= 2 d u sum_i |h_i w_i| <= 2 d u ||h|| ||w||, with ||h|| <= sqrt(d) max|g| after RMSNorm
    d_model = full.cfg.hidden_size
    tol = 2 * d_model * torch.finfo(torch.float32).eps * d_model ** 0.5 * full.norm.weight.abs().max() \
        * full.lm_head.weight.norm(dim=1).max()
    assert (b[..., sub.head_ids] - a[..., sub.head_ids]).abs().max() <= tol
    outside = torch.ones(131, dtype=torch.bool)
    outside[sub.head_ids] = False
    assert torch.isneginf(b[..., outside]).all()
    p = probs_from_logits(b[0, -1], SamplingConfig(temperature=0.7))
    assert p[outside].sum() == 0 and abs(p.sum().item() - 1) < 1e-6
    # the head reads 5 rows of the LM head instead of 131 (the byte floors' count)
    d = full.cfg.hidden_size * 4
    assert full.weight_bytes_read() - sub.weight_bytes_read() == (131 - 5) * d
    sub.restrict_head(None)
    assert torch.equal(sub(toks, sub.allocate_cache(2, 16), TorchAttention(), phase="prefill"), a)
    with pytest.raises(DustinError, match="token ids in"):
        sub.restrict_head(torch.tensor([5, 131]))


def test_greedy_speculative_with_a_subset_draft_emits_the_targets_tokens(tiny_hf):
    tfolder, _ = tiny_hf("qwen2", seed=43)
    dfolder, _ = tiny_hf("qwen2", seed=44, num_hidden_layers=1)
    target, _ = load_model(str(tfolder))
    draft, _ = load_model(str(dfolder))
    draft.restrict_head(torch.arange(0, 131, 3))  # a third of the vocabulary
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    ar = generate(target, prompts, 14)
    sd = speculative_generate(target, draft, prompts, 14, gamma=3)
    assert sd.tokens == ar.tokens
    assert any(t % 3 for seq in ar.tokens for t in seq)  # the target emits tokens the draft cannot propose


def test_spec_parsing_and_top_ids():
    assert parse_spec("32768") == (None, 32768)
    p, k = parse_spec("a/b:c.json:16")
    assert str(p) == "a/b:c.json" and k == 16
    for bad in ("x.json:0", "x.json:many", ""):
        with pytest.raises(DustinError, match="--draft-vocab"):
            parse_spec(bad)
    counts = torch.tensor([5, 9, 9, 0, 1, 7])
    assert top_ids(counts, 3).tolist() == [1, 2, 5]  # ties: the lower id first
    assert top_ids(counts, 2, keep=(3, 99)).tolist() == [1, 2, 3]  # keep adds EOS-like ids in range
    assert subset_for("4", 10).tolist() == [0, 1, 2, 3]


def test_token_counts_artifact_round_trip_and_refusals(small_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    from dustin_profile.vocab import count_tokens, write_token_counts

    tok = AutoTokenizer.from_pretrained(small_tokenizer)
    texts = ["the cat sat on the mat. " * 50, "a dog and the cat"]
    counts = count_tokens(tok, texts)
    want = torch.zeros(len(tok), dtype=torch.long)
    for t in texts:
        for i in tok(t, add_special_tokens=False)["input_ids"]:
            want[i] += 1
    assert torch.equal(torch.from_numpy(counts), want)
    out = write_token_counts(tmp_path / "v.json", counts, tok, books="mem", n_books=2, model_id="tiny")
    meta, got = read_counts(out)
    assert meta["tokens"] == int(want.sum()) and torch.equal(got, want)
    assert (tmp_path / "v.counts.parquet").exists()
    ids = subset_for(f"{out}:3", len(tok), tok, keep=(0,))
    assert ids.tolist() == sorted(set(top_ids(want, 3).tolist()) | {0})
    alien = AutoTokenizer.from_pretrained(small_tokenizer)
    alien.add_tokens(["<alien>"])
    with pytest.raises(DustinError, match="another tokenizer"):
        subset_for(f"{out}:3", len(alien), alien)
    with pytest.raises(DustinError, match="no such token-counts file"):
        read_counts(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "profile"}))
    with pytest.raises(DustinError, match="not a token-counts artifact"):
        read_counts(tmp_path / "bad.json")
