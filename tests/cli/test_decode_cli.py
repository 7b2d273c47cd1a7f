"""`dustin decode` end to end in a subprocess: speculative decoding gives the tokens of autoregressive
decoding (bad input: test_bad_input.py)."""

import json

import pytest

from dustin_runtime.exact import DEFAULT_K, EXACT_BUDGET


@pytest.fixture(scope="module")
def models(small_models):
    """The session's small Llama pair (the 1024-token tokenizer: loads in milliseconds)."""
    return {"llama": small_models["target"], "llama_draft": small_models["draft"]}


def test_decode_json_record_speculative_equals_autoregressive(models, tmp_path, run_cli):
    f = tmp_path / "batch.jsonl"
    f.write_text('{"prompt": "Once upon a time"}\n{"prompt": "The river ran", "max_new_tokens": 5}\n')
    common = ["--target", str(models["llama"]), "--prompts", str(f), "--max-new-tokens", "9", "--json"]
    ar = json.loads(run_cli("decode", *common, ok=True).stdout.strip().splitlines()[-1])
    sd = json.loads(run_cli("decode", *common, "--draft", str(models["llama_draft"]), "--gamma", "3",
                            ok=True).stdout.strip().splitlines()[-1])
    assert [len(t) for t in ar["tokens"]] == [9, 5]
    assert sd["tokens"] == ar["tokens"] and sd["text"] == ar["text"]
    assert sd["stats"]["mode"] == "speculative" and sd["stats"]["gamma"] == 3
    assert ar["stats"]["mode"] == "autoregressive"


def test_decode_with_a_vocabulary_subset_draft_keeps_the_tokens(models, tmp_path, run_cli):
    """`dustin profile vocab` counts tokens of some books; `--draft-vocab PATH:K` restricts the draft's
    head to the K most frequent: greedy speculative decoding still emits autoregressive decoding's
    tokens, and the record names the head's size."""
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("Once upon a time the river ran to the sea. " * 40)
    (books / "b.txt").write_text("The cat and the dog sat by the fire, and the night was long. " * 30)
    counts = tmp_path / "vocab.json"
    p = run_cli("profile", "vocab", "--draft", models["llama_draft"], "--data", books, "--out", counts, ok=True)
    assert "tokens of 2 books" in p.stdout and (tmp_path / "vocab.counts.parquet").exists()
    common = ["--target", str(models["llama"]), "--prompt", "Once upon a time", "--max-new-tokens", "9", "--json"]
    ar = json.loads(run_cli("decode", *common, ok=True).stdout.strip().splitlines()[-1])
    sd = json.loads(run_cli("decode", *common, "--draft", str(models["llama_draft"]), "--gamma", "3",
                            "--draft-vocab", f"{counts}:20", ok=True).stdout.strip().splitlines()[-1])
    assert sd["tokens"] == ar["tokens"]
    assert 20 <= sd["draft_head_tokens"] <= 23  # the 20 most frequent and the EOS ids


def test_decode_exact_gives_the_autoregressive_tokens(models, tmp_path, run_cli, assert_one_line_error):
    """--exact K and the -x policies give greedy decoding's tokens and report the K used (the runtime's
    tests cover budgets where sparse verification departs: tests/runtime/test_exact.py)."""
    f = tmp_path / "batch.jsonl"
    f.write_text('{"prompt": "Once upon a time there was a river that ran"}\n{"prompt": "The cat", '
                 '"max_new_tokens": 7}\n')
    common = ["--target", str(models["llama"]), "--prompts", str(f), "--max-new-tokens", "15", "--json"]
    ar = json.loads(run_cli("decode", *common, ok=True).stdout.strip().splitlines()[-1])
    spec = [*common, "--draft", str(models["llama_draft"]), "--gamma", "3"]
    for extra, k, budget in ((["--policy", "quest", "--exact", "3"], 3, EXACT_BUDGET),
                             (["--policy", "streamingllm-x", "--budget", "80"], DEFAULT_K, 80)):
        out = json.loads(run_cli("decode", *spec, *extra, ok=True).stdout.strip().splitlines()[-1])
        assert out["tokens"] == ar["tokens"]
        assert out["stats"]["extra"]["exact_k"] == k and out["stats"]["extra"]["budget"] == budget
    p = run_cli("decode", *common, "--exact", "2")
    assert_one_line_error(p, "--exact", "--draft", code=2)
    p = run_cli("decode", *spec, "--exact", "9")
    assert_one_line_error(p, "--exact", code=2)
