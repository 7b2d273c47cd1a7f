"""LongBench (v1) runner: prompts -> a generator (`generator.RuntimeGenerator`) -> per-sample predictions and scores -> summary.

Layout under `out_dir`:
    predictions/<policy>-<budget>/<dataset>.jsonl   one record per finished sample, appended as it
                                                    finishes; a re-run skips the recorded `_id`s
    predictions/<policy>-<budget>/key.json          the settings the records were made with: a re-run
                                                    with others is refused (or `restart` discards them)
    predictions/<policy>-<budget>/run.json          metadata and provenance of each invocation
    summary.csv, summary.md, summary.json           every dataset x policy x budget found there
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import (
    FolderLock,
    atomic_write,
    check_resume_key,
    published_together,
    read_json,
)
from dustin_runtime.io.provenance import provenance

from .generator import RuntimeGenerator, result_text
from .jsonl import append_jsonl, read_jsonl, repair_jsonl
from .longbench_config import DATASETS, max_new_tokens
from .longbench_data import build_prompt, input_hashes, load_dataset, stop_ids
from .longbench_metrics import dataset_score, score_sample
from .results import markdown_table, write_csv, write_markdown, write_result_json


@dataclass(frozen=True)
class RunMeta:
    """What a run is, recorded with every sample: policy, KV budget (None = full), model ids."""

    policy: str
    budget: int | None
    target: str
    draft: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def run_name(self) -> str:
        name = f"{self.policy}-{'full' if self.budget is None else self.budget}"
        return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _keys(samples: Sequence[dict]) -> list[str]:
    # `_id` is the resume key; a repeated one gets "#k" so that no sample is lost.
    seen: dict[str, int] = {}
    keys = []
    for s in samples:
        k = str(s["_id"])
        seen[k] = seen.get(k, 0) + 1
        keys.append(k if seen[k] == 1 else f"{k}#{seen[k] - 1}")
    return keys


def _write_run_json(run_dir: Path, meta: RunMeta, settings: dict) -> None:
    path = run_dir / "run.json"
    old = read_json(path, "run history")
    history = old.get("invocations", []) if isinstance(old, dict) else []
    prov = provenance(models={"target": meta.target, "draft": meta.draft}, shapes=settings)
    doc = {
        "schema_version": 1,
        "policy": meta.policy,
        "budget": meta.budget,
        "target": meta.target,
        "draft": meta.draft,
        "extra": dict(meta.extra),
        "invocations": (history if isinstance(history, list) else []) + [prov],
    }
    atomic_write(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def run_longbench(
    generator: RuntimeGenerator,
    tokenizer,
    meta: RunMeta,
    *,
    data_dir: str | Path,
    out_dir: str | Path,
    max_length: int,
    datasets: Sequence[str] | None = None,
    eos_ids: Sequence[int] | None = None,
    batch_size: int = 1,
    limit: int | None = None,
    chat_template_kwargs: dict | None = None,
    resume_key: Mapping[str, Any] | None = None,
    restart: bool = False,
    on_record: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run LongBench datasets through `generator`; return the summary rows of this run.

    max_length: the model's context length; each prompt is middle-truncated to
        `max_length - max_new_tokens[dataset]` tokens (before the chat template).
    eos_ids: stop ids (default: the tokenizer's eos); samsum adds the newline token.
    limit: only the first `limit` samples of each dataset.
    resume_key: what else changes the predictions besides `meta` and the arguments (the models'
        hashes, dtype, device, gamma, the policy's settings; `meta.extra` is provenance only); a
        re-run into the same run folder resumes only when all of it matches, and `restart`
        discards the run's predictions.
    Finished samples are appended to the predictions file at once; re-running with the same
    arguments continues where a crash stopped. Writes summary.csv/md/json over all runs in out_dir.
    """
    datasets = list(datasets) if datasets else list(DATASETS)
    if batch_size < 1:
        raise DustinError(f"batch size must be >= 1, got {batch_size}")
    if limit is not None and limit < 1:
        raise DustinError(f"limit must be >= 1 sample per dataset, got {limit}")
    if max_length < 1:
        raise DustinError(f"max length must be >= 1, got {max_length}")
    if eos_ids is None:
        if tokenizer.eos_token_id is None:
            raise DustinError("the tokenizer has no eos token; pass eos_ids")
        eos_ids = [tokenizer.eos_token_id]
    loaded = {}  # every dataset read and checked before any output is touched: bad data is refused as such
    for dataset in datasets:
        loaded[dataset] = load_dataset(data_dir, dataset, limit)
        max_gen = max_new_tokens()[dataset]
        if max_length - max_gen < 2:
            raise DustinError(f"max length {max_length} leaves no room for {dataset}'s prompt beside its {max_gen} "
                              f"new tokens: it needs models of more than {max_gen + 1} positions (or drop it from "
                              "--datasets)")
    with FolderLock(out_dir):
        run_dir = Path(out_dir) / "predictions" / meta.run_name
        settings = {
            "max_length": max_length,
            "batch_size": batch_size,
            "limit": limit,
            "datasets": datasets,
            "eos_ids": list(eos_ids),
        }
        key = {"policy": meta.policy, "budget": meta.budget, "target": meta.target, "draft": meta.draft,
               "max_length": max_length, "batch_size": batch_size,
               "eos_ids": list(eos_ids), "chat_template_kwargs": chat_template_kwargs,
               "inputs": input_hashes(data_dir, datasets), **dict(resume_key or {})}
        if restart:
            (run_dir / "run.json").unlink(missing_ok=True)
        check_resume_key(run_dir / "key.json", key, tuple(sorted(run_dir.glob("*.jsonl"))), restart=restart,
                         where=str(run_dir))
        _write_run_json(run_dir, meta, settings)
        return _run(generator, tokenizer, meta, run_dir, loaded, out_dir, max_length, eos_ids, batch_size,
                    chat_template_kwargs, settings, on_record)


