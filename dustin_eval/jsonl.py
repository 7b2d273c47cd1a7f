"""Append-only JSONL files that survive a crash: one record per line, fsynced as written; a reader
drops a torn last line (a kill during its write) and `repair_jsonl` cuts it off the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import append_line


def _parse(path: Path, lineno: int, line: str) -> dict:
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        raise DustinError(f"{path}:{lineno}: not a JSON line ({getattr(e, 'msg', 'nested too deeply')})") from None
    if not isinstance(rec, dict):
        raise DustinError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
    return rec


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DustinError(f"{path}: unreadable ({e.strerror or e})") from None


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Records of a JSONL data file; a bad line raises DustinError naming the file and line."""
    path = Path(path)
    try:
        text = _read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DustinError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield _parse(path, lineno, line)


def _complete(path: Path) -> tuple[bytes, int]:
    data = _read_bytes(path)
    return data, data.rfind(b"\n") + 1  # bytes up to the last complete line


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of an append-only JSONL file; a torn last line (no newline yet) is left out."""
    path = Path(path)
    if not path.exists():
        return []
    data, end = _complete(path)
    try:
        text = data[:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise DustinError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    return [_parse(path, i, line) for i, line in enumerate(text.split("\n"), 1) if line.strip()]


def repair_jsonl(path: str | Path) -> list[dict]:
    """`read_jsonl`, cutting a torn last line off the file so that appending can go on."""
    path = Path(path)
    records = read_jsonl(path)
    if path.exists():
        data, end = _complete(path)
        if end < len(data):
            with path.open("r+b") as f:
                f.truncate(end)
    return records


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a single line and fsync it."""
    append_line(path, json.dumps(record, ensure_ascii=False))
