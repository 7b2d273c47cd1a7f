"""Append-only JSONL files that survive a crash: one record per line, flushed as written."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from dustin_runtime.errors import DustinError


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    """Records of a JSONL file; a bad line raises DustinError naming the file and line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise DustinError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of an append-only JSONL file; a torn last line (no newline yet) is left out."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # bytes up to the last complete line
    records = []
    for lineno, line in enumerate(data[:end].decode("utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DustinError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
    return records


def repair_jsonl(path: str | Path) -> list[dict]:
    """`read_jsonl`, cutting a torn last line off the file so that appending can go on."""
    path = Path(path)
    records = read_jsonl(path)
    if path.exists():
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with path.open("r+b") as f:
                f.truncate(end)
    return records


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as a single line and flush it to disk."""
    line = json.dumps(record, ensure_ascii=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