def _run(generator, tokenizer, meta, run_dir, loaded, out_dir, max_length, eos_ids, batch_size,
         chat_template_kwargs, settings, on_record) -> list[dict]:
    want = {
        "policy": meta.policy,
        "budget": meta.budget,
        "target": meta.target,
        "draft": meta.draft,
        "max_length": max_length,
    }

    for dataset, samples in loaded.items():
        max_gen = max_new_tokens()[dataset]
        path = run_dir / f"{dataset}.jsonl"
        done = repair_jsonl(path)
        done_keys = {r["_id"] for r in done}
        pending = [
            (k, s) for k, s in zip(_keys(samples), samples, strict=True) if k not in done_keys
        ]
        stops, min_new = stop_ids(tokenizer, dataset, eos_ids)
        for start in range(0, len(pending), batch_size):
            batch = pending[start : start + batch_size]
            prompts = [
                build_prompt(tokenizer, s, dataset, max_length - max_gen, chat_template_kwargs)
                for _, s in batch
            ]
            results = generator.generate(
                [p.ids for p in prompts], [max_gen] * len(batch), stops, min_new
            )
            if len(results) != len(batch):
                raise DustinError(
                    f"generator returned {len(results)} results for {len(batch)} prompts"
                )
            for (key, sample), prompt, result in zip(batch, prompts, results, strict=True):
                pred = result_text(result, tokenizer)
                record = {
                    "_id": key,
                    "dataset": dataset,
                    **want,
                    "pred": pred,
                    "score": score_sample(dataset, pred, sample["answers"], sample["all_classes"]),
                    "answers": sample["answers"],
                    "all_classes": sample["all_classes"],
                    "length": sample["length"],
                    "prompt_tokens": len(prompt.ids),
                    "raw_tokens": prompt.raw_tokens,
                    "truncated": prompt.truncated,
                    "new_tokens": len(result.tokens),
                    "stats": dict(result.stats),
                }
                append_jsonl(path, record)
                if on_record is not None:
                    on_record(record)

    rows = summarize_predictions(out_dir)
    with published_together():  # the CSV, JSON and Markdown: all new, or all as they were
        write_summary(out_dir, rows, models={"target": meta.target, "draft": meta.draft}, shapes=settings)
    return [
        r
        for r in rows
        if r["policy"] == meta.policy
        and r["budget"] == meta.budget
        and r["target"] == meta.target
        and r["draft"] == meta.draft
    ]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarize_predictions(out_dir: str | Path) -> list[dict]:
    """One row per dataset x policy x budget x models: n, score (mean x 100), mean of each stat."""
    groups: dict[tuple, list[dict]] = {}
    for path in sorted((Path(out_dir) / "predictions").glob("*/*.jsonl")):
        for r in read_jsonl(path):
            key = (r["dataset"], r["policy"], r["budget"], r["target"], r["draft"])
            groups.setdefault(key, []).append(r)
    order = {d: i for i, d in enumerate(DATASETS)}
    rows = []
    for (dataset, policy, budget, target, draft), records in groups.items():
        row: dict[str, Any] = {
            "dataset": dataset,
            "policy": policy,
            "budget": budget,
            "target": target,
            "draft": draft,
            "n": len(records),
            "score": dataset_score([r["score"] for r in records]),
        }
        stat_keys = sorted(
            {k for r in records for k, v in r.get("stats", {}).items() if _is_number(v)}
        )
        for k in stat_keys:
            values = [r["stats"][k] for r in records if _is_number(r.get("stats", {}).get(k))]
            row[f"mean_{k}"] = sum(values) / len(values)
        rows.append(row)
    rows.sort(
        key=lambda r: (
            r["policy"],
            -1 if r["budget"] is None else r["budget"],
            str(r["target"]),
            str(r["draft"]),
            order.get(r["dataset"], len(order)),
        )
    )
    return rows


