"""`dustin decode` end to end in a subprocess: speculative decoding gives the tokens of autoregressive
decoding (bad input: test_bad_input.py)."""

import json

import pytest


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_with_tokenizer):
    root = tmp_path_factory.mktemp("cli")
    return {
        "llama": tiny_with_tokenizer(root / "llama", "llama3"),
        "llama_draft": tiny_with_tokenizer(root / "llama_draft", "llama3", num_hidden_layers=1),
    }


def test_decode_json_record_speculative_equals_autoregressive(models, tmp_path, run_cli):
    f = tmp_path / "batch.jsonl"
    f.write_text('{"prompt": "Once upon a time"}\n{"prompt": "The river ran", "max_new_tokens": 5}\n')
    common = ["--target", str(models["llama"]), "--batch-file", str(f), "--max-new-tokens", "9", "--json"]
    ar = json.loads(run_cli("decode", *common, ok=True).stdout.strip().splitlines()[-1])
    sd = json.loads(run_cli("decode", *common, "--draft", str(models["llama_draft"]), "--gamma", "3",
                            ok=True).stdout.strip().splitlines()[-1])
    assert [len(t) for t in ar["tokens"]] == [9, 5]
    assert sd["tokens"] == ar["tokens"] and sd["text"] == ar["text"]
    assert sd["stats"]["mode"] == "speculative" and sd["stats"]["gamma"] == 3
    assert ar["stats"]["mode"] == "autoregressive"
