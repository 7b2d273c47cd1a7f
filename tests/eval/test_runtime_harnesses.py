"""The harnesses end to end on tiny random models through the runtime (full verification)."""

import json

import pytest

from dustin_eval.generator import RuntimeGenerator
from dustin_eval.passkey_eval import run_passkey
from dustin_eval.pg19_eval import PolicyRun, run_pg19
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model


@pytest.fixture
def tiny_pair(tmp_path, make_tiny_hf):
    make_tiny_hf("llama3", tmp_path / "t", seed=70, vocab_size=256, max_position_embeddings=1024)
    make_tiny_hf("llama3", tmp_path / "d", seed=71, vocab_size=256, max_position_embeddings=1024,
                 num_hidden_layers=1)
    return load_model(str(tmp_path / "t"))[0], load_model(str(tmp_path / "d"))[0]


def test_runtime_generator_matches_generate(tmp_path, tiny_pair):
    target, draft = tiny_pair
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11]]
    gen = RuntimeGenerator(target, draft, gamma=3, batch_size=2)
    res = gen.generate(prompts, [6, 9], eos_ids=[255], min_new_tokens=0)
    ref = generate(target, prompts, [6, 9], eos_ids=(255,))
    assert [r.tokens for r in res] == ref.tokens
    assert all("accept_len" in r.stats for r in res)


def test_pg19_runner_resumes_and_reports_full(tmp_path, char_tokenizer, tiny_pair):
    target, draft = tiny_pair
    books = tmp_path / "books"
    books.mkdir()
    for i in range(2):
        (books / f"b{i}.txt").write_text(("Call me Ishmael. Some years ago, never mind how long. " * 40)[i:])
    tok = char_tokenizer
    runs = [PolicyRun("full", None)]
    seen = []
    kw = dict(books_dir=books, context=200, eval_tokens=23, gamma=4, runs=runs, make_hooks=lambda r: None,
              windows=2, out_dir=tmp_path / "out", models={"target": "tiny"})
    rows = run_pg19(target, draft, tok, on_record=seen.append, **kw)
    assert len(seen) == 2 and rows[0]["policy"] == "full" and rows[0]["tokens"] == 40  # 2 x 4 windows of 5
    assert rows[0]["ppl_ratio"] == rows[0]["ppl_ratio_lo"] == rows[0]["ppl_ratio_hi"] == 1.0
    again = []
    run_pg19(target, draft, tok, on_record=again.append, **kw)
    assert again == []  # everything was done
    doc = json.loads((tmp_path / "out" / "pg19-200.json").read_text())
    assert doc["provenance"]["models"] == {"target": "tiny"} and doc["rows"][0]["ppl"] == rows[0]["ppl"]


def test_passkey_runner_writes_heatmap(tmp_path, char_tokenizer, tiny_pair):
    target, draft = tiny_pair
    tok = char_tokenizer
    rows = run_passkey(target, draft, tok, filler_text="The grass is green. " * 50, contexts=[300], depths=[0.0, 1.0],
                       trials=1, gamma=3, runs=[PolicyRun("full", None)], make_hooks=lambda r: None,
                       out_dir=tmp_path / "pk", models={}, max_new_tokens=4)
    assert {r["depth"] for r in rows} == {0.0, 1.0} and all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    assert (tmp_path / "pk" / "passkey-full.png").stat().st_size > 1000


def test_pg19_ratio_by_window_offset(tmp_path, char_tokenizer, tiny_pair):
    """Per-offset ratios: all 1 for full, and the pooled ratio is their geometric mean (every offset
    scores the same number of tokens per window)."""
    import math

    from dustin_runtime.sparse.config import SparseConfig
    from dustin_runtime.sparse.policies import make_policy

    target, draft = tiny_pair
    books = tmp_path / "books"
    books.mkdir()
    for i in range(3):
        (books / f"b{i}.txt").write_text(("It was the best of times, it was the worst of times. " * 40)[i:])
    cfg = SparseConfig(budget=24, sinks=2, window=6)
    runs = [PolicyRun("full", None), PolicyRun("streamingllm", 24)]
    hooks = {None: lambda: None, 24: lambda: make_policy("streamingllm", cfg, target=target, draft=draft)}
    rows = run_pg19(target, draft, char_tokenizer, books_dir=books, context=160, eval_tokens=31, gamma=4,
                    runs=runs, make_hooks=lambda r: hooks[r.budget](), windows=3, out_dir=tmp_path / "out",
                    models={})
    full, sl = rows
    assert full["ppl_ratio_by_offset"] == [1.0] * 5 and full["ppl_ratio_last"] == 1.0
    by = sl["ppl_ratio_by_offset"]
    assert len(by) == 5 and sl["ppl_ratio"] != 1.0
    assert abs(math.exp(sum(math.log(r) for r in by) / 5) - sl["ppl_ratio"]) < 1e-4
    assert sl["ppl_ratio_last_lo"] <= sl["ppl_ratio_last"] <= sl["ppl_ratio_last_hi"]
    assert sl["ppl_ratio_last"] == by[-1]
    batched = run_pg19(target, draft, char_tokenizer, books_dir=books, context=160, eval_tokens=31, gamma=4,
                       runs=runs, make_hooks=lambda r: hooks[r.budget](), windows=3, out_dir=tmp_path / "out2",
                       models={}, batch=2)  # windows 0-1 as one batch, window 2 alone
    for a, b in zip(rows, batched, strict=True):
        assert a["tokens"] == b["tokens"] and abs(a["ppl"] / b["ppl"] - 1) < 1e-4


def test_pg19_batch_keeps_lists_that_are_not_per_sequence(tmp_path, char_tokenizer, tiny_pair):
    """A batch of 2 windows through a policy with 2 refresh layers: each record gets its own window's
    ARR, and the policy's 2-entry refresh-layer list stays whole (it is not one value per sequence)."""
    from dustin_runtime.sparse.config import SparseConfig, every_head
    from dustin_runtime.sparse.policies import make_policy

    target, draft = tiny_pair
    books = tmp_path / "books"
    books.mkdir()
    for i in range(2):
        (books / f"b{i}.txt").write_text(("So it goes, and so on, and so forth. " * 40)[i:])
    heads = every_head(target.cfg)
    cfg = SparseConfig(budget=24, sinks=2, window=6, target_heads=tuple(h for h in heads if h[0] == 0),
                       refresh_layers=(0, 1))
    seen = []
    run_pg19(target, draft, char_tokenizer, books_dir=books, context=160, eval_tokens=31, gamma=4,
             runs=[PolicyRun("full", None), PolicyRun("dustin", 24)], windows=2, out_dir=tmp_path / "out",
             models={}, batch=2, on_record=seen.append,
             make_hooks=lambda r: r.budget and make_policy("dustin", cfg, target=target, draft=draft, measure_arr=True))
    seen = [r for r in seen if r["policy"] == "dustin"]
    assert len(seen) == 2 and all(r["policy_stats"]["refresh_layers"] == [0, 1] for r in seen)
    assert [r["arr"] for r in seen] == [r["policy_stats"]["arr_per_sequence"] for r in seen]
    assert seen[0]["arr"] != seen[1]["arr"]
