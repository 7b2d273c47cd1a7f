"""Bootstrap confidence intervals over evaluation windows (the unit that varies between books).

A statistic is a function of per-window arrays (e.g. summed NLL and token counts of a policy and of
full attention on the same windows); the bootstrap resamples windows with replacement, keeps the
pairing (one index draws the same window for every array), recomputes the statistic and reports
the percentile interval. Seeded, so a table is reproducible."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95


def bootstrap(stat: Callable[..., float], *arrays: Sequence[float], resamples: int = RESAMPLES,
              level: float = LEVEL, seed: int = 0) -> tuple[float, float, float]:
    """(value, low, high): stat(*arrays) and the `level` percentile interval of stat over
    `resamples` paired resamples of the windows (the arrays' common first axis)."""
    xs = [np.asarray(a, dtype=np.float64) for a in arrays]
    n = len(xs[0])
    if n == 0 or any(len(x) != n for x in xs):
        raise ValueError(f"bootstrap needs arrays of one non-zero length, got {[len(x) for x in xs]}")
    value = float(stat(*xs))
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    boot = np.array([stat(*(x[i] for x in xs)) for i in idx])
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return value, float(lo), float(hi)


def ppl_ratio(nll: np.ndarray, tokens: np.ndarray, nll_ref: np.ndarray, tokens_ref: np.ndarray) -> float:
    """Perplexity over all scored tokens of the windows over the reference's on the same windows."""
    return float(np.exp(nll.sum() / tokens.sum() - nll_ref.sum() / tokens_ref.sum()))


def ratio_of_sums(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a) / sum(b): e.g. a policy's tokens per step over full verification's, pooled over windows."""
    return float(a.sum() / b.sum())


def mean(a: np.ndarray) -> float:
    return float(a.mean())
