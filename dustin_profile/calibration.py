"""Calibration windows: long token windows cut from text files, JSONL or parquet with a fixed seed,
and the verification positions inside each window.

Each window holds `context + gamma + 1` tokens (the tokenizer's own prefix, e.g. BOS, first).
A verification pass at position L has the L tokens [0, L) as its context and the token at L as
`cur`; the positions sit in the last quarter of the window, so every pass sees about `context`
tokens of history."""

from __future__ import annotations

import glob
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from dustin_runtime.errors import DustinError

TEXT_SUFFIXES = (".txt", ".md")
RECORD_SUFFIXES = (".jsonl", ".parquet")
CHARS_PER_TOKEN = 5  # first guess of a span's length in characters; doubled until it is enough


@dataclass(frozen=True)
class Document:
    """One calibration document: where it came from and its text."""

    name: str  # file, or file:record for JSONL and parquet
    text: str


@dataclass(frozen=True)
class Window:
    """A calibration window: its source, the character offset it starts at, its token ids."""

    source: str
    offset: int
    tokens: tuple[int, ...]
    fact: tuple[int, int] | None = None  # rows [start, end) of a retrieval episode's fact


def _files(spec: str) -> list[Path]:
    p = Path(spec).expanduser()
    if p.is_dir():
        files = [f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES + RECORD_SUFFIXES]
        if not files:
            raise DustinError(f"{spec}: no .txt, .md, .jsonl or .parquet files in this folder")
        return sorted(files)
    if p.is_file():
        if p.suffix not in TEXT_SUFFIXES + RECORD_SUFFIXES:
            raise DustinError(f"{spec}: calibration files must be .txt, .md, .jsonl or .parquet")
        return [p]
    hits = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
    if not hits:
        raise DustinError(f"{spec}: no such calibration file or folder (--calib takes .txt, .md, .jsonl or "
                          ".parquet files, folders or globs; default ../shared/corpus/gutenberg/calib)")
    return hits


def _records(path: Path, field: str) -> list[str]:
    if path.suffix == ".jsonl":
        texts = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise DustinError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise DustinError(f"{path}:{i}: not a JSON line") from None
            if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
                raise DustinError(f"{path}:{i}: expected a JSON object with a {field!r} string (--text-field)")
            texts.append(rec[field])
        return texts
    import pandas as pd

    try:
        frame = pd.read_parquet(path, columns=[field])
    except Exception as e:
        first = (str(e).splitlines() or [""])[0]
        raise DustinError(f"{path}: cannot read column {field!r} (--text-field): {type(e).__name__}: {first}") from None
    return [str(t) for t in frame[field].tolist()]


def read_documents(specs: list[str] | tuple[str, ...], text_field: str = "text") -> list[Document]:
    """Documents from files, folders (searched recursively) or globs, in a fixed order."""
    docs = []
    for spec in specs:
        for f in _files(spec):
            if f.suffix in TEXT_SUFFIXES:
                docs.append(Document(str(f), f.read_text(encoding="utf-8", errors="replace")))
            else:
                docs.extend(Document(f"{f}:{i}", t) for i, t in enumerate(_records(f, text_field)))
    if not docs:
        raise DustinError("no calibration documents: give --calib files or folders holding text")
    return docs


def file_hashes(specs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """sha256 of every calibration file (for the artifact's provenance)."""
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for s in specs for f in _files(s)}


