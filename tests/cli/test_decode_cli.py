"""`dustin decode` end to end in a subprocess: speculative decoding gives the tokens of autoregressive
decoding (bad input: test_bad_input.py)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import tiny_with_tokenizer


def run(*args, ok=False):
    p = subprocess.run([sys.executable, "-m", "dustin.cli", *args], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def models(tmp_path_factory, shared_dir):
    root = tmp_path_factory.mktemp("cli")
    return {
        "llama": tiny_with_tokenizer(root / "llama", shared_dir, "llama3"),
        "llama_draft": tiny_with_tokenizer(root / "llama_draft", shared_dir, "llama3", num_hidden_layers=1),
    }


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
