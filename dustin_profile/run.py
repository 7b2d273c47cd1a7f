"""`dustin profile`: calibration windows -> recorded ground truth (resumable, one file per window)
-> Algorithm 1 -> baselines -> the profile artifact with its parquet tables and plots.

With `--retrieval-windows K`, K key-value retrieval episodes (calibration.retrieval_window) follow
the prose windows; the pass that asks for the fact is scored by the share of the fact's rows the
set keeps and weighs `--retrieval-weight` of every mean ARR (see `stack_windows`).
With `--heldout-windows H`, H more prose windows (cut after the
calibration ones) are recorded but not searched on; the profile's `heldout` holds what it found
scored on them (`heldout`). With `--max-refresh K`
up to K refresh layers of the dustin policy are chosen last, by teacher-forced perplexity on the
calibration prose windows (`refresh`), and scored on the held-out ones."""

from __future__ import annotations

import math
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from dustin_profile import calibration as cal
from dustin_profile.artifact import HeadChoice, ModelInfo, Profile, model_info
from dustin_profile.baselines import baseline_arrs
from dustin_profile.calib_arr import CalibStats, arr_exact
from dustin_profile.candidates import Candidate, candidates_of
from dustin_profile.groundtruth import record_window
from dustin_profile.heldout import heldout_figures
from dustin_profile.search import (
    SearchConfig,
    SearchResult,
    budget_sweep,
    greedy_search,
    signal_sums,
)
from dustin_profile.tables import write_tables
from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import (
    TEMP_NAME,
    FolderLock,
    atomic_path,
    check_resume_key,
    move_into,
    published_together,
)
from dustin_runtime.io.provenance import git_commit
from dustin_runtime.memory import MemoryPlan, check_free, peak_bytes, plan_profile

WORK_VERSION = 3  # 2: ARR over the context (new tokens excluded, rows renormalised); 3: draft confidence (no longer read)
REPO = Path(__file__).resolve().parents[1]
DEFAULT_CALIB = REPO.parent / "shared" / "corpus" / "gutenberg" / "calib"


@dataclass(frozen=True)
class ProfileConfig:
    """Everything a profiling run depends on (the CLI's options)."""

    target: str
    draft: str
    out: str
    calib: tuple[str, ...] = ()  # empty: ../shared/corpus/gutenberg/calib
    context: int = 8192
    windows: int = 16
    retrieval: int = 0  # extra key-value retrieval windows (calibration.retrieval_window)
    retrieval_weight: float = 0.5  # share of the mean ARR given to their question passes
    positions: int = 8  # verification passes per window
    budget: int = 512
    gamma: int = 4
    sinks: int = 4
    window: int = 64
    budgets: tuple[int, ...] = (128, 256, 512, 1024)  # ARR-vs-budget and m_by_budget
    max_heads: int = 8
    epsilon: float = 1e-3  # least ARR gain of a head
    m_points: int = 9
    heldout: int = 0  # prose windows recorded to score the result on, not searched on
    max_refresh: int = 0  # refresh layers of the dustin policy, chosen by perplexity (refresh.py)
    seed: int = 0
    verify_tokens: str = "draft"  # "draft": the draft's greedy drafts; "text": teacher forcing
    draft_kv: str = "full"  # the draft drafts over its whole cache, or over a verification set ("verify-set")
    text_field: str = "text"
    device: str = "auto"
    dtype: str = "auto"
    prefill_chunk: int = 2048

    @property
    def calib_paths(self) -> tuple[str, ...]:
        return self.calib or (str(DEFAULT_CALIB),)

    @property
    def all_budgets(self) -> tuple[int, ...]:
        return tuple(sorted({*self.budgets, self.budget}))

    def check(self) -> None:
        if self.gamma < 1:
            raise DustinError("--gamma must be >= 1")
        if self.context < 1 or self.prefill_chunk < 1:
            raise DustinError(f"--context must be >= 1, got {self.context}")
        if min(self.sinks, self.window) < 0 or self.budget < self.sinks + self.window:
            raise DustinError(f"--budget {self.budget} must be >= --sinks + --window ({self.sinks} + {self.window})")
        bad = [b for b in self.budgets if b < self.sinks + self.window]
        if bad:
            raise DustinError(f"budgets {bad} are smaller than sinks + window ({self.sinks + self.window})")
        if self.retrieval < 0 or not 0.0 <= self.retrieval_weight < 1.0:
            raise DustinError("--retrieval-windows must be >= 0 and --retrieval-weight in [0, 1)")
        if self.windows < 1 or self.positions < 1 or self.max_heads < 1 or self.m_points < 1:
            raise DustinError("--windows, --positions, --max-heads and --m-points must be >= 1")
        if self.heldout < 0:
            raise DustinError("--heldout-windows must be >= 0")
        if self.max_refresh < 0:
            raise DustinError(f"--max-refresh must be >= 0, got {self.max_refresh}")
        if not math.isfinite(self.epsilon) or self.epsilon < 0:
            raise DustinError(f"--epsilon must be a finite number >= 0, got {self.epsilon}")
        if self.verify_tokens not in ("draft", "text"):
            raise DustinError("--verify-tokens must be 'draft' or 'text'")
        if not self.out.endswith(".json") or Path(self.out).is_dir():
            raise DustinError(f"--out {self.out}: the profile is a .json file")


