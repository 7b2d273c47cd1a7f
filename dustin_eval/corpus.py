"""The Gutenberg corpus (one plain-text book per file), read in place, never copied."""

from __future__ import annotations

from pathlib import Path

from dustin_runtime.errors import DustinError

# ../shared/corpus/gutenberg beside the repository (see shared/README.md); pass a folder elsewhere.
DEFAULT_GUTENBERG = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "gutenberg"


def gutenberg_split(split: str = "eval") -> Path:
    """The default folder of a corpus split (`train`, `calib` or `eval`)."""
    return DEFAULT_GUTENBERG / split


def book_paths(books_dir: str | Path) -> list[Path]:
    """The `*.txt` books of a folder, sorted by file name."""
    books_dir = Path(books_dir)
    paths = sorted(books_dir.glob("*.txt")) if books_dir.is_dir() else []
    if not paths:
        raise DustinError(f"no .txt books in {books_dir}: give --data a folder of plain-text books, one a .txt "
                          "file (the defaults, ../shared/corpus/gutenberg/{train,calib,eval} beside the repository, hold them)")
    return paths


def read_book(path: Path) -> str:
    """A book's text; a file that is not UTF-8 is refused with one line."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DustinError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def read_filler(books_dir: str | Path, max_books: int | None = None) -> str:
    """The books of a folder joined by blank lines (in name order), as passkey filler text."""
    paths = book_paths(books_dir)[:max_books]
    return "\n\n".join(read_book(p) for p in paths)
