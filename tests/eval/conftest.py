"""Fixtures of the evaluation tests: a character tokenizer and a scripted generator (test doubles
of a Hugging Face tokenizer and of the runtime's generator, which the harnesses take as arguments).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from dustin_eval.generator import Completion


class CharTokenizer:
    """One token per character (id = code point + 3); BOS = 1 and EOS = 2 are special."""

    bos_token_id = 1
    eos_token_id = 2
    chat_template = "<user>{content}</user><assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True, verbose: bool = True) -> dict:
        ids = [ord(c) + 3 for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self(text, add_special_tokens=add_special_tokens)["input_ids"]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out = []
        for i in ids:
            if i < 3:
                if not skip_special_tokens:
                    out.append({0: "<pad>", 1: "<s>", 2: "</s>"}[i])
            else:
                out.append(chr(i - 3))
        return "".join(out)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw):
        assert not tokenize and add_generation_prompt and len(messages) == 1
        return self.chat_template.format(content=messages[0]["content"])


class ScriptedGenerator:
    """Answers each prompt with `respond(prompt_text)`, then EOS, within max_new_tokens.

    `fail_on_call=k` raises RuntimeError on the k-th call (1-based) to simulate a crash.
    """

    def __init__(self, tokenizer, respond: Callable[[str], str], fail_on_call: int | None = None):
        self.tokenizer = tokenizer
        self.respond = respond
        self.fail_on_call = fail_on_call
        self.calls: list[dict] = []

    def generate(self, prompts, max_new_tokens, eos_ids, min_new_tokens=0):
        self.calls.append(
            {
                "prompts": [list(p) for p in prompts],
                "max_new_tokens": list(max_new_tokens),
                "eos_ids": list(eos_ids),
                "min_new_tokens": min_new_tokens,
            }
        )
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("simulated crash")
        out = []
        for prompt, limit in zip(prompts, max_new_tokens, strict=True):
            text = self.respond(self.tokenizer.decode(list(prompt), skip_special_tokens=True))
            tokens = self.tokenizer.encode(text, add_special_tokens=False) + [eos_ids[0]]
            out.append(
                Completion(tokens=tokens[:limit], stats={"accept_len": 2.0, "steps": 3})
            )
        return out


@pytest.fixture
def char_tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
def scripted_generator() -> type[ScriptedGenerator]:
    """The class: scripted_generator(tokenizer, respond, fail_on_call=None)."""
    return ScriptedGenerator
