"""Token frequencies for a vocabulary-subset draft head (FR-Spec): count every token of a text corpus
(books, tokenized with the pair's tokenizer), write them as a versioned artifact (JSON +
`<name>.counts.parquet`: token_id, count for every id of the vocabulary). The runtime keeps the K
most frequent (`dustin_runtime.draft_vocab`). Count on a split the evaluations do not use (train)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import atomic_path, atomic_write, published_together
from dustin_runtime.io.provenance import provenance
from dustin_runtime.tokenizer import vocab_hash

SCHEMA_VERSION = 1
KIND = "token-counts"
CHUNK_CHARS = 1 << 20  # tokenize books in slices of ~1 MB of text (memory stays flat)


def count_tokens(tokenizer, texts, on_text: Callable[[int], None] | None = None) -> np.ndarray:
    """Occurrences of every token id in `texts` (an iterable of strings), [V] int64, V = the
    tokenizer's size (added tokens included)."""
    V = len(tokenizer)
    counts = np.zeros(V, dtype=np.int64)
    for i, text in enumerate(texts):
        for lo in range(0, len(text), CHUNK_CHARS):
            hi = lo + CHUNK_CHARS
            while hi < len(text) and not text[hi].isspace():  # cut at whitespace: words stay whole
                hi += 1
            ids = tokenizer(text[lo:hi], add_special_tokens=False)["input_ids"]
            if ids:
                counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=V)[:V]
        if on_text is not None:
            on_text(i)
    return counts


def check_out(out: Path) -> Path:
    """The artifact's path, refused unless it names a .json file (checked before any counting)."""
    out = Path(out)
    if out.suffix != ".json":
        raise DustinError(f"{out}: the token counts artifact is a .json file (its table goes beside it)")
    return out


def write_token_counts(out: Path, counts: np.ndarray, tokenizer, *, books: str, n_books: int,
                       model_id: str) -> Path:
    """`out` (.json) and `out` with `.counts.parquet`, written atomically and published together."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = check_out(out)
    table_path = out.with_suffix(".counts.parquet")
    table = pa.table({"token_id": np.arange(len(counts), dtype=np.int32), "count": counts.astype(np.int64)})
    total = int(counts.sum())
    top = np.sort(counts)[::-1].cumsum() / max(total, 1)
    coverage = {str(k): float(top[min(k, len(top)) - 1]) for k in (1024, 4096, 8192, 16384, 32768) if k < len(top)}
    meta = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "model": model_id, "tokenizer_hash": vocab_hash(tokenizer),
        "vocab_size": len(counts), "books": books, "n_books": n_books, "tokens": total,
        "seen_tokens": int((counts > 0).sum()), "coverage_of_top_k": coverage, "table": table_path.name,
        "provenance": provenance(models={"tokenizer_of": model_id}),
    }
    with published_together():  # the table and the JSON: both new, or both as they were
        with atomic_path(table_path) as tmp:
            pq.write_table(table, tmp)
        atomic_write(out, json.dumps(meta, indent=1) + "\n")
    return out


def count_corpus(draft: str, books: Path | None, out: Path, on_book: Callable[[int], None] | None = None
                 ) -> tuple[Path, dict, int]:
    """`dustin profile vocab`: every token of the books (default: the Gutenberg train split) counted
    with `draft`'s tokenizer and written to `out`; returns (path, its JSON, books counted)."""
    from dustin_eval.corpus import book_paths, gutenberg_split, read_book
    from dustin_runtime.loader import resolve_checkpoint
    from dustin_runtime.tokenizer import load_tokenizer

    check_out(out)
    folder = books or gutenberg_split("train")
    paths = book_paths(folder)
    tok = load_tokenizer(resolve_checkpoint(draft))
    counts = count_tokens(tok, (read_book(p) for p in paths), on_text=on_book)
    path = write_token_counts(out, counts, tok, books=str(folder), n_books=len(paths), model_id=draft)
    return path, json.loads(path.read_text()), len(paths)