def _label(row: Mapping[str, Any]) -> str:
    budget = "full" if row["budget"] is None else row["budget"]
    return f"{row['policy']}@{budget}"


def pivot_scores(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Rows per dataset, a column per policy@budget, and the average over common datasets."""
    labels = list(dict.fromkeys(_label(r) for r in rows))
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in rows)]
    datasets += sorted({r["dataset"] for r in rows} - set(datasets))
    table = {(r["dataset"], _label(r)): r["score"] for r in rows}
    out = [{"dataset": d, **{lab: table.get((d, lab)) for lab in labels}} for d in datasets]
    common = [d for d in datasets if all((d, lab) in table for lab in labels)]
    if common:
        avg = {lab: round(sum(table[(d, lab)] for d in common) / len(common), 2) for lab in labels}
        out.append({"dataset": f"average ({len(common)} datasets)", **avg})
    return out


def write_summary(
    out_dir: str | Path,
    rows: Sequence[Mapping[str, Any]],
    models: Mapping[str, Any] | None = None,
    shapes: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """summary.csv (long form), summary.md (pivot + long form), summary.json (with provenance)."""
    out_dir = Path(out_dir)
    prov = provenance(models=models, shapes=shapes)
    paths = {
        "csv": write_csv(out_dir / "summary.csv", rows),
        "json": write_result_json(out_dir / "summary.json", rows, prov, benchmark="longbench-v1"),
    }
    long_cols = ["dataset", "policy", "budget", "n", "score"]
    long_cols += [c for c in dict.fromkeys(k for r in rows for k in r) if c.startswith("mean_")]
    paths["md"] = write_markdown(
        out_dir / "summary.md",
        "LongBench (v1) scores",
        [
            (
                "Score (mean x 100) per dataset and policy@budget",
                markdown_table(pivot_scores(rows)),
            ),
            ("Per run", markdown_table(rows, long_cols)),
        ],
        prov,
    )
    return paths


SHARED_LONGBENCH = Path(__file__).resolve().parents[2] / "shared" / "longbench"


def sources(data: str | None, datasets: str | None) -> tuple[str, list[str]]:
    """The LongBench source (--data, else ../shared/longbench where it exists) and the datasets to
    run (--datasets, comma-separated, else those present), refused with one line naming the fix."""
    from .longbench_config import DATASETS
    from .longbench_data import available_datasets

    if data is None:
        if not SHARED_LONGBENCH.is_dir():
            raise DustinError("eval longbench needs --data: a folder of LongBench v1 <dataset>.jsonl files (e.g. "
                              "multi_news.jsonl; ../shared/longbench holds one), or THUDM/LongBench in a Hugging "
                              "Face datasets cache")
        data = str(SHARED_LONGBENCH)
    present = available_datasets(data)  # refuses a source that is neither a folder nor a dataset id
    names = [d.strip() for d in datasets.split(",") if d.strip()] if datasets else present
    unknown = [d for d in names if d not in DATASETS]
    if unknown or (datasets and not names):
        raise DustinError(f"unknown LongBench dataset(s) {', '.join(unknown) or repr(datasets)}; "
                          f"known: {', '.join(DATASETS)}")
    if not names:
        raise DustinError(f"{data}: none of the 16 English LongBench datasets is there (expected <dataset>.jsonl "
                          "files, e.g. multi_news.jsonl, as in ../shared/longbench)")
    return data, names


def evaluate(target, draft, plans: dict, make_hooks, resume_key: dict, *, data: str, datasets: Sequence[str],
             out_dir: Path, limit: int | None = None, restart: bool = False, on_record=None) -> list[dict]:
    """`dustin eval longbench` on the loaded pair: every planned run (gamma 4, prompts truncated to
    the models' context), each sample's prediction and score recorded; the summary rows."""
    from dustin_runtime.tokenizer import eos_ids

    max_length = min(target.model.cfg.max_position_embeddings, draft.model.cfg.max_position_embeddings)
    common = {k: v for k, v in resume_key.items() if k != "runs"}
    profile = next(iter(plans.values())).profile
    for run in plans:
        gen = RuntimeGenerator(target.model, draft.model, gamma=4, hooks_factory=lambda run=run: make_hooks(run))
        meta = RunMeta(policy=run.policy, budget=run.budget, target=target.model_id, draft=draft.model_id,
                       extra={"gamma": 4, "profile": profile.path if profile else None})
        run_longbench(gen, target.tokenizer, meta, data_dir=data, out_dir=out_dir, max_length=max_length,
                      datasets=datasets, eos_ids=list(eos_ids(target.tokenizer, target.model.cfg.eos_token_ids)),
                      limit=limit, resume_key={**common, "gamma": 4, "run": resume_key["runs"][run.label]},
                      restart=restart, on_record=on_record)
    return summarize_predictions(out_dir)
