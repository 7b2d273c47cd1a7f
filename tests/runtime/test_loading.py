"""Checkpoint resolution and loading: folders, sharded safetensors, hub ids in the local cache,
tokenizers and chat templates, and clear refusals."""

import json
import shutil

import pytest
import torch

from dustin_runtime.attention import TorchAttention
from dustin_runtime.errors import DustinError
from dustin_runtime.loader import load_model, resolve_checkpoint
from dustin_runtime.tokenizer import encode, eos_ids


def test_sharded_safetensors(tiny_hf, tmp_path):
    folder, hf = tiny_hf("qwen2", seed=51)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    a, _ = load_model(str(folder))
    b, _ = load_model(str(sharded))
    x = torch.randint(0, 131, (1, 9))
    assert torch.equal(a(x, a.allocate_cache(1, 9), TorchAttention()), b(x, b.allocate_cache(1, 9), TorchAttention()))


def test_hub_id_from_local_cache_offline(tiny_hf, tmp_path, monkeypatch):
    folder, _ = tiny_hf("llama3", seed=52)
    repo = tmp_path / "hub" / "models--acme--tiny-llama"
    snap = repo / "snapshots" / "0123456789abcdef"
    shutil.copytree(folder, snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    ckpt = resolve_checkpoint("acme/tiny-llama")
    assert ckpt.kind == "hf" and ckpt.path.resolve() == snap.resolve()
    with pytest.raises(DustinError, match="not in the local Hugging Face cache"):
        resolve_checkpoint("acme/absent-model")


def test_refusals(tmp_path):
    with pytest.raises(DustinError, match="no such checkpoint"):
        resolve_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DustinError, match="no config.json"):
        resolve_checkpoint(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(DustinError, match="unsupported architecture 'gpt_neox'; supported: llama, mistral, qwen2, qwen3"):
        load_model(str(bad))
    (bad / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "rope_scaling": {"rope_type": "longrope"}}))
    with pytest.raises(DustinError, match="unsupported rope scaling type 'longrope'"):
        load_model(str(bad))


def test_chat_template_and_eos(shared_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shared_dir / "tokenizers" / "qwen3"))
    plain = encode(tok, "What is 2 + 2?")
    chat = encode(tok, "What is 2 + 2?", chat=True)
    text = tok.decode(chat)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant") or "assistant" in text
    assert len(chat) > len(plain)
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos_ids(tok)
    with pytest.raises(DustinError, match="empty prompt"):
        encode(tok, "")


@pytest.mark.parametrize("device", ["cpu:x", "cuda:abc", "cpu:1", "tpu", "", " cpu", "cuda:", "mps"])
def test_malformed_device_strings_are_refused(device):
    from dustin_runtime.pipeline import pick_device

    with pytest.raises(DustinError, match="unknown device|no CUDA GPU|CUDA GPU\\(s\\) are visible"):
        pick_device(device)


def test_device_strings_that_name_this_machine():
    from dustin_runtime.pipeline import pick_device

    assert pick_device("cpu") == "cpu" and pick_device("cpu:0") == "cpu:0"
    assert pick_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        with pytest.raises(DustinError, match="are visible"):
            pick_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(DustinError, match="no CUDA GPU is visible"):
            pick_device("cuda:0")
