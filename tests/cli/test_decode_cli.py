"""`dustin decode` end to end in a subprocess: bad input gives one clear line and a non-zero exit."""

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import make_tiny_hf


def run(*args, ok=False):
    p = subprocess.run([sys.executable, "-m", "dustin.cli", *args], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def assert_one_line_error(p, *needles):
    assert p.returncode != 0
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def tiny_with_tokenizer(folder, shared, family, **overrides):
    vocab = {"llama3": 128256, "qwen3": 151669}[family]
    kind = "llama3" if family == "llama3" else "qwen2"
    make_tiny_hf(kind, folder, vocab_size=vocab, hidden_size=32, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True, **overrides)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shared / "tokenizers" / family / f, folder / f)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory, shared_dir):
    root = tmp_path_factory.mktemp("cli")
    return {
        "llama": tiny_with_tokenizer(root / "llama", shared_dir, "llama3"),
        "llama_draft": tiny_with_tokenizer(root / "llama_draft", shared_dir, "llama3", num_hidden_layers=1),
        "qwen": tiny_with_tokenizer(root / "qwen", shared_dir, "qwen3"),
        "short": tiny_with_tokenizer(root / "short", shared_dir, "llama3", max_position_embeddings=64),
    }


def test_missing_checkpoint_folder(tmp_path):
    assert_one_line_error(run("decode", "--target", str(tmp_path / "nope"), "--prompt", "hi"), "no such checkpoint")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    p = run("decode", "--target", str(tmp_path), "--prompt", "hi")
    assert_one_line_error(p, "unsupported architecture 'gpt2'", "llama", "qwen2", "qwen3", "mistral")


def test_different_vocabularies(models):
    p = run("decode", "--target", str(models["llama"]), "--draft", str(models["qwen"]), "--prompt", "hi")
    assert_one_line_error(p, "different vocabularies")


def test_prompt_longer_than_context(models):
    p = run("decode", "--target", str(models["short"]), "--prompt", "word " * 200, "--max-new-tokens", "4")
    assert_one_line_error(p, "exceeds the model's context of 64 tokens")


def test_empty_prompt(models):
    assert_one_line_error(run("decode", "--target", str(models["llama"]), "--prompt", "  "), "empty prompt")


def test_bad_batch_file(models, tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text('{"prompt": "a"}\nnot json\n')
    assert_one_line_error(run("decode", "--target", str(models["llama"]), "--batch-file", str(f)), "b.jsonl:2")


def test_decode_json_record_speculative_equals_autoregressive(models, tmp_path):
    f = tmp_path / "batch.jsonl"
    f.write_text('{"prompt": "Once upon a time"}\n{"prompt": "The river ran", "max_new_tokens": 5}\n')
    common = ["--target", str(models["llama"]), "--batch-file", str(f), "--max-new-tokens", "9", "--json"]
    ar = json.loads(run("decode", *common, ok=True).stdout.strip().splitlines()[-1])
    sd = json.loads(run("decode", *common, "--draft", str(models["llama_draft"]), "--gamma", "3",
                        ok=True).stdout.strip().splitlines()[-1])
    assert [len(t) for t in ar["tokens"]] == [9, 5]
    assert sd["tokens"] == ar["tokens"] and sd["text"] == ar["text"]
    assert sd["stats"]["mode"] == "speculative" and sd["stats"]["gamma"] == 3
    assert ar["stats"]["mode"] == "autoregressive"
