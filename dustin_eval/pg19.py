"""PG-19-style perplexity data: fixed, non-overlapping windows of N tokens from held-out books.

Books come in an order shuffled by `seed` (from their sorted file names); each book yields its
windows from its first token on, `book[i*N:(i+1)*N]`, leaving out a short tail. The same
tokenizer, folder, N and seed give the same windows.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dustin_runtime.errors import DustinError
from dustin_runtime.tokenizer import text_ids

from .corpus import book_paths, read_book


@dataclass(frozen=True)
class Window:
    """One window: `ids` (exactly N tokens) from `book` starting at token `start`."""

    book: str
    index: int  # window number within the book
    start: int
    ids: list[int]


def book_order(books_dir: str | Path, seed: int = 0) -> list[Path]:
    """The books of a folder in the seeded order."""
    paths = book_paths(books_dir)
    random.Random(seed).shuffle(paths)
    return paths


def iter_windows(
    tokenizer,
    books_dir: str | Path,
    window_tokens: int,
    seed: int = 0,
    max_windows: int | None = None,
    max_windows_per_book: int | None = None,
) -> Iterator[Window]:
    """Windows of `window_tokens` ids (no special tokens added), book by book in seeded order.

    Books are read and tokenized one at a time, only as far as the windows are consumed.
    """
    if window_tokens < 2:
        raise DustinError(f"window must be at least 2 tokens, got {window_tokens}")
    produced = 0
    for path in book_order(books_dir, seed):
        if max_windows is not None and produced >= max_windows:
            return
        ids = text_ids(tokenizer, read_book(path), add_special_tokens=False)
        count = len(ids) // window_tokens
        if max_windows_per_book is not None:
            count = min(count, max_windows_per_book)
        for i in range(count):
            if max_windows is not None and produced >= max_windows:
                return
            start = i * window_tokens
            yield Window(
                book=path.name, index=i, start=start, ids=ids[start : start + window_tokens]
            )
            produced += 1


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """exp(total negative log-likelihood in nats / number of predicted tokens)."""
    if n_tokens <= 0:
        raise DustinError("perplexity of zero tokens")
    return math.exp(nll_sum / n_tokens)
