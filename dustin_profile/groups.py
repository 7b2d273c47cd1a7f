"""Per-layer-group verification sets: the target's layers split into K contiguous groups, each
with its own retrieval heads, m and [B, S] set, chosen on the recorded per-layer attention.

A group's set serves every layer of the group, so by linearity its ARR over those layers is the
ARR of the set under the group's mean context attention (the mean of the layers' A), and the
whole profile's ARR (layer-weighted) is sum_g (layers of g / Lt) ARR_g: the mean over layers of
each layer's ARR under its group's set, the runtime meter's per-layer ARR.

The groups (`search_groups`): for K = 1, 2, ..., max_groups, dynamic programming over contiguous
segments picks the K segments that maximise the layer-weighted oracle ARR (the top-S rows of each
segment's mean A); Algorithm 1 (`search.greedy_search`) then runs on each segment's A. K grows
while the whole-profile ARR gains at least epsilon. K = 1 is the single set of today's profiles;
with K = Lt the oracle term is the per-layer oracle (`baselines.layer_oracle`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from dustin_profile.baselines import oracle
from dustin_profile.calib_arr import CalibStats
from dustin_profile.candidates import Candidate
from dustin_profile.search import SearchConfig, SearchResult, budget_sweep, greedy_search


class LayerAttention:
    """Mean context attention of any contiguous range of target layers, from prefix sums over the
    recorded per-layer A (fp64). The whole range is the recorded all-layer A itself (`stats.attn`),
    so one group reproduces the single-set figures exactly."""

    def __init__(self, stats: CalibStats):
        la = stats.layer_attn.double().transpose(0, 1)  # [Lt, P, N]
        self.stats, self.layers = stats, la.shape[0]
        self.prefix = torch.cat([torch.zeros_like(la[:1]), la.cumsum(0)])  # [Lt + 1, P, N]

    def mean(self, start: int, stop: int) -> torch.Tensor:
        """[P, N] fp32: the mean of the layers' A over [start, stop)."""
        if (start, stop) == (0, self.layers):
            return self.stats.attn
        return ((self.prefix[stop] - self.prefix[start]) / (stop - start)).float()

    def stats_of(self, start: int, stop: int) -> CalibStats:
        """The calibration statistics with the range's A as the attention that ARR counts."""
        return replace(self.stats, attn=self.mean(start, stop))


def segment_oracles(la: LayerAttention, budget: int) -> dict[tuple[int, int], float]:
    """{(start, stop): mean over passes of the oracle ARR of the segment's A} for every segment."""
    n = la.layers
    return {(a, b): float(la.stats.average(oracle(la.stats_of(a, b), budget)))
            for a in range(n) for b in range(a + 1, n + 1)}


def best_segments(oracles: dict[tuple[int, int], float], layers: int, k: int) -> tuple[list[tuple[int, int]], float]:
    """The k contiguous segments of [0, layers) maximising sum (stop - start) / layers x oracle:
    (segments in layer order, that layer-weighted oracle ARR). Ties go to the earlier boundary."""
    if not 1 <= k <= layers:
        raise ValueError(f"{k} groups of {layers} layers")
    n = layers
    best = [[float("-inf")] * (n + 1) for _ in range(k + 1)]  # best[j][b]: j segments covering [0, b)
    arg = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for b in [n] if j == k else range(j, n):
            for a in [0] if j == 1 else range(j - 1, b):
                v = best[j - 1][a] + (b - a) / n * oracles[(a, b)]
                if v > best[j][b] + 1e-15:
                    best[j][b], arg[j][b] = v, a
    segs, b = [], n
    for j in range(k, 0, -1):
        a = arg[j][b]
        segs.append((a, b))
        b = a
    return segs[::-1], best[k][n]


@dataclass
class Group:
    """One group: target layers [start, stop), Algorithm 1 on their A, and its best m at each budget."""

    start: int
    stop: int
    search: SearchResult
    sweep: dict[int, tuple[float, int]]  # budget -> (ARR over the group's layers, m)


@dataclass
class GroupsResult:
    groups: list[Group]
    arr: float  # whole-profile ARR (layer-weighted) at the search budget
    trials: list[dict] = field(default_factory=list)  # per K: segments, oracle, ARR
    stop: str = "max_groups"  # "max_groups" | "epsilon" | "layers"
    tried: dict[int, list[Group]] = field(default_factory=dict)  # the groups of every K tried

    def arr_at(self, budget: int, layers: int) -> float:
        """The layer-weighted ARR of the groups at `budget`."""
        return sum((g.stop - g.start) / layers * g.sweep[budget][0] for g in self.groups)


def search_groups(stats: CalibStats, cands: list[Candidate], cfg: SearchConfig, budgets: list[int],
                  max_groups: int, single: SearchResult | None = None, progress=None) -> GroupsResult:
    """Grow the number of groups from 1 while the whole-profile ARR gains at least cfg.epsilon, up
    to max_groups (module docstring). `single`: the search already run on all layers (reused for
    K = 1). `progress(K, segment, segments)` is called before each segment's search."""
    la = LayerAttention(stats)
    n = la.layers
    oracles = (segment_oracles(la, cfg.budget) if max_groups > 1
               else {(0, n): float(stats.average(oracle(stats, cfg.budget)))})
    cache: dict[tuple[int, int], Group] = {}

    def group(a: int, b: int) -> Group:
        if (a, b) not in cache:
            s = la.stats_of(a, b)
            res = single if (a, b) == (0, n) and single is not None else greedy_search(s, cands, cfg)
            sweep = budget_sweep(s, cands, res.chosen, budgets, cfg.sinks, cfg.window, cfg.m_points)
            cache[(a, b)] = Group(a, b, res, sweep)
        return cache[(a, b)]

    best: GroupsResult | None = None
    trials, tried = [], {}
    stop = "max_groups"
    for k in range(1, min(max_groups, n) + 1):
        segs, orc = best_segments(oracles, n, k)
        groups = []
        for i, (a, b) in enumerate(segs):
            if progress is not None:
                progress(k, i + 1, len(segs))
            groups.append(group(a, b))
        arr = sum((g.stop - g.start) / n * g.sweep[cfg.budget][0] for g in groups)
        tried[k] = groups
        trials.append({"groups": k, "segments": [list(s) for s in segs], "oracle": orc, "arr": arr,
                       "heads": sum(len(g.search.chosen) for g in groups)})
        if best is not None and arr - best.arr < cfg.epsilon:
            stop = "epsilon"
            break
        best = GroupsResult(groups, arr)
    else:
        stop = "layers" if max_groups > n else "max_groups"
    best.trials, best.stop, best.tried = trials, stop, tried
    return best
