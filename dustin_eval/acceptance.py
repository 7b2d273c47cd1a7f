"""`dustin eval acceptance`: how much of speculative decoding's acceptance each verification policy
keeps at each budget, on the same long prompts.

Per context length, `windows` windows of Gutenberg text (`windows_per_book` consecutive windows per
book, default one, books in seeded order) decode
`max_new_tokens` greedy tokens together as one batch under every policy: `full` once, the others
at every budget S. All runs of one context share one prefill (everything but the last gamma + 1
prompt tokens, which each policy prefills itself for its first target-history signal), so the
policies start from the same cache. EOS does not stop a sequence: every run emits the same number
of tokens. Each finished run is appended to `<name>.runs.jsonl` (a re-run skips it when
`<name>.key.json` shows the same settings, and is refused otherwise), and the table is rewritten as
`<name>.json` / `<name>.md`.

Reported per (context, policy, budget): tau = mean tokens per verification step (accepted drafts +
the target's own token, per live sequence and step), its retention tau / tau(full), the paired
retention (on the policy's own steps, against what full verification accepts on the same context
and drafts: free-running tau also moves with each policy's trajectory, the paired one does not),
ARR (the mean share of the true verification attention the set captured), and `prefix`: the mean
share of each sequence's tokens, from the start, identical to full verification's. With `vanilla`
(policy `ar` on the command line) vanilla greedy decoding (`generate`, one token a forward, from the
same shared prefill) runs too, and every record adds `prefix_vanilla`, the same share against its
output: 1 for exact mode and full verification is the target's own output, token for token. Runs with sparse
drafting (`draft_kv="verify-set"`) also report the paired drafting retention: on the same steps,
the tokens per step full verification gives the set's drafts over those it gives the drafts of the
draft's whole cache (each step drafted both ways, `SpecHooks.shadow_backend`).

Refresh layers (`SparseConfig.refresh_layers`, `--refresh-layers`) apply to the dustin runs only
(the other policies run on the same config without them); dustin's records carry them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dustin_runtime.attention import default_backend
from dustin_runtime.errors import DustinError
from dustin_runtime.generate import cache_capacity, prefill
from dustin_runtime.io.files import FolderLock, check_resume_key, input_hashes, published_together
from dustin_runtime.lookup import LookupConfig
from dustin_runtime.pipeline import LoadedModel
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import POLICY_CLASSES, make_policy, policy_class
from dustin_runtime.speculative import speculative_generate

from .corpus import book_paths, gutenberg_split
from .jsonl import append_jsonl, repair_jsonl
from .pg19 import iter_windows
from .results import markdown_table, write_markdown, write_result_json


@dataclass(frozen=True)
class AcceptanceConfig:
    """What to run: contexts (prompt tokens, capped so prompt + new tokens fit the models), windows
    per context, new tokens, gamma, budgets and policies."""

    contexts: tuple[int, ...] = (4096, 8192)
    windows: int = 2
    windows_per_book: int = 1  # several: consecutive windows of a book; intervals resample books
    max_new_tokens: int = 64
    gamma: int = 4
    budgets: tuple[int, ...] = (128, 256, 512, 1024)
    policies: tuple[str, ...] = tuple(POLICY_CLASSES)
    books_dir: str = str(gutenberg_split("eval"))
    seed: int = 0
    measure_arr: bool = True
    paired: bool = True
    lookup: LookupConfig | None = None  # drafts copied from each sequence's history where it repeats (every policy)
    vanilla: bool = False  # also vanilla greedy decoding (the `ar` record), every record's prefix_vanilla against it

    def __post_init__(self):
        for p in self.policies:
            policy_class(p)  # refuses an unknown name
        if not self.contexts or not self.budgets or self.windows < 1 or self.max_new_tokens < 1 \
                or self.windows_per_book < 1:
            raise DustinError("give at least one context, one budget, one window (and one a book) and one new token")
        if min(self.contexts) < 1 or min(self.budgets) < 1 or self.gamma < 1:
            raise DustinError(f"contexts {list(self.contexts)}, budgets {list(self.budgets)} and gamma {self.gamma} "
                              "must be >= 1")


def _prompt_len(context: int, cfg: AcceptanceConfig, target: LoadedModel, draft: LoadedModel) -> int:
    """The prompt length of a context: refused, as pg19 and passkey do, when the new tokens do not fit
    after it (a silent cap would record the asked context for a shorter one)."""
    limit = min(target.model.cfg.max_position_embeddings, draft.model.cfg.max_position_embeddings)
    if context + cfg.max_new_tokens > limit:
        raise DustinError(f"--contexts {context} + --max-new-tokens {cfg.max_new_tokens} exceed the models' {limit} "
                          f"positions: the largest context is {limit - cfg.max_new_tokens}")
    return context


def resume_key(cfg: AcceptanceConfig, configs: dict[int, SparseConfig], extra: Mapping | None = None) -> dict:
    """What the records depend on: the settings shared by every run, and under "runs" each budget's
    SparseConfig (contexts, policies and budgets are each record's own key, so a re-run may add them)."""
    common = {k: v for k, v in asdict(cfg).items() if k not in ("contexts", "policies", "budgets")}
    if cfg.lookup is None:  # as keys written before the option existed
        del common["lookup"]
    if cfg.windows_per_book == 1:  # the same
        del common["windows_per_book"]
    del common["vanilla"]  # the ar record is keyed as any policy's
    runs = {f"S={b}": {k: v for k, v in asdict(c).items() if k != "source"} for b, c in sorted(configs.items())}
    return {**common, **dict(extra or {}), "runs": runs}


def _shared_prefill(model, prompts: list[list[int]], capacity: int, rows: int):
    cache = model.allocate_cache(len(prompts), capacity)
    prefill(model, cache, [p[: rows + 1] for p in prompts], default_backend(model.device))
    return cache


VANILLA = "ar"  # the record of vanilla greedy decoding


def _vanilla(model, prompts: list[list[int]], max_new_tokens: int, shared, capacity: int):
    """Vanilla greedy decoding of `prompts` from the shared prefill (`_shared_prefill`'s target cache,
    its rows): the first rows copied into a fresh engine's cache, as `speculative_generate` copies them."""
    from dustin_runtime.engine import Engine
    from dustin_runtime.generate import generate

    eng = Engine(model)
    cache, _ = eng.caches(len(prompts), capacity, draft=False)
    rows = shared[2]
    for a, b in zip(cache.k + cache.v, shared[0].k + shared[0].v, strict=True):
        a[:, :, :rows].copy_(b[:, :, :rows])
    return generate(model, prompts, max_new_tokens, engine=eng, prefilled=rows, cuda_graphs=False)


def _prefix_share(tokens: list[list[int]], ref: list[list[int]]) -> float:
    shares = []
    for a, b in zip(tokens, ref, strict=True):
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        shares.append(n / max(len(b), 1))
    return sum(shares) / len(shares)


@torch.inference_mode()
def run_acceptance(
    target: LoadedModel,
    draft: LoadedModel,
    configs: dict[int, SparseConfig],
    cfg: AcceptanceConfig,
    runs_path: str | Path,
    *,
    resume_key_extra: Mapping | None = None,
    restart: bool = False,
    on_record: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Every policy at every budget (`configs[S]`: sinks, window, heads and m at budget S) on every
    context; returns the per-run records (also appended to `runs_path`). The resume key
    (`resume_key` plus `resume_key_extra`: the models' identity, dtype, device, the profile's sha256)
    is kept beside the runs file; `restart` discards the runs recorded before."""
    missing = [b for b in cfg.budgets if b not in configs]
    if missing:
        raise DustinError(f"no sparse config for budgets {missing}")
    for context in cfg.contexts:  # refused before any work
        _prompt_len(context, cfg, target, draft)
    runs_path = Path(runs_path)
    with FolderLock(runs_path.parent):
        key = resume_key(cfg, configs, {"target": target.model_id, "draft": draft.model_id,
                                        "inputs": input_hashes(book_paths(cfg.books_dir)),
                                        **dict(resume_key_extra or {})})
        check_resume_key(runs_path.with_name(runs_path.name.removesuffix(".runs.jsonl") + ".key.json"), key,
                         (runs_path,), restart=restart, where=str(runs_path))
        return _run(target, draft, configs, cfg, runs_path, on_record)


def _run(target, draft, configs, cfg, runs_path, on_record) -> list[dict]:
    done = {(r["context"], r["policy"], r["budget"]): r for r in repair_jsonl(runs_path)}
    records = []
    order = ["full"] + [VANILLA] * cfg.vanilla + [p for p in cfg.policies if p != "full"]  # full: the reference
    for context in cfg.contexts:
        n = _prompt_len(context, cfg, target, draft)
        windows = list(iter_windows(target.tokenizer, cfg.books_dir, n, seed=cfg.seed, max_windows=cfg.windows,
                                    max_windows_per_book=cfg.windows_per_book))
        if len(windows) < cfg.windows:
            raise DustinError(f"{cfg.books_dir}: only {len(windows)} windows of {n} tokens, {cfg.windows} asked: give "
                              "--data more or longer books, or fewer --windows, or shorter --contexts")
        prompts = [w.ids for w in windows]
        todo = [(p, b) for p in order if p != VANILLA for b in (cfg.budgets if policy_class(p).budgeted else [None])
                if (context, p, b) not in done]
        if cfg.vanilla and (context, VANILLA, None) not in done:
            todo.append((VANILLA, None))
        shared, capacity = None, None
        if todo:
            rows = n - 1 - (cfg.gamma + 1)
            capacity = cache_capacity(prompts, [cfg.max_new_tokens] * len(prompts), cfg.gamma)
            shared = (_shared_prefill(target.model, prompts, capacity, rows),
                      _shared_prefill(draft.model, prompts, capacity, rows), rows)
        for policy in order:
            if policy == VANILLA:
                rec = done.get((context, policy, None))
                if rec is None:
                    res = _vanilla(target.model, prompts, cfg.max_new_tokens, shared, capacity)
                    rec = {"context": context, "policy": policy, "budget": None, "prompt_tokens": n,
                           "sequences": len(prompts), "books": [w.book for w in windows], "steps": res.stats.steps,
                           "new_tokens": sum(res.stats.new_tokens), "accepted": 0.0, "tau": 1.0, "arr": None,
                           "decode_s": res.stats.decode_seconds, "seconds": res.stats.seconds, "tokens": res.tokens}
                    append_jsonl(runs_path, rec)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
                continue
            cls = policy_class(policy)
            for budget in cfg.budgets if cls.budgeted else [None]:
                rec = done.get((context, policy, budget))
                if rec is None:
                    scfg = None if budget is None else configs[budget]
                    if not cls.one_set and scfg is not None:  # per-KV-head sets: the draft drafts over its cache
                        scfg = replace(scfg, draft_kv="full")
                    if not cls.refreshes and scfg is not None and scfg.refresh_layers:  # dustin's alone
                        scfg = replace(scfg, refresh_layers=())
                    hooks = make_policy(policy, scfg, target=target.model, draft=draft.model,
                                        measure_arr=cfg.measure_arr, paired=cfg.paired)
                    res = speculative_generate(target.model, draft.model, prompts, cfg.max_new_tokens,
                                               gamma=cfg.gamma, hooks=hooks, prefilled=shared, lookup=cfg.lookup)
                    s = res.stats
                    rec = {
                        "context": context, "policy": policy, "budget": budget,
                        "prompt_tokens": n, "sequences": len(prompts), "books": [w.book for w in windows],
                        "steps": s.steps, "new_tokens": sum(s.new_tokens), "accepted": s.mean_accepted,
                        "tau": s.mean_accepted + 1, "tau_per_sequence": [a + 1 for a in s.accepted_per_sequence()],
                        **_per_sequence(s.accepted),
                        "arr": s.extra.get("arr"), "arr_per_sequence": s.extra.get("arr_per_sequence"),
                        "full_tau": s.extra.get("full_tau"), "paired_retention": s.extra.get("paired_retention"),
                        "agree": s.extra.get("agree"), "draft_retention": s.extra.get("draft_retention"),
                        "lookup_share": s.extra.get("lookup_share"), "agreement": s.extra.get("agreement"),
                        "decode_s": s.decode_seconds, "seconds": s.seconds, "extra": s.extra, "tokens": res.tokens,
                    }
                    if scfg is not None and scfg.refresh_layers:
                        rec["refresh_layers"] = list(scfg.refresh_layers)
                    append_jsonl(runs_path, rec)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
        del shared
    for r in records:
        full = next(f for f in records if f["context"] == r["context"] and f["policy"] == "full")
        r["retention"] = r["tau"] / full["tau"]
        r["prefix"] = _prefix_share(r["tokens"], full["tokens"])
        ar = next((a for a in records if a["context"] == r["context"] and a["policy"] == VANILLA), None)
        if ar is not None:
            r["prefix_vanilla"] = _prefix_share(r["tokens"], ar["tokens"])
        r.update(intervals(r, full))
    return records


def _per_sequence(accepted: list[list[int]]) -> dict:
    """Tokens emitted (accepted + 1) and steps of each sequence, from the per-step accepted counts."""
    cols = list(zip(*accepted, strict=True)) if accepted else []
    return {"tokens_per_sequence": [sum(a + 1 for a in c if a >= 0) for c in cols],
            "steps_per_sequence": [sum(a >= 0 for a in c) for c in cols]}


def intervals(r: dict, full: dict) -> dict:
    """95% bootstrap intervals over the windows (sequences) of a run's tau, retention vs full, paired
    retention, paired drafting retention and ARR (`dustin_eval.intervals`; empty for records made
    before they were kept). Windows of one book are resampled together (the record's `books`)."""
    from functools import partial

    from dustin_eval.intervals import bootstrap as plain
    from dustin_eval.intervals import ratio_of_sums

    bootstrap = partial(plain, groups=r.get("books"))
    out = {}
    if r.get("tokens_per_sequence"):  # tokens per step itself (accepted drafts + 1), pooled over the windows
        _, lo, hi = bootstrap(ratio_of_sums, r["tokens_per_sequence"], r["steps_per_sequence"])
        out["tau_ci"] = [lo, hi]
    if r.get("tokens_per_sequence") and full.get("tokens_per_sequence"):
        _, lo, hi = bootstrap(lambda t, s, tf, sf: (t.sum() / s.sum()) / (tf.sum() / sf.sum()),
                              r["tokens_per_sequence"], r["steps_per_sequence"], full["tokens_per_sequence"],
                              full["steps_per_sequence"])
        out["retention_ci"] = [lo, hi]
    extra = r.get("extra") or {}
    if extra.get("paired_policy_per_sequence"):
        _, lo, hi = bootstrap(ratio_of_sums, extra["paired_policy_per_sequence"], extra["paired_full_per_sequence"])
        out["paired_retention_ci"] = [lo, hi]
    if extra.get("paired_shadow_per_sequence"):
        _, lo, hi = bootstrap(ratio_of_sums, extra["paired_full_per_sequence"], extra["paired_shadow_per_sequence"])
        out["draft_retention_ci"] = [lo, hi]
    if extra.get("arr_steps_per_sequence"):
        _, lo, hi = bootstrap(lambda a, n: (a * n).sum() / n.sum(), extra["arr_per_sequence"],
                              extra["arr_steps_per_sequence"])
        out["arr_ci"] = [lo, hi]
    for kind in ("", "_draft", "_correction"):  # exact mode: the per-token agreement of sparse and full greedy
        if extra.get(f"exact_checked{kind}_per_sequence") and sum(extra[f"exact_checked{kind}_per_sequence"]):
            value, lo, hi = bootstrap(ratio_of_sums, extra[f"exact_matched{kind}_per_sequence"],
                                      extra[f"exact_checked{kind}_per_sequence"])
            out[f"agreement{kind}"], out[f"agreement{kind}_ci"] = value, [lo, hi]
    return out


COLUMNS = ("context", "prompt_tokens", "policy", "budget", "tau", "tau_ci", "retention", "retention_ci", "paired_retention",
           "paired_retention_ci", "agree", "draft_retention", "draft_retention_ci", "arr", "arr_ci", "prefix",
           "prefix_vanilla",
           "full_tau", "lookup_share", "agreement", "agreement_ci", "agreement_draft", "agreement_draft_ci",
           "agreement_correction", "agreement_correction_ci", "steps")


def table_rows(records: Sequence[dict]) -> list[dict]:
    """The table's rows (no token lists)."""
    return [{c: ("full cache" if c == "budget" and r[c] is None else r.get(c)) for c in COLUMNS} for r in records]


def _ci(ci, fmt: str) -> str:
    return "" if not ci else f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


def write_acceptance(records: Sequence[dict], out_dir: str | Path, name: str, prov: dict,
                     cfg: AcceptanceConfig, configs: dict[int, SparseConfig]) -> tuple[Path, Path]:
    """<out>/<name>.json (rows + per-run records) and <name>.md (one table per context
    plus a budget x policy retention grid)."""
    out_dir = Path(out_dir)
    rows = table_rows(records)
    sparse = {str(k): asdict(v) for k, v in sorted(configs.items())}
    j = write_result_json(out_dir / f"{name}.json", rows, prov, config=asdict(cfg), sparse=sparse,
                          runs=[{k: v for k, v in r.items() if k != "tokens"} for r in records])
    tables = []
    for context in cfg.contexts:
        sub = [r for r in rows if r["context"] == context]
        if not sub:
            continue
        per = "" if cfg.windows_per_book == 1 else f", up to {cfg.windows_per_book} a book"
        head = f"context {context} ({sub[0]['prompt_tokens']} prompt tokens, {cfg.windows} windows{per})"
        for title, fmt in (("tau [95% interval] (retention vs full [95% interval])",
                            lambda r: f"{r['tau']:.2f}{_ci(r.get('tau_ci'), '.2f')} "
                                      f"({r['retention']:.1%}{_ci(r.get('retention_ci'), '.1%')})"),
                           ("paired retention [95% interval] (agree)", lambda r: None if r["paired_retention"] is None
                            else f"{r['paired_retention']:.1%}{_ci(r.get('paired_retention_ci'), '.1%')} "
                                 f"({r['agree']:.0%})"),
                           ("paired drafting retention, set drafts / full-KV drafts [95% interval]",
                            lambda r: None if r.get("draft_retention") is None
                            else f"{r['draft_retention']:.1%}{_ci(r.get('draft_retention_ci'), '.1%')}"),
                           ("ARR [95% interval]", lambda r: None if r["arr"] is None
                            else f"{r['arr']:.3f}{_ci(r.get('arr_ci'), '.3f')}"),
                           ("exact mode: per-token agreement of sparse and full greedy [95% interval] "
                            "(accepted drafts; correction tokens)", lambda r: None if r.get("agreement") is None
                            else f"{r['agreement']:.3f}{_ci(r.get('agreement_ci'), '.3f')} "
                                 f"({r.get('agreement_draft') or 0:.3f}; {r.get('agreement_correction') or 0:.3f})")):
            grid = []
            for policy in dict.fromkeys(r["policy"] for r in sub):
                row = {"policy": policy}
                for r in sub:
                    if r["policy"] == policy:
                        row["full cache" if r["budget"] == "full cache" else f"S={r['budget']}"] = fmt(r)
                grid.append(row)
            if any(v is not None for g in grid for k, v in g.items() if k != "policy"):
                tables.append((f"{head}: {title}", markdown_table(grid)))
        tables.append((f"context {context}: all columns", markdown_table(sub)))
    note = ("tau = mean tokens per verification step (accepted drafts + 1), free-running (each policy "
            "follows its own greedy trajectory); retention = tau / tau(full). Paired retention = on the "
            "policy's own steps, its tokens per step / those full verification gives on the same context and "
            "drafts (a side full pass); agree = share of steps where both accept the same count. "
            "Paired drafting retention (sparse drafting runs) = on the same steps, tokens per step full "
            "verification gives the drafts made over the set / those it gives the drafts made over the "
            "draft's whole cache (each step drafted both ways). "
            "ARR = mean share of each verification query's true attention on the context that the set keeps "
            "(new tokens left out). prefix = mean share of each sequence's tokens identical to full "
            "verification's, from the start (prefix_vanilla: vanilla greedy decoding's, policy ar). Intervals: 95% bootstrap over the windows (sequences)"
            + (f", the {cfg.windows_per_book} windows of a book resampled together (books are the unit)."
               if cfg.windows_per_book > 1 else "."))
    if cfg.lookup is not None:
        note += (f" Every run drafts with context lookup (`--draft-lookup {cfg.lookup.label()}`: a draft token is "
                 "copied from the sequence's own history where its last n-gram recurs, n from "
                 f"{cfg.lookup.max_ngram} down to {cfg.lookup.min_ngram}; lookup_share = the share of drafts copied).")
    refresh = sorted({tuple(c.refresh_layers) for c in configs.values() if c.refresh_layers})
    if refresh and any(policy_class(p).refreshes for p in cfg.policies):
        note += (f" dustin chooses the set again inside the verification pass at target layers "
                 f"{', '.join(map(str, refresh[0]))} (refresh layers); the other policies do not.")
    m = write_markdown(out_dir / f"{name}.md", "Acceptance per verification policy and budget",
                       [(None, note + "\n")] + tables, prov)
    return j, m


def plan_budgets(policies: Sequence[str], budgets: Sequence[int], profile, draft_kv: str | None,
                 refresh_layers) -> dict:
    """budget -> the one `SparsePlan` every policy of the run takes its set's settings from (every
    policy shares a budget's sinks, window and heads): that of the first policy that needs
    retrieval heads, else of any one-set policy without heads; checked before any model loads."""
    from dustin_profile.plan import plan_sparse, read_profile

    classes = [policy_class(p) for p in policies]
    heads = [p for p, c in zip(policies, classes, strict=True) if c.needs_heads]
    if refresh_layers and not any(c.refreshes for c in classes):
        raise DustinError("--refresh-layers applies to policy dustin, which is not among the policies")
    lead = heads[0] if heads else next(n for n, c in POLICY_CLASSES.items()
                                       if c.budgeted and c.one_set and not c.needs_heads)
    loaded = read_profile(profile) if profile is not None else None
    return {b: plan_sparse(lead, loaded, b, None, None, False, draft_kv, refresh_layers) for b in budgets}


def evaluate(target: LoadedModel, draft: LoadedModel, plans: dict, cfg: AcceptanceConfig, out: Path, *,
             tp=None, restart: bool = False, on_record: Callable[[dict], None] | None = None) -> tuple[Path, Path]:
    """`dustin eval acceptance`: every run of `cfg` with the planned sets (`plan_budgets`) on the loaded
    pair, its records in <out>.runs.jsonl (resumable), the result in <out>.json and <out>.md."""
    from dustin_profile.plan import run_identity, sparse_configs
    from dustin_runtime.io.provenance import provenance

    configs = sparse_configs(plans, target, draft)
    loaded = next(iter(plans.values())).profile
    runs = out.parent / f"{out.name}.runs.jsonl"
    ident = {**run_identity(target, draft), "all_heads": False, "profile": loaded.content if loaded else None}
    if tp is not None:
        ident["tp"] = {"world": tp.world}
    records = run_acceptance(target, draft, configs, cfg, runs, resume_key_extra=ident, restart=restart,
                             on_record=on_record)
    extra = {"torch_threads": torch.get_num_threads(), "runs_file": str(runs),
             "tp": None if tp is None else {"world": tp.world}}
    if loaded is not None:
        extra["profile"] = {"path": loaded.path, "sha256": loaded.sha256}
    prov = provenance(models={"target": target.model_id, "draft": draft.model_id},
                      shapes={"contexts": list(cfg.contexts), "windows": cfg.windows,
                              "windows_per_book": cfg.windows_per_book, "gamma": cfg.gamma,
                              "max_new_tokens": cfg.max_new_tokens}, extra=extra)
    with published_together():  # the JSON and the Markdown: both new, or both as they were
        return write_acceptance(records, out.parent, out.name, prov, cfg, configs)