@dataclass
class RunResult:
    profile: Profile
    path: Path
    search: SearchResult
    recorded: int  # windows recorded in this run (the others were resumed)
    seconds: dict = field(default_factory=dict)


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("dustin")
    except Exception:
        return "unknown"


def online_cost(tcfg: ModelConfig, dcfg: ModelConfig, n_draft: int, n_target: int, context: int,
                dtype_bytes: int = 2) -> dict:
    """Key bytes the estimator reads per step (chosen draft heads over the draft cache, chosen
    target heads over the target cache) vs the K+V bytes full verification reads."""
    key = (n_draft * dcfg.head_dim + n_target * tcfg.head_dim) * context * dtype_bytes
    full = 2 * tcfg.num_layers * tcfg.num_kv_heads * tcfg.head_dim * context * dtype_bytes
    return {
        "share": key / full,
        "key_bytes_per_step": key,
        "full_cache_bytes_per_step": full,
        "context": context,
        "dtype_bytes": dtype_bytes,
        "draft_kv_heads": n_draft,
        "target_kv_heads": n_target,
        "note": "one pass over the keys of each chosen KV head per sequence; the fused srh_scores "
                "kernel reads them twice (share x 2)",
    }


def memory_plan(cfg: ProfileConfig, target: ModelConfig, draft: ModelConfig, dtype: torch.dtype,
                tp: int = 1) -> MemoryPlan:
    """What the run holds on each GPU (`dustin_runtime.memory.plan_profile`)."""
    return plan_profile(target, draft, tp=tp, context=cfg.context, windows=cfg.windows, extra_windows=cfg.heldout + cfg.retrieval,
                        positions=cfg.positions, gamma=cfg.gamma, budgets=len(cfg.all_budgets),
                        prefill_chunk=cfg.prefill_chunk, dtype_bytes=dtype.itemsize)


def _relative(p: str) -> str:
    """A path relative to the repository (e.g. ../shared/...) when it is close to it."""
    rel = os.path.relpath(Path(p).resolve(), REPO)
    return p if rel.startswith(os.path.join("..", "..")) else rel


def record_key(cfg: ProfileConfig, tinfo: ModelInfo, dinfo: ModelInfo, dtype: torch.dtype, device: str) -> dict:
    """What the recorded windows depend on: a resumed run must match it."""
    return {
        "work_version": WORK_VERSION,
        "target": [tinfo.config_hash, tinfo.tokenizer_hash],
        "draft": [dinfo.config_hash, dinfo.tokenizer_hash],
        "context": cfg.context,
        "positions": cfg.positions,
        "gamma": cfg.gamma,
        "quest_budgets": list(cfg.all_budgets),
        "verify_tokens": cfg.verify_tokens,
        "quest_sets": [cfg.sinks, cfg.window],
        "draft_kv": cfg.draft_kv if cfg.draft_kv == "full" else [cfg.draft_kv, cfg.budget, cfg.sinks, cfg.window],
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "prefill_chunk": cfg.prefill_chunk,
        "seed": cfg.seed,
    }


def _open_work(work: Path, key: dict, restart: bool) -> None:
    """Resume from `work` only if its windows were recorded with `key` (meta.json); `restart`
    discards them. Published artifacts staged there by a killed run are left to be overwritten."""
    check_resume_key(work / "meta.json", key, tuple(sorted(work.glob("w*.pt"))), restart=restart, where=str(work))


