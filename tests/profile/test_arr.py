"""ARR: the fast grid evaluation equals the runtime's `select_indices`; ARR is monotone in the
budget and 1 when the budget covers the context."""

import pytest
import torch

from dustin_profile import baselines
from dustin_profile.calib_arr import arr_exact, arr_grid
from dustin_profile.search import budget_sweep


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("budget,sinks,window", [(64, 4, 16), (97, 0, 8), (128, 3, 0), (40, 4, 36)])
def test_grid_matches_select_indices(ties, budget, sinks, window, random_stats):
    st = random_stats(lengths=[300, 293, 120, 97, 64, 41], ties=ties, seed=3)
    prim, sec = st.draft.sum(0), st.target[:2].sum(0)
    free = budget - sinks - window
    ms = sorted({m for m in (0, 1, free // 3, free // 2, free) if m <= free})
    grid = arr_grid(st, prim, sec, budget=budget, sinks=sinks, window=window, ms=ms)
    for k, m in enumerate(ms):
        exact = arr_exact(st, prim, sec, budget=budget, sinks=sinks, window=window, m=m)
        torch.testing.assert_close(grid[k], exact, atol=1e-6, rtol=0)


def test_grid_with_absent_signals_matches_select_indices(random_stats):
    st = random_stats(seed=5)
    for prim, sec, m in ((None, st.target.sum(0), 0), (st.draft.sum(0), None, 60), (None, None, 0)):
        grid = arr_grid(st, prim, sec, budget=80, sinks=4, window=16, ms=[m])[0]
        torch.testing.assert_close(grid, arr_exact(st, prim, sec, budget=80, sinks=4, window=16, m=m), atol=1e-6, rtol=0)


def test_arr_monotone_in_budget_and_one_when_budget_covers_context(random_stats, cands):
    st = random_stats(seed=1)
    st.quest = None
    prim, sec = st.draft.sum(0), st.target.sum(0)
    budgets = [24, 32, 50, 64, 100, 160, 256, 300, 400]
    for m in (0, 4):
        curve = [float(arr_grid(st, prim, sec, budget=b, sinks=4, window=16, ms=[m]).mean()) for b in budgets]
        assert all(b >= a - 1e-7 for a, b in zip(curve, curve[1:], strict=False)), curve
        assert curve[-1] == pytest.approx(1.0, abs=1e-5)
        assert curve[0] < 0.9
    for name, fn in (("streamingllm", lambda b: baselines.streamingllm(st, b, 4)),
                     ("oracle", lambda b: baselines.oracle(st, b)),
                     ("draft-only", lambda b: baselines.draft_only(st, b, 4, 16)),
                     ("target-only", lambda b: baselines.target_only(st, b, 4, 16))):
        curve = [float(fn(b).mean()) for b in budgets]
        assert all(b >= a - 1e-7 for a, b in zip(curve, curve[1:], strict=False)), (name, curve)
        assert curve[-1] == pytest.approx(1.0, abs=1e-5), name
    sweep = budget_sweep(st, cands(3, 5), [0, 4], budgets, 4, 16, m_points=5)
    curve = [sweep[b][0] for b in budgets]
    assert all(b >= a - 1e-7 for a, b in zip(curve, curve[1:], strict=False)), curve
    assert curve[-1] == pytest.approx(1.0, abs=1e-5)


def test_oracle_bounds_every_shared_set(random_stats):
    st = random_stats(seed=2)
    o = baselines.oracle(st, 64)
    for m in (0, 10, 44):
        assert (arr_grid(st, st.draft.sum(0), st.target.sum(0), budget=64, sinks=4, window=16, ms=[m])[0] <= o + 1e-6).all()
    assert (baselines.streamingllm(st, 64, 4) <= o + 1e-6).all()
