"""Bootstrap confidence intervals over evaluation windows (the unit that varies between books).

A statistic is a function of per-window arrays (e.g. summed NLL and token counts of a policy and of
full attention on the same windows); the bootstrap resamples windows with replacement, keeps the
pairing (one index draws the same window for every array), recomputes the statistic and reports
the percentile interval. Seeded, so a table is reproducible. Windows that share a book are not
independent: given `groups` (a label per window, e.g. its book), whole groups are resampled (a
cluster bootstrap); with one window per group that is the plain bootstrap, draw for draw."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95


def bootstrap(stat: Callable[..., float], *arrays: Sequence[float], resamples: int = RESAMPLES,
              level: float = LEVEL, seed: int = 0, groups: Sequence | None = None) -> tuple[float, float, float]:
    """(value, low, high): stat(*arrays) and the `level` percentile interval of stat over
    `resamples` paired resamples of the windows (the arrays' common first axis), or of the windows'
    `groups` (one label per window: each resample draws as many groups as there are, with
    replacement, and takes every window of each)."""
    xs = [np.asarray(a, dtype=np.float64) for a in arrays]
    n = len(xs[0])
    if n == 0 or any(len(x) != n for x in xs):
        raise ValueError(f"bootstrap needs arrays of one non-zero length, got {[len(x) for x in xs]}")
    if groups is not None and len(groups) != n:
        raise ValueError(f"bootstrap: {len(groups)} group labels for {n} windows")
    value = float(stat(*xs))
    members = None if groups is None else _members(groups)
    k = n if members is None else len(members)  # units drawn: windows, or groups of them
    draws = np.random.default_rng(seed).integers(0, k, size=(resamples, k))
    if k < n:  # some group holds several windows: each draw takes all of them (groups of one window each
        draws = (np.concatenate([members[g] for g in d]) for d in draws)  # are the windows in order: no mapping)
    boot = np.array([stat(*(x[i] for x in xs)) for i in draws])
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return value, float(lo), float(hi)


def _members(groups: Sequence) -> list[np.ndarray]:
    """Window indices of each group, groups in order of first appearance."""
    index: dict = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    return [np.array(v) for v in index.values()]


def ppl_ratio(nll: np.ndarray, tokens: np.ndarray, nll_ref: np.ndarray, tokens_ref: np.ndarray) -> float:
    """Perplexity over all scored tokens of the windows over the reference's on the same windows."""
    return float(np.exp(nll.sum() / tokens.sum() - nll_ref.sum() / tokens_ref.sum()))


def ratio_of_sums(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a) / sum(b): e.g. a policy's tokens per step over full verification's, pooled over windows."""
    return float(a.sum() / b.sum())


def mean(a: np.ndarray) -> float:
    return float(a.mean())
