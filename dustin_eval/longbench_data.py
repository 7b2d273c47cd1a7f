"""LongBench (v1) samples and prompts: JSONL loading, templates, middle truncation, chat format.

Prompt building follows the reference pred.py: format the template, tokenize; if longer than
the limit keep the first and last `limit // 2` tokens (decoded without special tokens and joined
as text); then the tokenizer's chat template, except on the few-shot and code tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dustin_runtime.errors import DustinError

from .jsonl import iter_jsonl
from .longbench_config import DATASETS, NEWLINE_STOP_DATASETS, NO_CHAT_DATASETS, prompt_templates
from .tokens import encode

FIELDS = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")


def load_dataset(data_dir: str | Path, dataset: str, limit: int | None = None) -> list[dict]:
    """Samples of `<data_dir>/<dataset>.jsonl` (LongBench v1 format), in file order."""
    if dataset not in DATASETS:
        raise DustinError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASETS)}")
    path = Path(data_dir) / f"{dataset}.jsonl"
    if not path.is_file():
        raise DustinError(f"{path} not found (LongBench v1 JSONL files, one per dataset)")
    samples = []
    for lineno, sample in enumerate(iter_jsonl(path), 1):
        missing = [k for k in FIELDS if k not in sample]
        if missing:
            raise DustinError(f"{path}:{lineno}: missing field(s) {', '.join(missing)}")
        samples.append(sample)
        if limit is not None and len(samples) >= limit:
            break
    return samples


def format_prompt(sample: dict, dataset: str) -> str:
    """The dataset's template filled with the sample's fields."""
    return prompt_templates()[dataset].format(**sample)


def middle_truncate(ids: Sequence[int], max_len: int) -> tuple[list[int], list[int]]:
    """(head, tail) with the first and last `max_len // 2` ids; (ids, []) when it fits.

    An odd `max_len` keeps `max_len - 1` ids, as the reference's `int(max_length / 2)` does.
    """
    ids = list(ids)
    if len(ids) <= max_len:
        return ids, []
    half = max_len // 2
    return ids[:half], (ids[-half:] if half else [])


def uses_chat_template(dataset: str) -> bool:
    """Whether the reference protocol wraps this dataset's prompt in the chat template."""
    return dataset not in NO_CHAT_DATASETS


@dataclass(frozen=True)
class LongBenchPrompt:
    """A ready prompt: `ids` go to the generator as they are."""

    ids: list[int]
    raw_tokens: int  # tokens of the formatted prompt before truncation
    truncated: bool
    chat: bool


def build_prompt(
    tokenizer,
    sample: dict,
    dataset: str,
    max_prompt_tokens: int,
    chat_template_kwargs: dict | None = None,
) -> LongBenchPrompt:
    """Token ids of one sample's prompt, middle-truncated to `max_prompt_tokens`.

    `tokenizer` is a Hugging Face tokenizer (or anything with `__call__`, `decode` and
    `apply_chat_template` of the same shape). Truncation counts the tokens of the formatted
    prompt with the tokenizer's special tokens, before the chat template, like pred.py; the chat
    template's own tokens come on top and re-tokenizing the two joined halves can differ by a
    token or two at the seam.
    """
    if max_prompt_tokens < 2:
        raise DustinError(f"prompt limit {max_prompt_tokens} tokens is too small")
    text = format_prompt(sample, dataset)
    ids = encode(tokenizer, text, add_special_tokens=True)
    head, tail = middle_truncate(ids, max_prompt_tokens)
    truncated = bool(tail)
    if truncated:
        text = tokenizer.decode(head, skip_special_tokens=True) + tokenizer.decode(
            tail, skip_special_tokens=True
        )
    chat = uses_chat_template(dataset)
    if chat:
        if getattr(tokenizer, "chat_template", None) is None:
            raise DustinError(f"{dataset} needs a chat template and the tokenizer has none")
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
            **(chat_template_kwargs or {}),
        )
        out = encode(tokenizer, text, add_special_tokens=False)
    elif truncated:
        out = encode(tokenizer, text, add_special_tokens=True)
    else:
        out = ids
    return LongBenchPrompt(ids=out, raw_tokens=len(ids), truncated=truncated, chat=chat)


def stop_ids(tokenizer, dataset: str, eos_ids: Sequence[int]) -> tuple[list[int], int]:
    """(stop ids, min new tokens): samsum adds the newline token and needs one new token."""
    ids = list(eos_ids)
    if dataset in NEWLINE_STOP_DATASETS:
        newline = tokenizer.encode("\n", add_special_tokens=False)[-1]
        if newline not in ids:
            ids.append(newline)
        return ids, 1
    return ids, 0
