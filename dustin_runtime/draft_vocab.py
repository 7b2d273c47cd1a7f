"""The draft's vocabulary-subset head (FR-Spec, Zhao et al. 2025): the draft computes logits only for
the K most frequent tokens of a token-counts artifact (`dustin profile vocab`), the rest get
probability zero, so its LM head reads K rows instead of V (Qwen2.5's 152k-row head is 27% of the
0.5B draft's bytes). Verification is unchanged and exact: speculative sampling corrects any draft
distribution; greedy drafts simply never propose a token outside the subset.

`--draft-vocab PATH:K` (a token-counts JSON and K) or, for random-weight benchmarks, `--draft-vocab K`
(ids 0..K-1: which ids does not change a timing)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dustin_runtime.errors import DustinError


def parse_spec(spec: str) -> tuple[Path | None, int]:
    """'PATH:K' -> (PATH, K); 'K' -> (None, K)."""
    path, _, k = spec.rpartition(":")
    try:
        n = int(k)
    except ValueError:
        raise DustinError(f"--draft-vocab {spec!r}: expected PATH:K (a token-counts JSON and a count) or K") from None
    if n < 1:
        raise DustinError(f"--draft-vocab {spec!r}: K must be >= 1")
    return (Path(path) if path else None), n


def read_counts(path: Path, rows: int | None = None) -> tuple[dict, torch.Tensor]:
    """(meta, counts [V] int64) of a token-counts artifact; one clear error for a bad file. `rows`
    (the draft's vocabulary rows) bounds V before anything of that size is allocated."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DustinError(f"{path}: no such token-counts file (make one with `dustin profile vocab`)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DustinError(f"{path}: not a token-counts JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") != "token-counts":
        raise DustinError(f"{path}: not a token-counts artifact (kind {meta.get('kind') if isinstance(meta, dict) else None!r})")
    if meta.get("schema_version") != 1:
        raise DustinError(f"{path}: token-counts schema_version {meta.get('schema_version')!r}; this dustin reads 1 "
                          "(count again with `dustin profile vocab --draft D`)")
    V = meta.get("vocab_size")
    if isinstance(V, bool) or not isinstance(V, int) or V < 1:
        raise DustinError(f"{path}: field vocab_size must be a positive integer, got {json.dumps(V)[:40]}")
    if rows is not None and V > rows:
        raise DustinError(f"{path}: vocab_size {V} is more than the draft's {rows} rows (counted for another model?)")
    if not isinstance(meta.get("table"), str) or not meta["table"]:
        raise DustinError(f"{path}: field table must name the counts table beside it, got {json.dumps(meta.get('table'))[:40]}")
    table = Path(path).parent / meta["table"]
    try:
        t = pq.read_table(table, columns=["token_id", "count"])
    except Exception as e:  # pyarrow raises several types for a missing or bad file
        raise DustinError(f"{table}: cannot read the token counts table ({str(e).splitlines()[0]})") from None
    cols = [t.column(c) for c in ("token_id", "count")]
    if not all(pa.types.is_integer(c.type) and c.null_count == 0 for c in cols):
        raise DustinError(f"{table}: token_id and count must be integer columns without nulls, got "
                          f"{', '.join(str(c.type) for c in cols)}")
    ids, n = (torch.from_numpy(c.to_numpy().astype("int64")) for c in cols)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= V:
        raise DustinError(f"{table}: token ids outside [0, {V})")
    if int(n.min()) < 0:
        raise DustinError(f"{table}: negative token counts")
    counts = torch.zeros(V, dtype=torch.long)
    counts[ids] = n
    return meta, counts


def top_ids(counts: torch.Tensor, k: int, keep: tuple[int, ...] = ()) -> torch.Tensor:
    """The k most frequent ids (ties: lower id first) plus `keep` (e.g. end-of-sequence ids), sorted."""
    k = min(k, counts.numel())
    order = torch.argsort(-counts, stable=True)[:k]
    extra = torch.tensor([i for i in keep if 0 <= i < counts.numel()], dtype=torch.long)
    return torch.unique(torch.cat([order, extra]))


def subset_for(spec: str, vocab_size: int, tokenizer=None, keep: tuple[int, ...] = ()) -> torch.Tensor:
    """The token ids a `--draft-vocab` spec keeps for a draft of `vocab_size` rows. With a PATH the
    artifact's tokenizer must be the draft's (its hash)."""
    path, k = parse_spec(spec)
    if path is None:
        return torch.arange(min(k, vocab_size))
    meta, counts = read_counts(path, vocab_size)
    if tokenizer is not None:
        from dustin_runtime.tokenizer import vocab_hash

        if meta.get("tokenizer_hash") != vocab_hash(tokenizer):
            raise DustinError(f"{path}: counted with another tokenizer (hash {meta.get('tokenizer_hash')}) than "
                              f"the draft's ({vocab_hash(tokenizer)}): count again with `dustin profile vocab --draft D`")
    return top_ids(counts, k, keep)
