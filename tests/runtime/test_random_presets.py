"""`random:<preset>` checkpoints: a published shape with random weights and its family's tokenizer,
usable wherever a checkpoint is (profile at preset shapes without the weights)."""

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.loader import load_model, read_config, resolve_checkpoint
from dustin_runtime.presets import preset
from dustin_runtime.tokenizer import load_tokenizer


def test_config_is_the_presets_and_the_tokenizer_its_familys():
    ckpt = resolve_checkpoint("random:qwen2.5-72b")
    assert ckpt.kind == "random" and ckpt.weight_files() == []
    assert read_config(ckpt) == preset("qwen2.5-72b")
    tok = load_tokenizer(ckpt)
    assert len(tok) <= preset("qwen2.5-72b").vocab_size  # every token id has a row
    assert tok.decode(tok("Speculative decoding")["input_ids"]) == "Speculative decoding"


def test_unknown_preset_refused_with_the_list():
    with pytest.raises(DustinError, match="unknown model shape 'gpt-9'; known: .*qwen2.5-7b"):
        resolve_checkpoint("random:gpt-9")


def test_random_weights_load_at_the_preset_shape():
    model, ckpt = load_model("random:smollm2", dtype=torch.float32)
    cfg = preset("smollm2-135m")
    assert model.cfg == cfg and model.embed.weight.shape == (cfg.vocab_size, cfg.hidden_size)
    assert 0.015 < float(model.layers[0].ffn.w2.weight.std()) < 0.025  # N(0, 0.02)
    assert len(load_tokenizer(ckpt)) == cfg.vocab_size

