"""The seam between the evaluation harnesses and the runtime: a greedy batch generator.

The harnesses build token-id prompts and score what comes back; the runtime (target + draft,
speculative decoding, a sparse-verification policy and budget) implements `Generator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class GenerationResult:
    """One prompt's output.

    tokens: the new token ids (prompt excluded), in order; when an id of `eos_ids` ended the
        generation it is the last one, as Hugging Face `generate` returns it.
    text: the decoded text when the generator decodes itself; None lets the harness decode
        `tokens` with `skip_special_tokens=True` (the LongBench rule).
    stats: per-prompt numbers the harness records and averages (e.g. `accept_len`, `steps`,
        `time_s`); JSON-serialisable values only.
    """

    tokens: list[int]
    text: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Generator(Protocol):
    """Greedy (argmax) continuation of a batch of token-id prompts.

    `generate(prompts, max_new_tokens, eos_ids, min_new_tokens)` returns one `GenerationResult`
    per prompt, in order. Prompt i gets at most `max_new_tokens[i]` new tokens; generation of a
    prompt stops after the first new token whose id is in `eos_ids` (shared by the batch), but
    never before `min_new_tokens` new tokens (ids in `eos_ids` are not allowed before that; the
    LongBench protocol uses 1 on samsum, whose stop set includes the newline token). Prompts are
    complete: special tokens and chat formatting are already in the ids.
    """

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        eos_ids: Sequence[int],
        min_new_tokens: int = 0,
    ) -> list[GenerationResult]: ...


def result_text(result: GenerationResult, tokenizer) -> str:
    """The result's text, or its tokens decoded without special tokens."""
    if result.text is not None:
        return result.text
    return tokenizer.decode(list(result.tokens), skip_special_tokens=True)
