"""LongBench (v1) samples and prompts: loading, templates, middle truncation, chat format.

Samples come from a folder of `<dataset>.jsonl` files (LongBench's data.zip) or from the local
Hugging Face datasets cache, read offline (`datasets`, an optional dependency: `pip install
dustin[datasets]`).

Prompt building follows the reference pred.py: format the template, tokenize; if longer than
the limit keep the first and last `limit // 2` tokens (decoded without special tokens and joined
as text); then the tokenizer's chat template, except on the few-shot and code tasks.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dustin_runtime.errors import DustinError
from dustin_runtime.tokenizer import text_ids

from .jsonl import iter_jsonl
from .longbench_config import DATASETS, NEWLINE_STOP_DATASETS, NO_CHAT_DATASETS, prompt_templates

FIELDS = ("input", "context", "answers", "length", "dataset", "language", "all_classes", "_id")
HUB_IDS = ("THUDM/LongBench", "zai-org/LongBench")  # where LongBench v1 lives on the Hub
SOURCE_HELP = ("a folder of LongBench <dataset>.jsonl files, a Hugging Face datasets cache folder holding "
               f"{' or '.join(HUB_IDS)}, or a dataset id in the default datasets cache")


@dataclass(frozen=True)
class _Source:
    folder: Path | None  # the JSONL folder, else None
    cache_dir: Path | None = None  # the datasets cache (None: datasets' default)
    repo_id: str = ""


def _datasets():
    """The `datasets` package, offline (HF_DATASETS_OFFLINE=1) unless the environment says otherwise."""
    explicit = "HF_DATASETS_OFFLINE" in os.environ
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DustinError("reading LongBench from the Hugging Face datasets cache needs the datasets package "
                          "(pip install 'dustin[datasets]')") from None
    if not explicit:
        datasets.config.HF_HUB_OFFLINE = True  # also when it was imported before the variable was set
    return datasets


def _cache_root(src: _Source) -> Path:
    """<cache>/<namespace>___<snake_name>: where `datasets` keeps a Hub dataset's configurations."""
    datasets = _datasets()
    from datasets.naming import camelcase_to_snakecase

    cache = src.cache_dir or Path(datasets.config.HF_DATASETS_CACHE)
    ns, name = src.repo_id.split("/")
    return cache / f"{ns}___{camelcase_to_snakecase(name)}"


def _locate(source: str | Path) -> _Source:
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        if any((path / f"{d}.jsonl").is_file() for d in DATASETS):
            return _Source(path)
        for repo_id in HUB_IDS:
            if any(path.glob(f"{repo_id.split('/')[0]}___*")):
                src = _Source(None, path, repo_id)
                if _cache_root(src).is_dir():
                    return src
        return _Source(path)  # a JSONL folder without the file asked for: load_dataset names it
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not path.exists():
        return _Source(None, None, text)
    raise DustinError(f"{text}: no such folder ({SOURCE_HELP})")


def available_datasets(source: str | Path) -> list[str]:
    """The English LongBench datasets `source` holds, in the order of `DATASETS`."""
    src = _locate(source)
    if src.folder is not None:
        return [d for d in DATASETS if (src.folder / f"{d}.jsonl").is_file()]
    root = _cache_root(src)
    return [d for d in DATASETS if (root / d).is_dir()]


def input_hashes(source: str | Path, datasets: Sequence[str]) -> dict[str, str]:
    """{<dataset>.jsonl: its sha256} of the datasets a JSONL folder holds, or {dataset: the sha256
    of its cached split's Arrow files' hashes}: the resume key's "inputs"."""
    from dustin_runtime.io.files import sha256_file

    src = _locate(source)
    out = {}
    for d in datasets:
        files = ([src.folder / f"{d}.jsonl"] if src.folder is not None
                 else sorted((_cache_root(src) / d).rglob("*.arrow")))
        files = [f for f in files if f.is_file()]
        try:
            hashes = [sha256_file(f) for f in files]
        except OSError as e:
            raise DustinError(f"{source}: cannot read {d} ({e.strerror or e})") from None
        if hashes:
            out[f"{d}.jsonl" if src.folder is not None else d] = hashes[0] if len(hashes) == 1 else hashlib.sha256("".join(hashes).encode()).hexdigest()
    return out


def iter_records(source: str | Path, dataset: str) -> Iterator[dict]:
    """The samples of one LongBench dataset from `source` (SOURCE_HELP), in file order: the JSONL
    folder's `<dataset>.jsonl`, or the cached "test" split of the dataset's configuration."""
    if dataset not in DATASETS:
        raise DustinError(f"unknown LongBench dataset {dataset!r}; known: {', '.join(DATASETS)}")
    src = _locate(source)
    if src.folder is not None:
        path = src.folder / f"{dataset}.jsonl"
        if not path.is_file():
            raise DustinError(f"{path} not found (LongBench v1 JSONL files, one per dataset); this folder holds "
                              f"{', '.join(available_datasets(source)) or 'none'}: name those in --datasets")
        yield from iter_jsonl(path)
        return
    datasets = _datasets()
    where = f"{src.repo_id} in the datasets cache {src.cache_dir or datasets.config.HF_DATASETS_CACHE}"
    if not (_cache_root(src) / dataset).is_dir():
        raise DustinError(f"{dataset} of {where} not found (cached: {', '.join(available_datasets(source)) or 'none'})")
    log = datasets.utils.logging
    verbosity = log.get_verbosity()
    log.set_verbosity_error()  # no "using the cached version" notices
    try:
        split = datasets.load_dataset(src.repo_id, dataset, split="test",
                                      cache_dir=None if src.cache_dir is None else str(src.cache_dir))
    except (ValueError, OSError, ConnectionError) as e:
        raise DustinError(f"{dataset} of {where}: {str(e).splitlines()[0]}") from None
    finally:
        log.set_verbosity(verbosity)
    for row in split:
        yield dict(row)


def load_dataset(source: str | Path, dataset: str, limit: int | None = None) -> list[dict]:
    """Samples of one LongBench v1 dataset from `source` (see `iter_records`), in order; the first
    `limit` (>= 1) only when given. Every sample must carry the LongBench fields."""
    if limit is not None and limit < 1:
        raise DustinError(f"limit must be >= 1, got {limit}")
    samples = []
    for n, sample in enumerate(iter_records(source, dataset), 1):
        missing = [k for k in FIELDS if k not in sample]
        if missing:
            raise DustinError(f"{source}: {dataset} sample {n}: missing field(s) {', '.join(missing)}")
        samples.append(sample)
        if limit is not None and len(samples) >= limit:
            break
    if not samples:  # an empty file would give an empty summary and exit 0
        raise DustinError(f"{source}: {dataset} holds no samples (an empty file?): give its LongBench JSONL, or "
                          "drop it from --datasets")
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
    ids = text_ids(tokenizer, text, add_special_tokens=True)
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
        out = text_ids(tokenizer, text, add_special_tokens=False)
    elif truncated:
        out = text_ids(tokenizer, text, add_special_tokens=True)
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
