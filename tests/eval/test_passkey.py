"""Passkey prompts: exact length, the key at the right depth, scoring, heatmap."""

import pytest

from dustin_eval.corpus import read_filler
from dustin_eval.passkey import (
    INSTRUCTION,
    NEEDLE,
    QUESTION,
    make_passkey_prompt,
    passkey_accuracy,
    passkey_grid,
    plot_passkey_heatmap,
    random_passkey,
    score_passkey,
)
from dustin_runtime.errors import DustinError

FILLER = "".join(f"Line {i} of a dull book about nothing much.\n" for i in range(500))


def _check(tok, p, passkey, context, depth):
    needle = tok(NEEDLE.format(passkey=passkey), add_special_tokens=False)["input_ids"]
    question = tok(QUESTION, add_special_tokens=False)["input_ids"]
    assert len(p.ids) == context
    assert p.ids[p.needle_start : p.needle_start + p.needle_len] == needle
    assert p.ids[-len(question) :] == question
    head = p.needle_start - round(depth * p.filler_len)
    assert p.filler_len == context - head - len(needle) - len(question)
    # relative depth of the needle inside the filler
    assert abs((p.needle_start - head) - depth * p.filler_len) <= 0.5
    assert p.answer == str(passkey)


@pytest.mark.parametrize("context", [300, 333, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_exact_length_and_depth_char_tokenizer(context, depth, char_tokenizer):
    tok = char_tokenizer
    p = make_passkey_prompt(tok, FILLER, context, depth, 48213, seed=3)
    _check(tok, p, 48213, context, depth)
    text = tok.decode(p.ids, skip_special_tokens=True)
    assert text.startswith("There is an important piece of information")
    assert text.endswith("What is the pass key? The pass key is")
    if depth == 0.0:
        assert p.needle_start == len(tok.encode(INSTRUCTION))  # right after the instruction (+ BOS)
    if depth == 1.0:
        assert p.needle_start + p.needle_len == context - len(QUESTION)


def test_seed_changes_filler_only(char_tokenizer):
    tok = char_tokenizer
    a = make_passkey_prompt(tok, FILLER, 500, 0.5, 11111, seed=1)
    b = make_passkey_prompt(tok, FILLER, 500, 0.5, 11111, seed=1)
    c = make_passkey_prompt(tok, FILLER, 500, 0.5, 11111, seed=2)
    assert a.ids == b.ids and a.ids != c.ids and a.needle_start == c.needle_start


def test_filler_wraps_around_a_short_text(char_tokenizer):
    tok = char_tokenizer
    p = make_passkey_prompt(tok, "short filler.\n", 2000, 0.3, 12345, seed=0)
    assert len(p.ids) == 2000


def test_bad_requests(char_tokenizer):
    tok = char_tokenizer
    with pytest.raises(DustinError, match="shorter than"):
        make_passkey_prompt(tok, FILLER, 50, 0.5, 12345)
    with pytest.raises(DustinError, match="depth"):
        make_passkey_prompt(tok, FILLER, 500, 1.5, 12345)
    with pytest.raises(DustinError, match="digits"):
        make_passkey_prompt(tok, FILLER, 500, 0.5, "12a45")


def test_grid_and_scoring(char_tokenizer):
    tok = char_tokenizer
    prompts = list(passkey_grid(tok, FILLER, [300, 600], [0.0, 0.5, 1.0], trials=2, seed=7))
    assert len(prompts) == 12 and sorted({len(p.ids) for p in prompts}) == [300, 600]
    assert len({p.answer for p in prompts}) > 1
    assert random_passkey(5) == random_passkey(5) and len(str(random_passkey(5, digits=7))) == 7
    assert score_passkey(" 48213. Remember it.", "48213") == 1.0
    assert score_passkey(" 4821", "48213") == 0.0
    assert score_passkey(" 482130", "48213") == 0.0
    assert score_passkey(" I don't know", "48213") == 0.0


def test_accuracy_and_heatmap(tmp_path):
    records = [
        {"policy": "dustin", "budget": 512, "context_tokens": c, "depth": d, "score": s}
        for c in (2048, 4096)
        for d in (0.0, 0.5, 1.0)
        for s in (1.0, 0.0 if d == 0.5 else 1.0)
    ]
    acc = passkey_accuracy(records)
    assert len(acc) == 6
    assert {(r["context_tokens"], r["depth"]): r["accuracy"] for r in acc}[(4096, 0.5)] == 0.5
    assert all(r["n"] == 2 for r in acc)
    png = plot_passkey_heatmap(acc, tmp_path / "heat.png", title="dustin@512").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_real_tokenizer_and_gutenberg_filler(qwen3_tokenizer_dir, gutenberg_eval_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    filler = read_filler(gutenberg_eval_dir, max_books=2)
    for context, depth in [(2048, 0.0), (2048, 0.25), (4096, 0.75), (4096, 1.0)]:
        p = make_passkey_prompt(tok, filler, context, depth, 73918, seed=context)
        _check(tok, p, 73918, context, depth)
        assert "The pass key is 73918" in tok.decode(p.ids)
