"""The recent window (`--window-grid W1,W2,...`): after Algorithm 1 and the refresh search, the number
of most recent rows always in the set is chosen among the grid by teacher-forced perplexity through
dustin's set (the refresh head search's objective: every offset of the verification windows over
the last `refresh.HEAD_EVAL_TOKENS` of each calibration window), the budget fixed. Each candidate
keeps the profile's heads and refresh layers; its m is Algorithm 1's best m at that window
(`search.budget_sweep`). Measured (H200, SmolLM2 pair, S = 512, refresh layers 5 and 17, 16 calibration
windows x 1024 at 4k, probes/window_sweep.sh): ratios 1.0301 / 1.0292 / 1.0275 / 1.0259 / 1.0332 /
1.0416 at windows 16 / 64 / 128 / 256 / 384 / 448: the selected rows are worth more than recent ones
only beyond ~256 of 512."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dustin_profile.refresh import ConfigScore
from dustin_runtime.errors import DustinError
from dustin_runtime.sparse.config import SparseConfig


@dataclass(frozen=True)
class WindowSearch:
    """The chosen window and every candidate's perplexity ratio to full attention."""

    window: int
    ratios: dict[int, float]


def check_grid(grid: Sequence[int], budget: int, sinks: int) -> tuple[int, ...]:
    """The grid ascending without repeats; every window >= 0 and <= budget - sinks."""
    bad = [w for w in grid if not 0 <= w <= budget - sinks]
    if bad or not grid:
        raise DustinError(f"--window-grid: windows must be in [0, budget - sinks = {budget - sinks}], got "
                          f"{list(grid) if grid else 'none'}")
    return tuple(sorted(set(grid)))


def choose_window(score: ConfigScore, configs: dict[int, SparseConfig]) -> WindowSearch:
    """The window whose config gives the lowest NLL (ties: the smaller window), scored beside full
    attention in one call."""
    wins = sorted(configs)
    full, *nlls = score([None, *(configs[w] for w in wins)])
    i = min(range(len(wins)), key=lambda j: (nlls[j], wins[j]))
    return WindowSearch(wins[i], {w: math.exp(n - full) for w, n in zip(wins, nlls, strict=True)})
