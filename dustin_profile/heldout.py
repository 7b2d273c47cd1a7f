"""What a profile found, scored on held-out calibration windows (recorded like the others, never
searched on): the single set, the layer groups, every baseline and dynamic m against fixed m."""

from __future__ import annotations

from dustin_profile.baselines import baseline_arrs
from dustin_profile.calib_arr import CalibStats, arr_grid
from dustin_profile.candidates import Candidate
from dustin_profile.dynamic_m import analyse
from dustin_profile.groups import Group, GroupsResult, LayerAttention
from dustin_profile.search import SearchResult, signal_sums


def set_arr(stats: CalibStats, cands: list[Candidate], chosen: list[int], m: int, budget: int, sinks: int,
            window: int) -> float:
    """Mean ARR of the runtime's set of heads `chosen` at m over the passes of `stats`."""
    prim, sec = signal_sums(stats, cands, chosen)
    return float(stats.average(arr_grid(stats, prim, sec, budget=budget, sinks=sinks, window=window, ms=[m])[0]))


def groups_arr(stats: CalibStats, cands: list[Candidate], groups: list[Group], budget: int, sinks: int,
               window: int) -> float:
    """Layer-weighted ARR of the groups' sets over the passes of `stats` (each group's set under its
    layers' mean attention)."""
    la = LayerAttention(stats)
    return sum((g.stop - g.start) / la.layers
               * set_arr(la.stats_of(g.start, g.stop), cands, g.search.chosen, g.sweep[budget][1], budget, sinks,
                         window)
               for g in groups)


def heldout_figures(cal: CalibStats, held: CalibStats, cands: list[Candidate], single: SearchResult, m: int,
                    groups: GroupsResult | None, *, budget: int, sinks: int, window: int, m_points: int) -> dict:
    """{"passes", "arr": {method: ARR on the held-out passes}, "groups": {K: ARR of the best K groups
    found} for every K tried, "dynamic_m": `dynamic_m.analyse`}."""
    arr = {"dustin": set_arr(held, cands, single.chosen, m, budget, sinks, window)}
    by_k = {}
    if groups is not None:
        by_k = {str(k): groups_arr(held, cands, gs, budget, sinks, window) for k, gs in groups.tried.items()}
        if len(groups.groups) > 1:
            arr["dustin (groups)"] = by_k[str(len(groups.groups))]
    arr.update(baseline_arrs(held, budget, sinks, window))
    nd = cal.draft.shape[0]
    chosen_draft = [c for c in single.chosen if c < nd]
    signals = {}
    for name, st in (("calibration", cal), ("heldout", held)):
        prim, sec = signal_sums(st, cands, single.chosen)
        signals[name] = (prim if chosen_draft else st.draft.sum(0), sec)
    dyn = analyse(cal, held, signals, budget=budget, sinks=sinks, window=window,
                  points=max(m_points, 37), chosen_draft=bool(chosen_draft))
    return {"passes": int(held.lengths.numel()), "arr": arr, **({"groups": by_k} if by_k else {}), "dynamic_m": dyn}
