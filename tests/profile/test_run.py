"""`run_profile` end to end on tiny models: artifact, tables, plots, round trip, resume, determinism."""

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from dustin_profile.artifact import SCHEMA_VERSION, load_profile
from dustin_profile.run import ProfileConfig, run_profile
from dustin_runtime.errors import DustinError


def config(models, calib_text, out, **kw):
    base = dict(target=str(models["target"]), draft=str(models["draft"]), out=str(out), calib=(str(calib_text),),
                context=160, windows=2, positions=2, budget=48, gamma=3, sinks=4, window=12, budgets=(24, 48, 96),
                max_heads=3, epsilon=0.0, m_points=5)
    return ProfileConfig(**{**base, **kw})


def quiet():
    return Console(file=io.StringIO())


@pytest.fixture(scope="module")
def first(models, calib_text, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "p.json"
    cfg = config(models, calib_text, out)
    return cfg, run_profile(cfg, command="test", console=quiet())


def test_artifact_tables_plots_and_round_trip(first):
    cfg, res = first
    prof, path = res.profile, res.path
    assert res.recorded == 2
    assert prof.schema_version == SCHEMA_VERSION and prof.budget == 48 and prof.gamma == 3
    assert prof.target.num_layers == 2 and prof.draft.num_layers == 1 and prof.draft.num_kv_heads == 1
    assert 1 <= len(prof.draft_heads) + len(prof.target_heads) <= 3
    assert set(prof.m_by_budget) == {24, 48, 96} and prof.m_by_budget[48] == prof.m
    assert set(prof.arr_baselines) == {"streamingllm", "draft-only", "target-only", "quest", "oracle", "layer-oracle"}
    assert 0 < prof.arr <= prof.arr_baselines["oracle"] + 1e-6
    assert prof.calibration["context"] == 160 and len(prof.calibration["windows"]) == 2
    assert 0 < prof.online_cost["share"] < 1
    mem = prof.calibration["run"]["memory"]  # the plan made before loading; no peak on CPU
    assert mem["peak_bytes"] is None and mem["plan"]["settings"] == {"tp": 1, "context": 160, "windows": 2}
    assert mem["plan"]["total_bytes"] == sum(mem["plan"]["bytes"].values()) > 0
    for name in ("rounds", "candidates", "budgets", "layers", "plot_complementarity", "plot_rounds", "plot_budget"):
        assert (path.parent / prof.tables[name]).stat().st_size > 0, name
    text = path.read_text()
    assert load_profile(path).to_json() == text
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION


def test_resume_and_determinism(first, models, calib_text, tmp_path):
    cfg, res = first
    again = run_profile(cfg, console=quiet())
    assert again.recorded == 0
    fresh = run_profile(replace(cfg, out=str(tmp_path / "q.json")), console=quiet())
    assert fresh.recorded == 2
    for r in (again, fresh):
        p = r.profile
        assert (p.draft_heads, p.target_heads, p.m, p.arr, p.arr_baselines) == (
            res.profile.draft_heads, res.profile.target_heads, res.profile.m, res.profile.arr, res.profile.arr_baselines)
        assert p.calibration["sha256"] == res.profile.calibration["sha256"]
    other_seed = run_profile(replace(cfg, out=str(tmp_path / "s.json"), seed=1, windows=1), console=quiet())
    assert other_seed.profile.calibration["sha256"] != res.profile.calibration["sha256"]


def test_heldout_windows(first, tmp_path):
    """--heldout-windows: the calibration windows (resumed) and the set are those of the run without
    them; the held-out window is recorded and scored."""
    import shutil

    cfg, res = first
    shutil.copytree(Path(res.path).with_suffix(".work"), tmp_path / "g.work", ignore=shutil.ignore_patterns(".lock"))
    g = run_profile(replace(cfg, out=str(tmp_path / "g.json"), heldout=1), console=quiet())
    assert g.recorded == 1  # the held-out window only
    p, q = g.profile, res.profile
    assert (p.draft_heads, p.target_heads, p.m, p.arr) == (q.draft_heads, q.target_heads, q.m, q.arr)
    assert p.calibration["sha256"] == q.calibration["sha256"] and len(p.heldout["windows"]) == 1
    held = p.heldout
    assert held["passes"] == 2 and {"dustin", "oracle", "layer-oracle"} <= set(held["arr"])
    assert load_profile(g.path) == p


def test_retrieval_windows_are_appended_and_resumed(first, tmp_path):
    cfg, _ = first
    rcfg = replace(cfg, out=str(tmp_path / "r.json"), windows=1, retrieval=1)
    res = run_profile(rcfg, console=quiet())
    assert res.recorded == 2
    wins = res.profile.calibration["windows"]
    assert [w["source"].startswith("retrieval:") for w in wins] == [False, True]
    assert res.profile.calibration["retrieval_windows"] == 1
    more = run_profile(replace(rcfg, retrieval=2), console=quiet())
    assert more.recorded == 1  # the prose window and the first retrieval episode are resumed


def test_other_arguments_refused_then_restart(first, tmp_path):
    cfg, _ = first
    out = tmp_path / "r.json"
    run_profile(replace(cfg, out=str(out), windows=1), console=quiet())
    with pytest.raises(DustinError, match=r"other settings \(gamma: 3 -> 2\).*--restart"):
        run_profile(replace(cfg, out=str(out), windows=1, gamma=2), console=quiet())
    res = run_profile(replace(cfg, out=str(out), windows=1, gamma=2), console=quiet(), restart=True)
    assert res.recorded == 1 and res.profile.gamma == 2
    more = run_profile(replace(cfg, out=str(out), windows=2, gamma=2), console=quiet())
    assert more.recorded == 1  # the first window is resumed


def test_bad_settings_refused(models, calib_text, tmp_path):
    with pytest.raises(DustinError, match="must be >= --sinks"):
        run_profile(config(models, calib_text, tmp_path / "x.json", budget=10), console=quiet())
    with pytest.raises(DustinError, match="exceeds"):
        run_profile(config(models, calib_text, tmp_path / "x.json", context=600), console=quiet())


def test_show_renders_and_markdown(first):
    from dustin_profile.show import markdown, render

    _, res = first
    md = markdown(res.profile, res.path.parent)
    for needle in ("| **dustin** |", "| streamingllm |", "| quest |", "| oracle |", "S = 96", "| round |"):
        assert needle in md, needle
    assert len(render(res.profile, res.path.parent)) >= 5


def test_retrieval_pass_weights():
    import torch

    from dustin_profile.run import stack_windows

    def rec(P=3, N=8):
        return {"lengths": torch.full((P,), N), "attn": torch.rand(P, N),
                "draft": torch.rand(1, P, N), "target": torch.rand(2, P, N), "layer_attn": torch.rand(P, 2, N),
                "quest": torch.rand(P, 2, 1)}

    recs = [rec(), rec(), rec()]
    plain = stack_windows(recs, (8,))
    assert plain.weight is None and torch.allclose(plain.average(torch.arange(9.0)), torch.tensor(4.0))
    st = stack_windows(recs, (8,), retrieval=1, retrieval_weight=0.6)
    w = st.weight  # the last window's first pass asks the question: 0.6; the 8 others share 0.4
    assert torch.allclose(w.sum(), torch.tensor(1.0)) and w[6] == pytest.approx(0.6)
    assert torch.allclose(w[[0, 1, 2, 3, 4, 5, 7, 8]], torch.full((8,), 0.05))
    x = torch.zeros(9)
    x[6] = 1.0
    assert float(st.average(x)) == pytest.approx(0.6)
    ft = stack_windows(recs, (8,), retrieval=1, retrieval_weight=0.6, facts=[(2, 6)])
    assert torch.equal(ft.attn[6], torch.tensor([0, 0, 0.25, 0.25, 0.25, 0.25, 0, 0]))
    assert torch.equal(ft.attn[:6], st.attn[:6]) and torch.equal(st.attn[6], recs[2]["attn"][0])  # inputs untouched
    assert torch.equal(ft.layer_attn[6, 1], ft.attn[6]) and torch.equal(ft.layer_attn[:6], st.layer_attn[:6])
