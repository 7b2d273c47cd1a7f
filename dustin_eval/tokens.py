"""Tokenizer calls shared by the harnesses (a Hugging Face tokenizer or the same interface)."""

from __future__ import annotations


def encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of `text`; no length warnings (long contexts are the point here)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens, verbose=False)["input_ids"])
