"""Refresh layers (`--max-refresh K`): after Algorithm 1, the target layers at which the verification
pass re-selects dustin's set from that layer's current queries (`SparseConfig.refresh_layers`),
chosen greedily by teacher-forced perplexity through the set (`teacher_forced_nll`, what `dustin
eval pg19` measures) on the calibration windows: each window's last `tokens` tokens are scored
after the rest as context, at the last offset of each verification window only. A refreshed set is
chosen from the current queries of all gamma + 1 positions, and teacher-forced those positions
hold the true tokens: a query at offset i < gamma shares its set with queries that have seen the
token it predicts (measured: at S = 512 on 16 x 1024 eval windows, refresh at layers 7 and 14 gives
0.972 over all offsets but 1.095 at the last one, against 1.095 / 1.123 without refresh at 4k).
Only the last offset, whose token no query of the window has seen, is free of that look-ahead. Round r scores chosen + {c} for every target layer c not chosen and
keeps the best; the search stops at K layers or when a round's best lowers the perplexity by less
than `MIN_GAIN` (relative). Up to `SETS_PER_PREFILL` candidates share one prefill of the context."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from dustin_runtime.errors import DustinError

MIN_GAIN = 0.01  # least relative perplexity gain of one more refresh layer (1%: the fidelity goal's scale)
EVAL_TOKENS = 320  # scored tokens per window (rounded down to whole verification windows of gamma + 1)
SETS_PER_PREFILL = 8  # layer sets scored per shared prefill: each run's policy keeps its copy of the cache alive

# A refresh set: its layers (every KV head scores each); None: full attention.
RefreshSet = tuple[int, ...]
Score = Callable[[Sequence[RefreshSet | None]], list[float]]  # refresh sets -> NLL per token


@dataclass(frozen=True)
class RefreshSearch:
    """The chosen layers (ascending), their perplexity ratio to full attention, the ratio without
    refresh, every round's candidates and why the search stopped."""

    layers: tuple[int, ...]
    ppl_ratio: float
    base_ratio: float
    rounds: list[dict]
    stop: str


def scored_tokens(total: int, gamma: int, tokens: int = EVAL_TOKENS) -> int:
    """Tokens scored at the end of sequences of `total` tokens: whole windows of gamma + 1, at most
    `tokens` (at least one window), leaving a context of at least gamma + 2."""
    w = gamma + 1
    n = min(max(1, tokens // w), (total - (gamma + 2)) // w)
    if n < 1:
        raise DustinError(f"windows of {total} tokens are too short to score a verification window of {w} tokens: "
                          "use a longer --context")
    return n * w


def nll_scorer(target, draft, cfg, sequences: list[list[int]], gamma: int, tokens: int = EVAL_TOKENS,
               prefill_chunk: int = 2048) -> Score:
    """`score(sets)`: NLL per token at the last offset of the verification windows (module docstring)
    over the last `scored_tokens` of `sequences`, under full attention (None) or dustin's set `cfg`
    refreshed at each set's layers (`()`: no refresh), in one teacher-forced run sharing the
    context's prefill (per `SETS_PER_PREFILL` sets)."""
    from dustin_runtime.sparse.policies import make_policy
    from dustin_runtime.sparse.teacher_forced import teacher_forced_nll

    context = len(sequences[0]) - scored_tokens(len(sequences[0]), gamma, tokens)

    def score(sets):
        out = []
        for i in range(0, len(sets), SETS_PER_PREFILL):
            hooks = [None if s is None else make_policy("dustin", replace(cfg, refresh_layers=tuple(sorted(s))),
                                                        target=target, draft=draft)
                     for s in sets[i: i + SETS_PER_PREFILL]]
            res = teacher_forced_nll(target, draft, sequences, context, gamma=gamma, hooks=hooks,
                                     prefill_chunk=prefill_chunk)
            out += [last_offset_nll(r, gamma) for r in res]
        return out

    return score


def last_offset_nll(res, gamma: int) -> float:
    """NLL per token at offset gamma of the windows (a window cut short has no last offset)."""
    n = sum(t // (gamma + 1) for t in res.tokens)
    return sum(o[gamma] for o in res.nll_by_offset) / max(n, 1)


def greedy_refresh(score: Score, candidates: Sequence[int], max_refresh: int,
                   min_gain: float | None = None) -> RefreshSearch:
    """Greedy refresh layers (module docstring). `rounds[0]` is the set without refresh; each later
    round lists every candidate's ppl ratio (to full attention) with chosen + {candidate}; ties go
    to the earlier layer."""
    min_gain = MIN_GAIN if min_gain is None else min_gain
    full, base = score([None, ()])
    rounds = [{"round": 0, "layers": [], "ppl_ratio": math.exp(base - full)}]
    chosen, best, stop = [], base, "max_refresh"
    while len(chosen) < max_refresh:
        cands = [c for c in candidates if c not in chosen]
        if not cands:
            stop = "no candidates"
            break
        nlls = score([tuple(sorted([*chosen, c])) for c in cands])
        i = min(range(len(cands)), key=lambda j: (nlls[j], cands[j]))
        gain = 1 - math.exp(nlls[i] - best)
        rounds.append({"round": len(rounds), "best": cands[i], "gain": gain,
                       "candidates": [{"layer": c, "ppl_ratio": math.exp(n - full)} for c, n in zip(cands, nlls,
                                                                                                    strict=True)]})
        if gain < min_gain:
            stop = "gain"
            break
        chosen.append(cands[i])
        best = nlls[i]
    return RefreshSearch(tuple(sorted(chosen)), math.exp(best - full), math.exp(base - full), rounds, stop)


def heldout_ratios(score: Score, layers: tuple[int, ...]) -> dict:
    """Perplexity ratios to full attention of dustin without refresh and with `layers`."""
    full, base, found = score([None, (), layers])
    return {"dustin": math.exp(base - full), "dustin + refresh": math.exp(found - full)}
