"""`dustin eval passkey`: retrieval of a passkey hidden in Gutenberg filler at several contexts and
depths, decoded greedily through each verification policy; accuracy tables and one heatmap PNG
per policy and budget. Records are appended as they finish; a re-run skips what is done, after
checking that the records were made with the same settings (`records.key.json`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dustin_profile.plan import PolicyRun
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import FolderLock, atomic_path, check_resume_key, published_together
from dustin_runtime.io.provenance import provenance
from dustin_runtime.model import Transformer
from dustin_runtime.speculative import SpecHooks

from .generator import RuntimeGenerator, result_text
from .jsonl import append_jsonl, repair_jsonl
from .passkey import passkey_accuracy, passkey_grid, plot_passkey_heatmap, score_passkey
from .results import markdown_table, write_csv, write_markdown, write_result_json


def run_passkey(
    target: Transformer,
    draft: Transformer | None,
    tokenizer,
    *,
    filler_text: str,
    contexts: Sequence[int],
    depths: Sequence[float],
    trials: int,
    gamma: int,
    runs: Sequence[PolicyRun],
    make_hooks: Callable[[PolicyRun], SpecHooks | None],
    out_dir: str | Path,
    models: dict,
    max_new_tokens: int = 10,
    seed: int = 0,
    resume_key: Mapping | None = None,
    restart: bool = False,
    on_record: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Every prompt of the grid under every run; returns accuracy rows. `resume_key` and `restart`
    as in `pg19_eval.run_pg19`."""
    if min(trials, gamma, max_new_tokens) < 1 or not contexts or not depths:
        raise DustinError(f"trials ({trials}), gamma ({gamma}) and max new tokens ({max_new_tokens}) must be >= 1, "
                          "with at least one context and one depth")
    out_dir = Path(out_dir)
    with FolderLock(out_dir):
        path = out_dir / "records.jsonl"
        key = {"gamma": gamma, "max_new_tokens": max_new_tokens, "seed": seed,
               "filler_sha256": hashlib.sha256(filler_text.encode()).hexdigest(), **dict(resume_key or {})}
        check_resume_key(out_dir / "records.key.json", key, (path,), restart=restart, where=str(path))
        return _run(target, draft, tokenizer, path, out_dir, filler_text, contexts, depths, trials, gamma, runs,
                    make_hooks, models, max_new_tokens, seed, on_record)


def _run(target, draft, tokenizer, path, out_dir, filler_text, contexts, depths, trials, gamma, runs, make_hooks,
         models, max_new_tokens, seed, on_record) -> list[dict]:
    done = {(r["policy"], r["budget"], r["context_tokens"], r["depth"], r["seed"]) for r in repair_jsonl(path)}
    prompts = list(passkey_grid(tokenizer, filler_text, contexts, depths, trials, seed))
    for run in runs:
        gen = RuntimeGenerator(target, draft, gamma=gamma, hooks_factory=lambda run=run: make_hooks(run))
        for p in prompts:
            if (run.policy, run.budget, p.context_tokens, p.depth, p.seed) in done:
                continue
            res = gen.generate([p.ids], [max_new_tokens], [tokenizer.eos_token_id])[0]
            pred = result_text(res, tokenizer)
            rec = {"policy": run.policy, "budget": run.budget, "context_tokens": p.context_tokens,
                   "depth": p.depth, "seed": p.seed, "answer": p.answer, "pred": pred,
                   "score": score_passkey(pred, p.answer), **res.stats}
            append_jsonl(path, rec)
            if on_record is not None:
                on_record(rec)
    rows = passkey_accuracy(repair_jsonl(path))
    prov = provenance(models=models, shapes={"contexts": list(contexts), "depths": list(depths), "trials": trials,
                                             "gamma": gamma})
    with published_together():  # the JSON, CSV, Markdown and heat maps: all new, or all as they were
        write_result_json(out_dir / "passkey.json", rows, prov)
        write_csv(out_dir / "passkey.csv", rows)
        overall = {}
        for r in rows:
            overall.setdefault((r["policy"], r["budget"]), []).append(r["accuracy"])
        summary = [{"policy": p, "budget": b, "accuracy": round(sum(v) / len(v), 4)} for (p, b), v in overall.items()]
        write_markdown(out_dir / "passkey.md", "Passkey retrieval accuracy",
                       [("Overall", markdown_table(summary)), ("Per context and depth", markdown_table(rows))], prov)
        for (policy, budget) in overall:
            sub = [r for r in rows if r["policy"] == policy and r["budget"] == budget]
            name = policy if budget is None else f"{policy}-{budget}"
            with atomic_path(out_dir / f"passkey-{name}.png") as tmp:
                plot_passkey_heatmap(sub, tmp, title=f"passkey: {name}")
    return rows


DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
NEW_TOKENS = 10


def evaluate(target, draft, plans: dict, make_hooks, resume_key: dict, *, contexts: Sequence[int], out_dir: Path,
             restart: bool = False, on_record=None) -> list[dict]:
    """`dustin eval passkey` on the loaded pair: every planned run over `contexts` x `DEPTHS`, one
    prompt each, filler from the Gutenberg eval split, gamma 4; the accuracy rows."""
    from dustin_eval.corpus import gutenberg_split, read_filler

    limit = min(target.model.cfg.max_position_embeddings, draft.model.cfg.max_position_embeddings)
    if max(contexts) + NEW_TOKENS > limit:
        raise DustinError(f"context {max(contexts)} + {NEW_TOKENS} new tokens exceeds the models' limit of {limit} "
                          f"tokens; use --contexts up to {limit - NEW_TOKENS}")
    return run_passkey(target.model, draft.model, target.tokenizer, filler_text=read_filler(gutenberg_split("eval"), 3),
                       contexts=contexts, depths=DEPTHS, trials=1, gamma=4, runs=list(plans), make_hooks=make_hooks,
                       out_dir=out_dir, max_new_tokens=NEW_TOKENS,
                       models={"target": target.model_id, "draft": draft.model_id}, resume_key=resume_key,
                       restart=restart, on_record=on_record)
