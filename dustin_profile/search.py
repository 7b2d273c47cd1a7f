"""Algorithm 1: greedy search of retrieval heads (KV-head granularity, both models) and of the
draft/target split m that maximise the mean ARR over the calibration passes.

Round r evaluates every candidate not yet chosen: its signal is added to the chosen draft (or
target) heads' sum and the set is scored at every m of a grid over [0, S - sinks - window]; the
candidate with the best ARR (at its best m) is added. The search stops at `max_heads` or when the
best gain is below `epsilon`. Ties go to the earlier candidate (draft heads first, then target
heads, by layer and KV head) and to the smaller m, so the search is deterministic. With no draft
heads chosen m is 0, with no target heads m is S - sinks - window (what the runtime does when a
signal is absent)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dustin_profile.calib_arr import (
    CalibStats,
    _base,
    arr_from_rankings,
    arr_grid,
    middle_mask,
    ranking,
)
from dustin_profile.candidates import Candidate


@dataclass(frozen=True)
class SearchConfig:
    budget: int
    sinks: int
    window: int
    max_heads: int = 8
    epsilon: float = 1e-3
    m_points: int = 9

    @property
    def free(self) -> int:
        return self.budget - self.sinks - self.window


@dataclass
class Round:
    """One greedy round: what was added, the ARR and m after it, and every candidate's score."""

    index: int
    added: Candidate | None
    m: int
    arr: float
    gain: float
    evaluations: list[tuple[int, float, int]] = field(default_factory=list)  # (candidate, ARR, best m)


@dataclass
class SearchResult:
    candidates: list[Candidate]
    rounds: list[Round]  # round 0: no heads
    chosen: list[int]  # candidate indices, in the order added
    m: int
    arr: float
    stop: str  # "max_heads" | "epsilon" | "exhausted"

    @property
    def draft_heads(self) -> list[Candidate]:
        return [self.candidates[c] for c in sorted(self.chosen) if self.candidates[c].model == "draft"]

    @property
    def target_heads(self) -> list[Candidate]:
        return [self.candidates[c] for c in sorted(self.chosen) if self.candidates[c].model == "target"]


def m_grid(free: int, points: int) -> list[int]:
    """`points` values of m evenly over [0, free], rounded, unique, ascending."""
    if points < 2 or free == 0:
        return [0] if free == 0 or points < 1 else [free]
    return sorted({round(k * free / (points - 1)) for k in range(points)})


def allowed_ms(n_draft: int, n_target: int, free: int, grid: list[int]) -> list[int]:
    if n_draft and n_target:
        return grid
    return [free] if n_draft else [0]


def signal_sums(stats: CalibStats, cands: list[Candidate], chosen: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of the chosen heads' signals: (draft [P, N], target [P, N])."""
    nd = stats.draft.shape[0]
    prim = torch.zeros_like(stats.attn)
    sec = torch.zeros_like(stats.attn)
    for c in chosen:
        if cands[c].model == "draft":
            prim += stats.draft[c]
        else:
            sec += stats.target[c - nd]
    return prim, sec


def _best(stats: CalibStats, arrs: torch.Tensor, ms: list[int]) -> tuple[float, int]:
    """(ARR, m) of the best m (mean over passes, weighted where stats has weights; the first of
    equal ones)."""
    mean = stats.average(arrs)
    k = int(torch.argmax(mean))  # first maximum
    return float(mean[k]), ms[k]


def greedy_search(stats: CalibStats, cands: list[Candidate], cfg: SearchConfig, progress=None) -> SearchResult:
    """Algorithm 1 on recorded statistics. `cands` lists the draft candidates (rows of
    stats.draft) then the target candidates (rows of stats.target). `progress(round, done, total)`
    is called after each candidate evaluation."""
    nd = stats.draft.shape[0]
    assert len(cands) == nd + stats.target.shape[0]
    P, N = stats.attn.shape
    free, top = cfg.free, min(cfg.free, N)
    grid = m_grid(free, cfg.m_points)
    middle = middle_mask(stats.lengths, N, cfg.sinks, cfg.window)
    base = _base(stats, cfg.sinks, cfg.window)

    def evaluate(prim_rank, sec_rank, n_d, n_t):
        ms = allowed_ms(n_d, n_t, free, grid)
        return _best(stats, arr_from_rankings(stats, base, prim_rank, sec_rank, free, ms, cfg.budget), ms)

    chosen: list[int] = []
    prim, sec = signal_sums(stats, cands, chosen)
    prim_rank, sec_rank = ranking(prim, middle, top), ranking(sec, middle, top)
    arr, m = evaluate(prim_rank, sec_rank, 0, 0)
    rounds = [Round(0, None, m, arr, 0.0)]
    stop = "exhausted"
    while len(chosen) < len(cands):
        if len(chosen) >= cfg.max_heads:
            stop = "max_heads"
            break
        n_d = sum(cands[c].model == "draft" for c in chosen)
        n_t = len(chosen) - n_d
        best: tuple[float, int, int] | None = None  # (ARR, m, candidate)
        evals = []
        todo = [c for c in range(len(cands)) if c not in chosen]
        for j, c in enumerate(todo):
            if c < nd:
                a, mm = evaluate(ranking(prim + stats.draft[c], middle, top), sec_rank, n_d + 1, n_t)
            else:
                a, mm = evaluate(prim_rank, ranking(sec + stats.target[c - nd], middle, top), n_d, n_t + 1)
            evals.append((c, a, mm))
            if best is None or a > best[0]:
                best = (a, mm, c)
            if progress is not None:
                progress(len(rounds), j + 1, len(todo))
        gain = best[0] - arr
        if gain < cfg.epsilon:
            rounds.append(Round(len(rounds), None, m, arr, gain, evals))
            stop = "epsilon"
            break
        arr, m, c = best
        chosen.append(c)
        if c < nd:
            prim = prim + stats.draft[c]
            prim_rank = ranking(prim, middle, top)
        else:
            sec = sec + stats.target[c - nd]
            sec_rank = ranking(sec, middle, top)
        rounds.append(Round(len(rounds), cands[c], m, arr, gain, evals))
    return SearchResult(cands, rounds, chosen, m, arr, stop)


def budget_sweep(stats: CalibStats, cands: list[Candidate], chosen: list[int], budgets: list[int],
                 sinks: int, window: int, m_points: int) -> dict[int, tuple[float, int]]:
    """Best m and its ARR at each budget for a fixed head set: {budget: (ARR, m)}. The m values
    tried at a budget are its grid plus the best m of every smaller budget, so the curve is
    monotone in the budget."""
    prim, sec = signal_sums(stats, cands, chosen)
    n_d = sum(cands[c].model == "draft" for c in chosen)
    n_t = len(chosen) - n_d
    out: dict[int, tuple[float, int]] = {}
    carried: set[int] = set()
    for b in sorted(budgets):
        free = b - sinks - window
        ms = allowed_ms(n_d, n_t, free, sorted(set(m_grid(free, m_points)) | carried))
        arrs = arr_grid(stats, prim, sec, budget=b, sinks=sinks, window=window, ms=ms)
        out[b] = _best(stats, arrs, ms)
        carried.add(out[b][1])
    return out

