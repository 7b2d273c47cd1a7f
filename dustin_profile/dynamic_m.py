"""Dynamic m: the draft share m chosen per verification pass from what the signals say, against
Algorithm 1's fixed m, fitted on the calibration passes and scored on held-out ones.

ARR of every pass is known at every m of a grid (`arr_grid`), so the best any per-pass rule can
do is each pass's own best m (`oracle`, an upper bound). A rule maps one feature, known before the
selection, to m through a small table: the feature's quantile bins on the calibration passes, each
bin's m the one with the best mean ARR over the calibration passes in it. Features:
- `confidence`: the draft's mean probability of the tokens it drafted;
- `agreement`: sum_i min(d_i, t_i) of the normalised draft and target signals (1: the same ranking mass).
The draft signal is the chosen draft heads', or every draft KV head's when Algorithm 1 chose none
(a fixed m of 0 leaves nothing to vary). Each rule's held-out ARR is checked through
`select_indices` with one m per pass (`calib_arr.arr_exact`); the rank correlation of each feature
with the per-pass best m says whether any table could work."""

from __future__ import annotations

import torch

from dustin_profile.calib_arr import CalibStats, arr_exact, arr_grid
from dustin_profile.search import m_grid

BINS = (2, 3, 4)


def agreement(primary: torch.Tensor, secondary: torch.Tensor) -> torch.Tensor:
    """[P] overlap of the two signals [P, N], each scaled to sum 1: sum_i min(d_i, t_i) in [0, 1]."""
    d = primary / primary.sum(1, keepdim=True).clamp_min(1e-30)
    t = secondary / secondary.sum(1, keepdim=True).clamp_min(1e-30)
    return torch.minimum(d, t).sum(1)


def features(stats: CalibStats, primary: torch.Tensor, secondary: torch.Tensor) -> dict[str, torch.Tensor]:
    """{name: [P]} the features a rule may read (confidence only where it was recorded)."""
    out = {"agreement": agreement(primary, secondary)}
    if stats.confidence is not None:
        out["confidence"] = stats.confidence.float().mean(1)
    return out


def _weights(stats: CalibStats) -> torch.Tensor:
    P = stats.lengths.numel()
    return (torch.full((P,), 1.0 / P) if stats.weight is None else stats.weight.float().cpu()).double()


def rank_correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman's correlation of x and y [P] (ranks by stable sort: ties keep their order)."""
    def rank(v):
        return torch.sort(v.double(), stable=True).indices.argsort().double()

    return float(torch.corrcoef(torch.stack([rank(x), rank(y)]))[0, 1])


def fit_table(arrs: torch.Tensor, feature: torch.Tensor, weight: torch.Tensor, bins: int) -> tuple[list[float], list[int]]:
    """(bin edges [bins - 1], grid index of m per bin) from calibration ARR [K, P] and feature [P]:
    quantile edges, each bin's best mean ARR (an empty bin takes the overall best)."""
    edges = torch.quantile(feature.double(), torch.linspace(0, 1, bins + 1, dtype=torch.float64)[1:-1])
    which = torch.bucketize(feature.double(), edges)
    overall = int(torch.argmax(arrs @ weight))
    table = []
    for b in range(bins):
        w = weight * (which == b)
        table.append(int(torch.argmax(arrs @ w)) if w.sum() > 0 else overall)
    return edges.tolist(), table


def apply_table(arrs: torch.Tensor, feature: torch.Tensor, edges: list[float], table: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """([P] ARR, [P] grid index) of the rule on passes with ARR [K, P] and feature [P]."""
    which = torch.bucketize(feature.double(), torch.tensor(edges, dtype=torch.float64))
    k = torch.tensor(table)[which]
    return arrs.gather(0, k.view(1, -1))[0], k


def analyse(cal: CalibStats, held: CalibStats, signals: dict, *, budget: int, sinks: int, window: int,
            points: int = 37, chosen_draft: bool = True) -> dict:
    """Fixed m vs the per-pass oracle vs one table rule per feature and bin count (module docstring).
    signals: {"calibration": (primary, secondary), "heldout": (primary, secondary)}, each [P, N]."""
    free = budget - sinks - window
    ms = m_grid(free, points)
    grids, feats = {}, {}
    for name, st in (("calibration", cal), ("heldout", held)):
        prim, sec = signals[name]
        grids[name] = arr_grid(st, prim, sec, budget=budget, sinks=sinks, window=window, ms=ms).cpu()  # [K, P]
        feats[name] = {k: v.cpu() for k, v in features(st, prim, sec).items()}
    wc, wh = _weights(cal), _weights(held)
    k_fixed = int(torch.argmax(grids["calibration"] @ wc))
    out = {
        "draft_signal": "chosen draft heads" if chosen_draft else "every draft KV head",
        "m_grid": ms,
        "fixed": {"m": ms[k_fixed], "calibration": float(grids["calibration"][k_fixed] @ wc),
                  "heldout": float(grids["heldout"][k_fixed] @ wh)},
        "oracle": {"calibration": float(grids["calibration"].max(0).values @ wc),
                   "heldout": float(grids["heldout"].max(0).values @ wh)},
        "rules": [],
    }
    prim, sec = signals["heldout"]
    for fname in feats["calibration"]:
        for bins in BINS:
            edges, table = fit_table(grids["calibration"], feats["calibration"][fname], wc, bins)
            got_c, _ = apply_table(grids["calibration"], feats["calibration"][fname], edges, table)
            got_h, k = apply_table(grids["heldout"], feats["heldout"][fname], edges, table)
            m_row = torch.tensor(ms, dtype=torch.int32)[k]
            exact = arr_exact(held, prim, sec, budget=budget, sinks=sinks, window=window, m=m_row)
            out["rules"].append({
                "feature": fname, "bins": bins, "edges": edges, "m": [ms[i] for i in table],
                "calibration": float(got_c @ wc), "heldout": float(got_h @ wh),
                "heldout_select_indices": float(exact.double().cpu() @ wh),
            })
    best_m = torch.cat([grids["calibration"].argmax(0), grids["heldout"].argmax(0)]).double()  # [P_c + P_h]
    out["best_m_rank_correlation"] = {f: rank_correlation(torch.cat([feats["calibration"][f], feats["heldout"][f]]),
                                                          best_m) for f in feats["calibration"]}
    best = max(out["rules"], key=lambda r: r["calibration"])  # chosen on calibration, reported held out
    out["best_rule"] = {k: best[k] for k in ("feature", "bins")}
    out["heldout_gain"] = best["heldout"] - out["fixed"]["heldout"]
    out["oracle_heldout_gain"] = out["oracle"]["heldout"] - out["fixed"]["heldout"]
    return out