def _load_window(path: Path, whash: str) -> dict | None:
    if not path.is_file():
        return None
    try:
        rec = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    return rec if rec.get("window_hash") == whash else None


def stack_windows(recs: list[dict], budgets: tuple[int, ...], retrieval: int = 0, retrieval_weight: float = 0.0,
                  facts: list[tuple[int, int]] | None = None) -> CalibStats:
    """All windows' passes as one `CalibStats` (windows share the positions, hence N).

    The last `retrieval` windows are retrieval episodes: their first pass (L = context) asks for
    the fact. Those passes together weigh `retrieval_weight` of every mean ARR (the other passes
    share the rest), and with `facts` (rows [start, end) per retrieval window) their target
    distribution is the fact's rows, uniform, so their ARR is the share of the fact the set keeps:
    a fact is a few tokens and holds only a few percent of the mean attention mass, too little
    for the mass alone to favour the heads that find it (results/retrieval-passkey/README.md)."""
    cat = {k: torch.cat([r[k] for r in recs], dim=1 if k in ("draft", "target") else 0)
           for k in ("lengths", "attn", "draft", "target", "layer_attn", "quest")}
    weight = None
    if retrieval:
        per = [r["lengths"].numel() for r in recs]
        asks = [sum(per[:w]) for w in range(len(recs) - retrieval, len(recs))]
        if facts is not None:  # every layer's too (the per-layer tables are scored on them)
            cat["attn"], cat["layer_attn"] = cat["attn"].clone(), cat["layer_attn"].clone()
            for p, (a, b) in zip(asks, facts, strict=True):
                cat["attn"][p] = 0.0
                cat["attn"][p, a:b] = 1.0 / (b - a)
                cat["layer_attn"][p] = 0.0
                cat["layer_attn"][p, :, a:b] = 1.0 / (b - a)
        if retrieval_weight > 0:
            ask = torch.zeros(sum(per), dtype=torch.bool)
            ask[asks] = True
            weight = torch.where(ask, retrieval_weight / len(asks), (1 - retrieval_weight) / int((~ask).sum()))
    return CalibStats(quest_budgets=tuple(budgets), weight=weight, **cat)


@contextmanager
def _silent(label: str, total: int | None):
    """No progress shown (a library call): the `progress` of `run_profile` when none is given."""
    yield lambda *_: None


def run_profile(cfg: ProfileConfig, *, command: str = "", console=None, restart: bool = False,
                tp=None, progress=None) -> RunResult | None:
    """Profile a target/draft pair and write the artifact (see the module docstring). The work
    folder `<out>.work/` is locked for the run: a second run on the same --out is refused. Under
    `tp` (a `TensorParallel`, every rank calling) the target is sharded by KV heads and the draft
    replicated; each window's record is gathered onto every rank (`record_window`), rank 0 runs the
    search and alone writes (the lock, the windows, the artifact); other ranks return None. With
    `--max-refresh` every rank runs the refresh search's sharded teacher-forced passes on rank 0's
    set, and rank 0's perplexities decide every round (`_refresh_layers`).
    `progress(label, total)`: the caller's progress display (the CLI's `render.progress`, a line per
    recorded window and per search round off a terminal), a context yielding a tick per unit."""
    from rich.console import Console

    console = console or Console(stderr=True)
    cfg.check()
    out = Path(cfg.out)
    with FolderLock(out.with_suffix(".work"), ".lock"):
        for f in out.parent.glob(f".{out.name}.*"):  # the JSON's temp file, if a kill cut its write
            if TEMP_NAME.match(f.name):
                f.unlink(missing_ok=True)
        return _run(cfg, command, console, restart, tp, progress or _silent)


def _publish(out: Path, prof: Profile, stage: Path) -> Profile:
    """Tables and plots are written into the work folder under their final names, then moved beside
    `out` with the JSON (`published_together`: all renamed once the JSON is written), so a failure
    or a kill leaves no half-written file and no new table beside the old JSON."""
    with published_together():
        for name in prof.tables.values():
            move_into(stage.parent / name, out.parent / name)
        prof.save(out)
    return prof


