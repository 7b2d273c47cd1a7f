"""PG-19-style windows: exact size, no overlap, deterministic seeded order."""

import math

import pytest

from dustin_eval.pg19 import book_order, iter_windows, perplexity
from dustin_runtime.errors import DustinError


@pytest.fixture()
def books(tmp_path):
    for name, n in [("a.txt", 250), ("b.txt", 99), ("c.txt", 430), ("d.txt", 100)]:
        (tmp_path / name).write_text("".join(chr(ord("a") + i % 26) for i in range(n)))
    return tmp_path


def test_windows_exact_and_contiguous(books, char_tokenizer):
    tok = char_tokenizer
    wins = list(iter_windows(tok, books, 100, seed=0))
    assert all(len(w.ids) == 100 for w in wins)
    per_book = {}
    for w in wins:
        per_book.setdefault(w.book, []).append(w)
    assert {b: len(ws) for b, ws in per_book.items()} == {"a.txt": 2, "c.txt": 4, "d.txt": 1}
    for b, ws in per_book.items():
        text = (books / b).read_text()
        assert [w.start for w in ws] == [100 * i for i in range(len(ws))]
        assert all(tok.decode(w.ids) == text[w.start : w.start + 100] for w in ws)


def test_seeded_order_is_deterministic(books, char_tokenizer):
    tok = char_tokenizer
    key = lambda seed: [(w.book, w.start) for w in iter_windows(tok, books, 100, seed=seed)]  # noqa: E731
    assert key(1) == key(1)
    orders = {tuple(p.name for p in book_order(books, s)) for s in range(10)}
    assert len(orders) > 1


def test_limits(books, char_tokenizer):
    tok = char_tokenizer
    assert len(list(iter_windows(tok, books, 100, max_windows=3))) == 3
    wins = list(iter_windows(tok, books, 100, max_windows_per_book=1))
    assert len(wins) == 3 and all(w.index == 0 for w in wins)
    with pytest.raises(DustinError):
        list(iter_windows(tok, books, 1))
    with pytest.raises(DustinError):
        list(iter_windows(tok, books / "missing", 100))


def test_perplexity():
    assert perplexity(0.0, 10) == 1.0
    assert perplexity(10 * math.log(4), 10) == pytest.approx(4.0)
    with pytest.raises(DustinError):
        perplexity(1.0, 0)


def test_real_eval_books(qwen3_tokenizer_dir, gutenberg_eval_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))
    wins = list(iter_windows(tok, gutenberg_eval_dir, 8192, seed=0, max_windows=3))
    assert len(wins) == 3 and all(len(w.ids) == 8192 for w in wins)
    assert len({w.book for w in wins}) == 1  # one book yields them all
    again = list(iter_windows(tok, gutenberg_eval_dir, 8192, seed=0, max_windows=1))
    assert again[0].ids == wins[0].ids