def tokenizer_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer puts before any text (e.g. BOS for Llama-3, nothing for SmolLM2)."""
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    return list(ids)


def cut_windows(tokenizer, docs: list[Document], n: int, length: int, seed: int = 0) -> list[Window]:
    """`n` windows of exactly `length` tokens: documents in a seeded order (cycled when n exceeds
    them), each window starting at a seeded random line start; documents too short are skipped."""
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    prefix = tokenizer_prefix(tokenizer)
    need = length - len(prefix)
    short: set[int] = set()
    windows: list[Window] = []
    i = 0
    while len(windows) < n:
        if len(short) == len(docs):
            raise DustinError(f"no calibration document has {length} tokens; use a smaller --context "
                              "or longer documents")
        d = order[i % len(order)]
        i += 1
        if d in short:
            continue
        text = docs[d].text
        span = need * CHARS_PER_TOKEN
        while True:
            if span >= len(text):
                off, chunk = 0, text
            else:
                off = rng.randrange(0, len(text) - span)
                nl = text.find("\n", off, off + 1000)
                off = nl + 1 if nl >= 0 else off
                chunk = text[off: off + span]
            ids = tokenizer.encode(chunk, add_special_tokens=False)
            if len(ids) >= need:
                windows.append(Window(docs[d].name, off, tuple(prefix + list(ids[:need]))))
                break
            if span >= len(text):
                short.add(d)
                break
            span *= 2
    return windows


def verification_positions(context: int, gamma: int, per_window: int) -> list[int]:
    """Context lengths L of the verification passes of a window, largest first: L = context,
    context - stride, ... with stride = max(gamma + 1, context // (4 * per_window))."""
    m = gamma + 1
    stride = max(m, context // (4 * per_window))
    pos = [context - j * stride for j in range(per_window)]
    if pos[-1] < 2 * m:
        raise DustinError(f"--context {context} is too short for {per_window} verification positions "
                          f"with gamma {gamma}: use --context >= {(per_window + 1) * m}")
    return pos


def windows_hash(windows: list[Window]) -> str:
    """sha256 of the windows' source file names, offsets and token ids (independent of the folder
    the files were read from)."""
    h = hashlib.sha256()
    for w in windows:
        h.update(json.dumps([Path(w.source).name, w.offset, list(w.tokens)]).encode())
    return h.hexdigest()


RETRIEVAL_NAMES = ("amber", "birch", "cobalt", "delta", "ember", "falcon", "granite", "harbor", "indigo", "juniper",
                   "kestrel", "lantern", "meadow", "nickel", "orchid", "pepper", "quartz", "raven", "saffron",
                   "tundra", "umber", "violet", "willow", "yarrow", "zephyr")


def retrieval_window(tokenizer, docs: list[Document], context: int, extra: int, index: int, seed: int = 0) -> Window:
    """A key-value retrieval episode of `context` tokens plus `extra` answer tokens: calibration
    prose with one fact ("The access code for the <name> vault is <6 digits>.") at a seeded depth,
    then a question whose answer starts at token `context`, so the verification pass at L =
    context retrieves the fact. Deterministic in (index, seed); the prose comes from `docs`
    (the calibration split, never the evaluation one), the template differs from the passkey eval's."""
    rng = random.Random(f"retrieval:{seed}:{index}")
    name, code = rng.choice(RETRIEVAL_NAMES), str(rng.randrange(100000, 1000000))
    needle = tokenizer.encode(f"\nThe access code for the {name} vault is {code}.\n", add_special_tokens=False)
    question = tokenizer.encode(f"\n\nQuestion: what is the access code for the {name} vault?\n"
                                f"Answer: the access code for the {name} vault is", add_special_tokens=False)
    answer = tokenizer.encode(f" {code}.", add_special_tokens=False)
    prefix = tokenizer_prefix(tokenizer)
    n_fill = context - len(prefix) - len(needle) - len(question)
    if n_fill < 16:
        raise DustinError(f"--context {context} is too short for a retrieval window: use --context >= "
                          f"{context - n_fill + 16} or --retrieval-windows 0")
    prose = cut_windows(tokenizer, docs, 1, len(prefix) + n_fill + extra, seed=rng.randrange(1 << 30))[0]
    filler = list(prose.tokens[len(prefix):])  # [n_fill + extra]
    k = int(rng.uniform(0.05, 0.95) * n_fill)
    ids = prefix + filler[:k] + needle + filler[k:n_fill] + question  # exactly `context`
    ids += (answer + filler[n_fill:])[:extra]
    start = len(prefix) + k
    return Window(f"retrieval:{prose.source}", prose.offset, tuple(ids), (start, start + len(needle)))