def _run(cfg: ProfileConfig, command: str, console, restart: bool, tp, progress) -> RunResult | None:
    from dustin_runtime import pipeline
    from dustin_runtime.loader import read_config, resolve_checkpoint
    from dustin_runtime.tokenizer import check_same_vocab, vocab_hash

    t0 = time.perf_counter()
    device = pipeline.pick_device(cfg.device)
    dtype = pipeline.pick_dtype(cfg.dtype, device)
    mcfgs = {}
    for spec in (cfg.target, cfg.draft):
        mcfg = mcfgs[spec] = read_config(resolve_checkpoint(spec))
        if spec == cfg.target and cfg.max_refresh > mcfg.num_layers:
            raise DustinError(f"--max-refresh {cfg.max_refresh} exceeds {spec}'s {mcfg.num_layers} layers")
        if cfg.context + cfg.gamma + 1 > mcfg.max_position_embeddings:
            raise DustinError(f"--context {cfg.context} + gamma + 1 exceeds {spec}'s context of "
                              f"{mcfg.max_position_embeddings} tokens; use --context <= "
                              f"{mcfg.max_position_embeddings - cfg.gamma - 1}")
    plan = memory_plan(cfg, mcfgs[cfg.target], mcfgs[cfg.draft], dtype, 1 if tp is None else tp.world)
    check_free(plan, device, tp)  # before any weight is read
    with console.status("loading models"):
        tgt = pipeline.load(cfg.target, dtype=dtype, device=device, tp=tp)
        drf = pipeline.load(cfg.draft, dtype=dtype, device=device)
    tinfo = model_info(tgt.model_id, tgt.model.cfg, vocab_hash(tgt.tokenizer))
    dinfo = model_info(drf.model_id, drf.model.cfg, vocab_hash(drf.tokenizer))
    if tinfo.tokenizer_hash != dinfo.tokenizer_hash:
        check_same_vocab(tgt.tokenizer, drf.tokenizer, tgt.model_id, drf.model_id)
    positions = cal.verification_positions(cfg.context, cfg.gamma, cfg.positions)
    with console.status("cutting calibration windows"):
        docs = cal.read_documents(cfg.calib_paths, cfg.text_field)
        # calibration windows, then held-out ones (the first cfg.windows are the same whatever
        # cfg.heldout is), then retrieval episodes
        windows = cal.cut_windows(tgt.tokenizer, docs, cfg.windows + cfg.heldout, cfg.context + cfg.gamma + 1,
                                  cfg.seed)
        windows += [cal.retrieval_window(tgt.tokenizer, docs, cfg.context, cfg.gamma + 1, i, cfg.seed)
                    for i in range(cfg.retrieval)]
    out = Path(cfg.out)
    work = out.with_suffix(".work")
    _open_work(work, record_key(cfg, tinfo, dinfo, dtype, device), restart)
    recs, recorded = [], 0
    t_rec = time.perf_counter()
    with progress("profile windows", len(windows)) as tick:
        for i, w in enumerate(windows):
            path = work / f"w{i:03d}.pt"
            whash = cal.windows_hash([w])
            rec = _load_window(path, whash)
            if tp is not None and tp.all_reduce_(torch.tensor([float(rec is None)], device=device), "max").item():
                rec = None  # recorded by every rank together when any lacks it
            if rec is None:
                rec = record_window(tgt.model, drf.model, w.tokens, positions, gamma=cfg.gamma,
                                    quest_budgets=cfg.all_budgets, verify_tokens=cfg.verify_tokens,
                                    prefill_chunk=cfg.prefill_chunk, sinks=cfg.sinks, window=cfg.window,
                                    draft_set=(cfg.budget, cfg.sinks, cfg.window) if cfg.draft_kv == "verify-set"
                                    else None)
                rec["window_hash"] = whash
                with atomic_path(path) as tmp:
                    torch.save(rec, tmp)
                recorded += 1
            recs.append(rec)
            tick()
    t_rec = time.perf_counter() - t_rec
    n, h = cfg.windows, cfg.heldout
    held_windows, held_recs = windows[n: n + h], recs[n: n + h]
    if tp is not None and tp.rank != 0:  # the search, tables and artifact are rank 0's
        sparse = tp.share(None) if cfg.max_refresh else None  # rank 0's set (None: no head, no refresh search)
        if sparse is not None:
            _refresh_layers(sparse, cfg, tgt.model, drf.model, windows[:n], held_windows, tp)
        return None
    windows, recs = windows[:n] + windows[n + h:], recs[:n] + recs[n + h:]  # calibration
    facts = [w.fact for w in windows[len(windows) - cfg.retrieval:]] if cfg.retrieval else None
    stats = stack_windows(recs, cfg.all_budgets, cfg.retrieval, cfg.retrieval_weight, facts).to(device)
    cands = candidates_of(drf.model.cfg, "draft") + candidates_of(tgt.model.cfg, "target")
    scfg = SearchConfig(cfg.budget, cfg.sinks, cfg.window, cfg.max_heads, cfg.epsilon, cfg.m_points)
    t_search = time.perf_counter()
    with progress("greedy search rounds", None) as tick:  # a tick when a round has scored every candidate
        res = greedy_search(stats, cands, scfg, progress=lambda r, done, total: done == total and tick())
    sweep = budget_sweep(stats, cands, res.chosen, list(cfg.all_budgets), cfg.sinks, cfg.window, cfg.m_points)
    t_search = time.perf_counter() - t_search
    arr, m = sweep[cfg.budget]
    prim, sec = signal_sums(stats, cands, res.chosen)
    exact = float(stats.average(arr_exact(stats, prim, sec, budget=cfg.budget, sinks=cfg.sinks,
                                           window=cfg.window, m=m)))
    if abs(exact - arr) > 1e-4:
        raise DustinError(f"internal error: ARR from the grid ({arr:.6f}) != ARR through select_indices ({exact:.6f})")
    heldout = {}
    if h:
        held = stack_windows(held_recs, cfg.all_budgets).to(device)
        heldout = {"windows": [{"source": _relative(w.source), "offset": w.offset} for w in held_windows],
                   **heldout_figures(held, cands, res, m, budget=cfg.budget, sinks=cfg.sinks, window=cfg.window)}
    stage = work / out.name  # tables and plots are written here, then published with the JSON
    tables = write_tables(stage, cfg, stats, cands, res, sweep, command)
    accepted = torch.cat([r["accepted"] for r in recs]).float()
    calib = {
        "description": f"{len(windows)} windows of {cfg.context + cfg.gamma + 1} tokens from "
                       f"{len({w.source for w in windows})} documents of {', '.join(_relative(p) for p in cfg.calib_paths)}"
                       f" (seed {cfg.seed}"
                       + (f"; the last {cfg.retrieval} are key-value retrieval episodes answered at L = "
                          f"{cfg.context}, those passes weigh {cfg.retrieval_weight:g} of every ARR"
                          if cfg.retrieval else "")
                       + f"), {cfg.positions} verification passes each at L = "
                       f"{positions[-1]}..{positions[0]}, verification tokens: "
                       + ("the draft's greedy drafts" if cfg.verify_tokens == "draft" else "the text (teacher forcing)"),
        "sources": {_relative(k): v for k, v in cal.file_hashes(cfg.calib_paths).items()},
        "windows": [{"source": _relative(w.source), "offset": w.offset} for w in windows],
        "context": cfg.context,
        "positions": positions,
        "seed": cfg.seed,
        "retrieval_windows": cfg.retrieval,
        "retrieval_weight": cfg.retrieval_weight if cfg.retrieval else 0.0,
        "verify_tokens": cfg.verify_tokens,
        "text_field": cfg.text_field,
        "sha256": cal.windows_hash(windows),
        "mean_accepted": float(accepted.mean()),
        "search": {"max_heads": cfg.max_heads, "epsilon": cfg.epsilon, "m_points": cfg.m_points, "stop": res.stop,
                   "rounds": len(res.rounds) - 1},
        "run": {"command": command, "device": str(device), "tp": 1 if tp is None else tp.world, "dtype": str(dtype).removeprefix("torch."),
                "torch": torch.__version__, "python": platform.python_version(),
                "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None,
                "seconds": {"record": round(t_rec, 2), "search": round(t_search, 2),
                            "total": round(time.perf_counter() - t0, 2)},
                "windows_recorded": recorded,
                "memory": {"plan": plan.record(), "peak_bytes": peak_bytes(device)}},
    }
    prof = Profile(
        tool_version=tool_version(),
        git_commit=git_commit(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        target=tinfo,
        draft=dinfo,
        gamma=cfg.gamma,
        budget=cfg.budget,
        sinks=cfg.sinks,
        window=cfg.window,
        m=m,
        m_by_budget={b: mb for b, (_, mb) in sweep.items()},
        draft_heads=_heads(res.draft_heads),
        target_heads=_heads(res.target_heads),
        arr=arr,
        arr_baselines=baseline_arrs(stats, cfg.budget, cfg.sinks, cfg.window),
        calibration=calib,
        online_cost=online_cost(tgt.model.cfg, drf.model.cfg, len(res.draft_heads), len(res.target_heads),
                                cfg.context),
        aggregation="sum",
        draft_kv=cfg.draft_kv,
        tables=tables,
        heldout=heldout,
    )
    from dustin_profile.plots import write_plots

    skipped = {"skipped": "Algorithm 1 chose no retrieval head: dustin has no set to score"}
    sparse = prof.to_sparse_config() if cfg.max_refresh and prof.has_heads else None
    if tp is not None and cfg.max_refresh:
        tp.share(sparse)  # the other ranks run the refresh search's passes with rank 0
    if cfg.max_refresh and sparse is None:
        prof = replace(prof, refresh_search=skipped)
    elif cfg.max_refresh:
        t_refresh = time.perf_counter()
        with console.status(f"refresh layers (up to {cfg.max_refresh})"):
            layers, record = _refresh_layers(sparse, cfg, tgt.model, drf.model, windows[:n], held_windows, tp)
        prof = replace(prof, refresh_layers=layers, refresh_search=record)
        prof.calibration["run"]["seconds"]["refresh"] = round(time.perf_counter() - t_refresh, 2)
    prof = replace(prof, tables={**tables, **write_plots(stage, prof)})
    prof.calibration["run"]["seconds"]["total"] = round(time.perf_counter() - t0, 2)
    _publish(out, prof, stage)
    return RunResult(prof, out, res, recorded, prof.calibration["run"]["seconds"])


def _refresh_layers(sparse, cfg: ProfileConfig, target, draft, calib_windows, held_windows,
                    tp=None) -> tuple[tuple[int, ...], dict]:
    """The refresh layers of the profile's set `sparse` (`refresh.greedy_refresh` over every target
    layer on the calibration prose windows) and the search's record, with held-out perplexity
    ratios. Under `tp` every rank calls it: the passes run sharded and every rank takes rank 0's
    NLLs (`TensorParallel.share`), so every rank takes the same decisions and collectives."""
    from dustin_profile import refresh as rf

    def scorer(ws):
        score = rf.nll_scorer(target, draft, sparse, [list(w.tokens) for w in ws], cfg.gamma, rf.EVAL_TOKENS,
                              cfg.prefill_chunk)
        return score if tp is None else lambda sets: tp.share(score(sets))

    found = rf.greedy_refresh(scorer(calib_windows), range(target.cfg.num_layers), cfg.max_refresh)
    total = len(calib_windows[0].tokens)
    record = {"max_refresh": cfg.max_refresh, "candidates": "every target layer", "min_gain": rf.MIN_GAIN,
              "objective": "teacher-forced perplexity ratio to full attention through dustin's set at the profile's "
                           "budget, at the last offset of each verification window, over the last "
                           "scored_tokens of each calibration prose window",
              "scored_tokens": rf.scored_tokens(total, cfg.gamma), "windows": len(calib_windows),
              "stop": found.stop, "ppl_ratio": found.ppl_ratio, "ppl_ratio_without": found.base_ratio,
              "rounds": found.rounds}
    if held_windows:
        record["heldout"] = {"windows": len(held_windows), **rf.heldout_ratios(scorer(held_windows), found.layers)}
    return found.layers, record


def _heads(cands: list[Candidate]) -> tuple[HeadChoice, ...]:
    return tuple(HeadChoice(c.layer, c.kv_head, c.query_heads) for c in cands)


def info_of(spec: str) -> ModelInfo:
    """A checkpoint's identity for `check_models`, from its config and tokenizer (no weights)."""
    from dustin_runtime.loader import read_config, resolve_checkpoint
    from dustin_runtime.tokenizer import load_tokenizer, vocab_hash

    ckpt = resolve_checkpoint(spec)
    return model_info(ckpt.model_id, read_config(ckpt), vocab_hash(load_tokenizer(ckpt)))
