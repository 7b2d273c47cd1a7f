"""Passkey retrieval: a number hidden at a relative depth of Gutenberg filler, asked for at the end.

A prompt is built in token space so that it has exactly `context_tokens` ids:
    instruction | filler[:k] | needle | filler[k:] | question,   k = round(depth * filler length)
The answer is the passkey's digits; the generator continues "... The pass key is".
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dustin_runtime.errors import DustinError
from dustin_runtime.tokenizer import text_ids

INSTRUCTION = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there.\n\n"
)
NEEDLE = "\n\nThe pass key is {passkey}. Remember it. {passkey} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyPrompt:
    """A passkey prompt: `ids` (exactly `context_tokens`), the expected answer and where the needle is."""

    ids: list[int]
    answer: str
    context_tokens: int
    depth: float
    needle_start: int  # index in ids of the needle's first token
    needle_len: int
    filler_len: int  # filler tokens around the needle
    seed: int


def random_passkey(seed: int, digits: int = 5) -> int:
    """A passkey of `digits` digits (no leading zero), determined by `seed`."""
    return random.Random(seed).randint(10 ** (digits - 1), 10**digits - 1)


def _filler_ids(tokenizer, filler_text: str, n: int, seed: int) -> list[int]:
    # A seeded start at a line boundary; the text wraps around when it runs out.
    if not filler_text.strip():
        raise DustinError("passkey filler text is empty")
    start = random.Random(seed).randrange(len(filler_text))
    newline = filler_text.find("\n", start)
    start = newline + 1 if 0 <= newline < len(filler_text) - 1 else 0
    cycle = filler_text[start:] + "\n" + filler_text[:start]
    chars = 8 * n + 256
    while True:
        text = (cycle * (chars // len(cycle) + 1))[:chars]
        ids = text_ids(tokenizer, text, add_special_tokens=False)
        if len(ids) >= n:
            return ids[:n]
        chars *= 2


def make_passkey_prompt(
    tokenizer,
    filler_text: str,
    context_tokens: int,
    depth: float,
    passkey: int | str,
    seed: int = 0,
) -> PasskeyPrompt:
    """A prompt of exactly `context_tokens` ids hiding `passkey` at relative `depth` in [0, 1].

    depth 0 puts the needle right after the instruction, 1 right before the question. `seed`
    picks where the filler starts in `filler_text`. The instruction is tokenized with the
    tokenizer's special tokens (a BOS where it adds one); no chat template.
    """
    if not 0.0 <= depth <= 1.0:
        raise DustinError(f"passkey depth must be in [0, 1], got {depth}")
    passkey = str(passkey)
    if not passkey.isdigit():
        raise DustinError(f"passkey must be digits, got {passkey!r}")
    head = text_ids(tokenizer, INSTRUCTION, add_special_tokens=True)
    needle = text_ids(tokenizer, NEEDLE.format(passkey=passkey), add_special_tokens=False)
    question = text_ids(tokenizer, QUESTION, add_special_tokens=False)
    filler_len = context_tokens - len(head) - len(needle) - len(question)
    if filler_len < 0:
        raise DustinError(
            f"passkey context {context_tokens} tokens is shorter than the instruction, needle and "
            f"question ({context_tokens - filler_len} tokens); use --contexts >= {context_tokens - filler_len}"
        )
    filler = _filler_ids(tokenizer, filler_text, filler_len, seed) if filler_len else []
    k = round(depth * filler_len)
    ids = head + filler[:k] + needle + filler[k:] + question
    assert len(ids) == context_tokens
    return PasskeyPrompt(
        ids=ids,
        answer=passkey,
        context_tokens=context_tokens,
        depth=float(depth),
        needle_start=len(head) + k,
        needle_len=len(needle),
        filler_len=filler_len,
        seed=seed,
    )


def passkey_grid(
    tokenizer,
    filler_text: str,
    contexts: Sequence[int],
    depths: Sequence[float],
    trials: int = 1,
    seed: int = 0,
) -> Iterator[PasskeyPrompt]:
    """Prompts for every context x depth x trial, each with its own seeded passkey and filler."""
    for ci, context in enumerate(contexts):
        for di, depth in enumerate(depths):
            for t in range(trials):
                s = seed + 1_000_003 * ci + 10_007 * di + t
                yield make_passkey_prompt(
                    tokenizer, filler_text, context, depth, random_passkey(s), s
                )


def score_passkey(prediction: str, answer: str) -> float:
    """1.0 when the first number in the prediction is the passkey, else 0.0."""
    m = re.search(r"\d+", prediction)
    return 1.0 if m is not None and m.group(0) == str(answer) else 0.0


def passkey_accuracy(records: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Mean score per policy x budget x context x depth (records carry those keys and `score`)."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        key = (r.get("policy"), r.get("budget"), int(r["context_tokens"]), float(r["depth"]))
        groups.setdefault(key, []).append(float(r["score"]))
    return [
        {
            "policy": p,
            "budget": b,
            "context_tokens": c,
            "depth": d,
            "n": len(v),
            "accuracy": sum(v) / len(v),
        }
        for (p, b, c, d), v in sorted(
            groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]), kv[0][2], kv[0][3])
        )
    ]


def plot_passkey_heatmap(
    rows: Sequence[Mapping[str, Any]], path: str | Path, title: str | None = None
) -> Path:
    """PNG heatmap of `accuracy` (0-1): context length (rows) x needle depth (columns)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    contexts = sorted({int(r["context_tokens"]) for r in rows})
    depths = sorted({float(r["depth"]) for r in rows})
    if not contexts or not depths:
        raise DustinError("no passkey results to plot")
    grid = np.full((len(contexts), len(depths)), np.nan)  # [contexts, depths]
    for r in rows:
        grid[contexts.index(int(r["context_tokens"])), depths.index(float(r["depth"]))] = float(
            r["accuracy"]
        )
    fig = Figure(figsize=(1.0 + 0.9 * len(depths), 1.0 + 0.6 * len(contexts)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for i in range(len(contexts)):
        for j in range(len(depths)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_yticks(range(len(contexts)), [str(c) for c in contexts])
    ax.set_xlabel("needle depth")
    ax.set_ylabel("context (tokens)")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, label="retrieval accuracy")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    return path
