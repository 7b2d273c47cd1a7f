"""`--window-grid`: the recent window chosen by teacher-forced perplexity after Algorithm 1 and the
refresh search, the profile that records it, and the plan that follows it."""

import io
import json
import math
from dataclasses import replace

import pytest
from rich.console import Console

from dustin_profile import refresh as rf
from dustin_profile.artifact import SCHEMA_VERSION, load_profile
from dustin_profile.plan import plan_sparse
from dustin_profile.run import ProfileConfig, run_profile
from dustin_profile.show import render
from dustin_profile.window import check_grid, choose_window
from dustin_runtime.errors import DustinError
from dustin_runtime.sparse.config import SparseConfig

GAMMA = 3
GRID = (4, 12, 30)


@pytest.fixture(scope="module")
def made(models, calib_text, tmp_path_factory):
    """A 3-layer target profiled with one refresh layer, then the window among GRID (search window 12)."""
    cfg = ProfileConfig(target=str(models["other"]), draft=str(models["draft"]),
                        out=str(tmp_path_factory.mktemp("window") / "p.json"), calib=(str(calib_text),), context=160,
                        windows=2, positions=2, budget=48, gamma=GAMMA, sinks=4, window=12, budgets=(24, 48),
                        max_heads=3, epsilon=0.0, m_points=5, heldout=1, max_refresh=1, window_grid=GRID)
    gain, rf.MIN_GAIN = rf.MIN_GAIN, -1.0  # keep a refresh layer whatever it gains, so candidates carry one
    try:
        return cfg, run_profile(cfg, console=Console(file=io.StringIO()))
    finally:
        rf.MIN_GAIN = gain


def test_choose_window_takes_the_lowest_nll_and_the_smaller_window_on_ties():
    configs = {w: SparseConfig(budget=64, window=w) for w in (32, 8, 16)}
    nll = {None: 2.0, 8: 2.3, 16: 2.1, 32: 2.1}
    seen = []

    def score(cfgs):
        seen.append([None if c is None else c.window for c in cfgs])
        return [nll[None if c is None else c.window] for c in cfgs]

    found = choose_window(score, configs)
    assert seen == [[None, 8, 16, 32]]  # full attention first, one call
    assert found.window == 16
    assert found.ratios == pytest.approx({8: math.exp(0.3), 16: math.exp(0.1), 32: math.exp(0.1)})


def test_check_grid():
    assert check_grid([64, 16, 64], 512, 4) == (16, 64)
    assert check_grid([0, 508], 512, 4) == (0, 508)
    for bad in ([509], [-1], []):
        with pytest.raises(DustinError) as e:
            check_grid(bad, 512, 4)
        assert "--window-grid" in str(e.value) and "\n" not in str(e.value)


def test_profile_records_the_window_search(made, tmp_path):
    cfg, res = made
    p, s = res.profile, res.profile.window_search
    assert p.schema_version == SCHEMA_VERSION == 8 and len(p.refresh_layers) == 1
    assert s["grid"] == list(GRID) and s["search_window"] == 12 and p.window == s["chosen"]
    assert set(s["ppl_ratio"]) == {"4", "12", "30"} == set(s["m"]) == set(s["arr"])
    assert s["chosen"] == min(GRID, key=lambda w: (s["ppl_ratio"][str(w)], w))
    assert p.m == s["m"][str(p.window)] and 0 <= p.m <= p.budget - p.sinks - p.window
    assert all(b >= p.sinks + p.window for b in p.m_by_budget)
    assert set(s["heldout"]["ppl_ratio"]) == {str(w) for w in {12, p.window}} and s["heldout"]["windows"] == 1
    assert "window" in p.calibration["run"]["seconds"]
    assert load_profile(res.path) == p
    assert plan_sparse("dustin", res.path, None, None, None).window == p.window
    out = io.StringIO()
    Console(file=out, width=400).print(*render(p))
    assert "recent window search" in out.getvalue() and f"chose {p.window}" in out.getvalue()


def test_recorded_ratios_are_the_chosen_configs_own_runs(made, loaded):
    """Each candidate scored in the shared run equals a teacher-forced run of its own config."""
    cfg, res = made
    p, s = res.profile, res.profile.window_search
    target, draft, _, seqs = loaded(cfg, p)
    kv = target.cfg.num_kv_heads
    score = rf.config_scorer(target, draft, seqs, cfg.gamma, rf.HEAD_EVAL_TOKENS, cfg.prefill_chunk, offsets="all")
    assert p.refresh_layers
    for w in (12, p.window):
        c = rf.with_refresh(p.to_sparse_config(window=w), p.refresh_layers, kv)
        c = replace(c, m=s["m"][str(w)])
        full, own = score([None, c])
        assert math.exp(own - full) == pytest.approx(s["ppl_ratio"][str(w)], rel=1e-6)


def test_without_a_grid_the_window_is_given(models, calib_text, tmp_path):
    cfg = ProfileConfig(target=str(models["other"]), draft=str(models["draft"]), out=str(tmp_path / "p.json"),
                        calib=(str(calib_text),), context=160, windows=1, positions=2, budget=48, gamma=GAMMA,
                        sinks=4, window=12, budgets=(48,), max_heads=2, epsilon=0.0, m_points=3)
    p = run_profile(cfg, console=Console(file=io.StringIO())).profile
    assert p.window == 12 and p.window_search == {}
    # no retrieval head (nothing gains ARR by 1): no dustin set to score, so neither search runs; both say why
    cfg = replace(cfg, epsilon=1.0, max_refresh=1, window_grid=GRID, out=str(tmp_path / "none.json"))
    p = run_profile(cfg, console=Console(file=io.StringIO())).profile
    assert not p.has_heads and p.window == 12 and p.refresh_layers == ()
    assert "no retrieval head" in p.window_search["skipped"] and "no retrieval head" in p.refresh_search["skipped"]
    assert load_profile(tmp_path / "none.json") == p
    out = io.StringIO()
    Console(file=out, width=300).print(*render(p))
    assert out.getvalue().count("not searched: Algorithm 1 chose no retrieval head") == 2


def test_schema_6_profiles_load_with_the_given_window(made, tmp_path):
    _, res = made
    d = json.loads(res.profile.to_json())
    d.pop("window_search")
    (tmp_path / "v6.json").write_text(json.dumps({**d, "schema_version": 6}))
    p = load_profile(tmp_path / "v6.json")
    assert p.window_search == {} and p.window == res.profile.window


def test_bad_window_grid_refused(models, calib_text, tmp_path, run_cli, assert_one_line_error):
    args = ("profile", "--target", models["other"], "--draft", models["draft"], "--calib", calib_text,
            "--context", "128", "--windows", "1", "--budget", "40", "--gamma", "2", "--sinks", "2", "--window", "8",
            "--budgets", "40", "--out", tmp_path / "p.json")
    assert_one_line_error(run_cli(*args, "--window-grid", "8,39"), "--window-grid", "[0, budget - sinks = 38]",
                          code=2)
    assert_one_line_error(run_cli(*args, "--window-grid", "-1"), "--window-grid: -1 is below 0", code=2)
    assert not (tmp_path / "p.json").exists()
