"""`dustin eval pg19`: PG-19-style perplexity of long book windows when each teacher-forced
verification window of gamma + 1 tokens attends through a policy's set, full-cache perplexity
beside it.

A sample is a window of `context + eval_tokens` tokens from one book: the first `context` are the
prompt (prefilled with the full cache), the last `eval_tokens` are scored in verification windows
through each policy. All policies of one window share its prefill. Records are appended as they
finish (one JSONL line per window x policy x budget); a re-run skips what is done, after checking
that the records were made with the same settings (`records-<context>.key.json`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from dustin_profile.plan import PolicyRun
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import FolderLock, check_resume_key, input_hashes, published_together
from dustin_runtime.io.provenance import provenance
from dustin_runtime.model import Transformer
from dustin_runtime.sparse.measures import PER_SEQUENCE
from dustin_runtime.sparse.teacher_forced import teacher_forced_nll
from dustin_runtime.speculative import SpecHooks

from .corpus import book_paths
from .intervals import bootstrap, mean, ppl_ratio
from .jsonl import append_jsonl, repair_jsonl
from .pg19 import iter_windows
from .results import (
    markdown_table,
    plot_score_vs_budget,
    write_csv,
    write_markdown,
    write_result_json,
)


def run_pg19(
    target: Transformer,
    draft: Transformer | None,
    tokenizer,
    *,
    books_dir: str | Path,
    context: int,
    eval_tokens: int,
    gamma: int,
    runs: Sequence[PolicyRun],
    make_hooks: Callable[[PolicyRun], SpecHooks | None],
    windows: int,
    out_dir: str | Path,
    models: dict,
    seed: int = 0,
    resume_key: Mapping | None = None,
    restart: bool = False,
    on_record: Callable[[dict], None] | None = None,
    batch: int = 1,
) -> list[dict]:
    """Score `windows` windows (one per book) under every run, `batch` windows at a time (one
    sequence each of the batch: each has its own set); returns the summary rows.

    `resume_key`: what else changes the records (the models, dtype, device and, under "runs", each
    run's settings: `plan.run_identity`, `plan.runs_key`); the records of `out_dir` are resumed only
    when it matches, `restart` discards them."""
    if min(context, eval_tokens, gamma, windows) < 1:
        raise DustinError(f"context ({context}), eval tokens ({eval_tokens}), gamma ({gamma}) and windows "
                          f"({windows}) must be >= 1")
    if context + eval_tokens > target.cfg.max_position_embeddings:
        raise DustinError(
            f"context {context} + eval tokens {eval_tokens} exceed the model's {target.cfg.max_position_embeddings}"
            f" positions: use --context <= {target.cfg.max_position_embeddings - eval_tokens} or fewer --eval-tokens"
        )
    out_dir = Path(out_dir)
    with FolderLock(out_dir):
        path = out_dir / f"records-{context}.jsonl"
        books = book_paths(books_dir)
        key = {"context": context, "eval_tokens": eval_tokens, "gamma": gamma, "seed": seed,
               "books": [p.name for p in books], "inputs": input_hashes(books), **dict(resume_key or {})}
        check_resume_key(out_dir / f"records-{context}.key.json", key, (path,), restart=restart, where=str(path))
        _score(target, draft, tokenizer, path, books_dir, context, eval_tokens, gamma, runs, make_hooks, windows,
               seed, on_record, batch)
        with published_together():  # the JSON, CSV, Markdown and plot: all new, or all as they were
            return summarize(path, out_dir, context, eval_tokens, gamma, models)


def _score(target, draft, tokenizer, path, books_dir, context, eval_tokens, gamma, runs, make_hooks, windows,
           seed, on_record, batch) -> None:
    done = {(r["book"], r["window"], r["policy"], r["budget"]) for r in repair_jsonl(path)}
    pending: list[tuple] = []  # windows with the same runs to do, scored as one batch
    for win in iter_windows(tokenizer, books_dir, context + eval_tokens, seed=seed, max_windows=windows,
                            max_windows_per_book=1):
        todo = [r for r in runs if (win.book, win.index, r.policy, r.budget) not in done]
        if not todo:
            continue
        if pending and (todo != pending[0][1] or len(pending) == batch):
            _score_batch(target, draft, pending, context, eval_tokens, gamma, make_hooks, path, on_record)
            pending = []
        pending.append((win, todo))
    if pending:
        _score_batch(target, draft, pending, context, eval_tokens, gamma, make_hooks, path, on_record)


def _window_stats(extra: dict, b: int) -> dict:
    """The statistics of window `b` of a batch: its entry of each per-sequence list, and its own value
    in place of a batch mean that has one (`arr`): a record must not depend on the windows scored
    beside it, or a resumed run (fewer windows left to batch) would record other values."""
    return {k: v[b] if k.endswith(PER_SEQUENCE) else extra[k + PER_SEQUENCE][b] if k + PER_SEQUENCE in extra else v
            for k, v in extra.items()}


def _score_batch(target, draft, pending, context, eval_tokens, gamma, make_hooks, path, on_record) -> None:
    """One batch of windows (same runs to do) through every run; one record per window and run."""
    wins, todo = [w for w, _ in pending], pending[0][1]
    results = teacher_forced_nll(target, draft, [w.ids for w in wins], context, gamma=gamma,
                                 hooks=[make_hooks(r) for r in todo])
    for r, res in zip(todo, results, strict=True):
        for b, win in enumerate(wins):
            stats = _window_stats(res.extra, b)
            rec = {"book": win.book, "window": win.index, "start": win.start, "context": context,
                   "eval_tokens": eval_tokens, "gamma": gamma, "policy": r.policy, "budget": r.budget,
                   "nll": res.nll[b], "tokens": res.tokens[b], "ppl": math.exp(res.nll[b] / res.tokens[b]),
                   "policy_stats": stats, "nll_by_offset": res.nll_by_offset[b]}
            if isinstance(res.extra.get("arr_per_sequence"), list):
                rec["arr"] = res.extra["arr_per_sequence"][b]
            elif isinstance(res.extra.get("arr"), (int, float)):
                rec["arr"] = res.extra["arr"]
            append_jsonl(path, rec)
            if on_record is not None:
                on_record(rec)


def _by_offset(recs: list[dict], ref: list[dict]) -> dict:
    """Perplexity ratios per window offset (records that carry `nll_by_offset`, paired with full's)."""
    both = [(r, f) for r, f in zip(recs, ref, strict=True) if r.get("nll_by_offset") and f.get("nll_by_offset")]
    if not both:
        return {}
    pairs = [(r["nll_by_offset"], f["nll_by_offset"]) for r, f in both]
    w = len(pairs[0][0])
    per = [r["tokens"] // w for r, _ in both]  # scored tokens per offset of each window
    by = [round(ppl_ratio(np.array([a[i] for a, _ in pairs]), np.array(per), np.array([b[i] for _, b in pairs]),
                          np.array(per)), 5) for i in range(w)]
    last, lo, hi = bootstrap(ppl_ratio, [a[-1] for a, _ in pairs], per, [b[-1] for _, b in pairs], per)
    return {"ppl_ratio_by_offset": by, "ppl_ratio_last": round(last, 5), "ppl_ratio_last_lo": round(lo, 5),
            "ppl_ratio_last_hi": round(hi, 5)}


def summarize(path: Path, out_dir: Path, context: int, eval_tokens: int, gamma: int, models: dict) -> list[dict]:
    """Per policy and budget: perplexity over all scored tokens, its ratio to full's on the same
    windows and ARR, with 95% bootstrap intervals over the windows (`dustin_eval.intervals`).

    Also the ratio at each offset of the gamma + 1 window queries (`ppl_ratio_by_offset`) and, with
    an interval, at the last (`ppl_ratio_last`): a set chosen from the whole window's queries (the
    oracle's) has seen the true tokens the earlier offsets predict, never the last offset's."""
    recs = repair_jsonl(path)
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault((r["policy"], r["budget"]), []).append(r)
    full_books = {(r["book"], r["window"]) for r in groups.get(("full", None), [])}
    rows = []
    for (policy, budget), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "full", kv[0][0], kv[0][1] or 0)):
        common = [r for r in rs if (r["book"], r["window"]) in full_books]
        ppl = math.exp(sum(r["nll"] for r in rs) / sum(r["tokens"] for r in rs))
        row = {"context": context, "policy": policy, "budget": budget, "windows": len(rs),
               "tokens": sum(r["tokens"] for r in rs), "ppl": round(ppl, 4)}
        if common and full_books:
            full = {(r["book"], r["window"]): r for r in groups[("full", None)]}
            ref = [full[(r["book"], r["window"])] for r in common]
            row["ppl_full"] = round(math.exp(sum(f["nll"] for f in ref) / sum(f["tokens"] for f in ref)), 4)
            ratio, lo, hi = bootstrap(ppl_ratio, [r["nll"] for r in common], [r["tokens"] for r in common],
                                      [f["nll"] for f in ref], [f["tokens"] for f in ref])
            row["ppl_ratio"], row["ppl_ratio_lo"], row["ppl_ratio_hi"] = round(ratio, 5), round(lo, 5), round(hi, 5)
            row.update(_by_offset(common, ref))
        arr = [r["arr"] for r in rs if "arr" in r]
        if arr:
            value, lo, hi = bootstrap(mean, arr)
            row["arr"], row["arr_lo"], row["arr_hi"] = round(value, 4), round(lo, 4), round(hi, 4)
        rows.append(row)
    prov = provenance(models=models, shapes={"context": context, "eval_tokens": eval_tokens, "gamma": gamma})
    write_result_json(out_dir / f"pg19-{context}.json", rows, prov)
    write_csv(out_dir / f"pg19-{context}.csv", rows)
    write_markdown(out_dir / f"pg19-{context}.md",
                   f"PG-19-style perplexity: context {context}, {eval_tokens} scored tokens per window, gamma {gamma}",
                   [(None, markdown_table(rows))], prov)
    if any(r["budget"] is not None for r in rows):
        plot_score_vs_budget(rows, out_dir / f"pg19-{context}.png", value="ppl_ratio",
                             title=f"perplexity / full attention's vs budget, context {context} (95% intervals "
                                   f"over {max(r['windows'] for r in rows)} windows)",
                             ylabel="perplexity ratio to full attention")
    return rows


def evaluate(target, draft, plans: dict, make_hooks, resume_key: dict, *, books, context: int, eval_tokens: int,
             windows: int, out_dir: Path, restart: bool = False, on_record=None) -> list[dict]:
    """`dustin eval pg19` on the loaded pair (`pipeline.LoadedModel`s): every planned run, gamma 4,
    up to 16 windows scored together; the summary rows."""
    return run_pg19(target.model, draft.model, target.tokenizer, books_dir=books, context=context,
                    eval_tokens=eval_tokens, gamma=4, runs=list(plans), make_hooks=make_hooks, windows=windows,
                    out_dir=out_dir, models={"target": target.model_id, "draft": draft.model_id},
                    resume_key=resume_key, restart=restart, on_record=on_record, batch=16)
