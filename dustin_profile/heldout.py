"""What a profile found, scored on held-out calibration windows (recorded like the others, never
searched on): the set and every baseline."""

from __future__ import annotations

from dustin_profile.baselines import baseline_arrs
from dustin_profile.calib_arr import CalibStats, arr_grid
from dustin_profile.candidates import Candidate
from dustin_profile.search import SearchResult, signal_sums


def set_arr(stats: CalibStats, cands: list[Candidate], chosen: list[int], m: int, budget: int, sinks: int,
            window: int) -> float:
    """Mean ARR of the runtime's set of heads `chosen` at m over the passes of `stats`."""
    prim, sec = signal_sums(stats, cands, chosen)
    return float(stats.average(arr_grid(stats, prim, sec, budget=budget, sinks=sinks, window=window, ms=[m])[0]))


def heldout_figures(held: CalibStats, cands: list[Candidate], single: SearchResult, m: int,
                    *, budget: int, sinks: int, window: int) -> dict:
    """{"passes", "arr": {method: ARR on the held-out passes}}."""
    arr = {"dustin": set_arr(held, cands, single.chosen, m, budget, sinks, window)}
    arr.update(baseline_arrs(held, budget, sinks, window))
    return {"passes": int(held.lengths.numel()), "arr": arr}
