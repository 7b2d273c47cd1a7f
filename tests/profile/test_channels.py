"""Score channels (`--score-channels`): the criterion finds a planted channel pair, `choose` keeps the
top r per layer and KV head, the profile records and validates the table, and the runtime config
and the refresh search use it."""

import io
import json

import pytest
import torch
from rich.console import Console

from dustin_profile import calibration as cal
from dustin_profile import channels as chs
from dustin_profile.artifact import ModelInfo, load_profile
from dustin_profile.run import ProfileConfig, run_profile
from dustin_runtime import pipeline
from dustin_runtime.errors import DustinError

from .profile_cases import profile

GAMMA = 3


def test_choose_keeps_the_top_r_ascending():
    crit = torch.zeros(2, 3, 8, dtype=torch.float64)
    crit[0, 0, [6, 1, 3]] = torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)
    crit[1, 2, 7] = 5.0
    ch = chs.choose(crit + 1e-3 * torch.arange(8), 2)
    assert ch[0][0] == (1, 6) and ch[1][2][1] == 7 and len(ch) == 2 and all(len(c) == 2 for lay in ch for c in lay)
    one = torch.zeros(1, 1, 8, dtype=torch.float64)
    one[0, 0] = torch.tensor([4.0, 0, 0, 3.0, 0, 0, 2.0, 1.0], dtype=torch.float64)
    assert chs.kept_share(one, chs.choose(one, 2)) == pytest.approx(0.7)  # (4 + 3) / 10
    assert chs.kept_share(one, chs.choose(one, 8)) == pytest.approx(1.0)
    for r in (0, 9):
        with pytest.raises(DustinError, match="choose 1..8"):
            chs.choose(crit, r)


@pytest.fixture(scope="module")
def tiny_target(models):
    return pipeline.load(str(models["other"]), dtype=torch.float32, device="cpu")


def test_criterion_finds_a_planted_channel_pair(tiny_target, calib_text):
    """Layer 1, KV head 1's key channels c and c + D/2 (one RoPE pair) scaled by 8 before RoPE: their
    keys vary 64x more, so with r = 2 exactly that pair is chosen there; other layers keep theirs."""
    model = tiny_target.model
    c = model.cfg
    D, c0 = c.head_dim, 1
    docs = cal.read_documents((str(calib_text),), "text")
    wins = [list(w.tokens) for w in cal.cut_windows(tiny_target.tokenizer, docs, 2, 100, 0)]
    before = chs.choose(chs.channel_stats(model, wins, 96), 2)
    w = model.layers[1].attn.wqkv.weight
    rows = [c.q_size + 1 * D + c0, c.q_size + 1 * D + c0 + D // 2]
    saved = w.data[rows].clone()
    try:
        with torch.no_grad():
            w.data[rows] *= 8
        crit = chs.channel_stats(model, wins, 96)
    finally:
        with torch.no_grad():
            w.data[rows] = saved
    after = chs.choose(crit, 2)
    assert after[1][1] == (c0, c0 + D // 2) and before[1][1] != after[1][1]
    assert after[0] == before[0] and crit.shape == (c.num_layers, c.num_kv_heads, D) and (crit >= 0).all()
    double = chs.channel_stats(model, wins + wins, 96)
    assert torch.allclose(double, 2 * chs.channel_stats(model, wins, 96), rtol=1e-9)


def table(L=2, G=2, r=3):
    return tuple(tuple(tuple(range(g, g + r)) for g in range(G)) for _ in range(L))


def test_profile_round_trip_and_runtime_config(tmp_path):
    p = profile(score_channels=table(), channel_search={"r": 3})
    p.save(tmp_path / "p.json")
    q = load_profile(tmp_path / "p.json")
    assert q == p and q.schema_version == 8
    cfg = q.to_sparse_config()
    assert cfg.score_channels == table() and cfg.channels_r == 3
    assert profile().to_sparse_config().score_channels == ()


@pytest.mark.parametrize("change", [
    lambda d: d.update(score_channels=[[[0, 1]], [[0, 1], [2, 3]]]),  # one KV head short
    lambda d: d.update(score_channels=[[[0, 1], [2, 3]]]),  # one layer short
    lambda d: d.update(score_channels=[[[0, 1], [2, 8]], [[0, 1], [2, 3]]]),  # channel past head dim 8
    lambda d: d.update(score_channels=[[[0, 0], [2, 3]], [[0, 1], [2, 3]]]),  # repeated
    lambda d: d.update(score_channels=[[[0, 1], [2]], [[0, 1], [2, 3]]]),  # ragged r
    lambda d: d.update(score_channels=[[[0, True], [2, 3]], [[0, 1], [2, 3]]]),  # not an int
    lambda d: d.update(score_channels={"r": 2}),
])
def test_bad_channel_tables_refused(tmp_path, change):
    d = json.loads(profile(score_channels=table(r=2)).to_json())
    change(d)
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(DustinError) as e:
        load_profile(tmp_path / "p.json")
    assert "score_channels must be [2 layers][2 KV heads][r]" in str(e.value) and "\n" not in str(e.value)


def test_profile_run_chooses_channels_before_the_refresh_search(models, calib_text, tmp_path):
    cfg = ProfileConfig(target=str(models["other"]), draft=str(models["draft"]), out=str(tmp_path / "p.json"),
                        calib=(str(calib_text),), context=160, windows=2, positions=2, budget=48, gamma=GAMMA,
                        sinks=4, window=12, budgets=(48,), max_heads=3, epsilon=0.0, m_points=5, max_refresh=1,
                        score_channels=3)
    res = run_profile(cfg, console=Console(file=io.StringIO()))
    p = res.profile
    info: ModelInfo = p.target
    assert len(p.score_channels) == info.num_layers and all(len(lay) == info.num_kv_heads for lay in p.score_channels)
    assert {len(c) for lay in p.score_channels for c in lay} == {3}
    cs = p.channel_search
    assert cs["r"] == 3 and cs["windows"] == 2 and 3 / info.head_dim < cs["kept_share"] <= 1.0
    assert "channels" in p.calibration["run"]["seconds"] and load_profile(res.path) == p
    from dustin_profile.show import render

    out = Console(file=io.StringIO(), width=200)
    for r in render(p, res.path.parent):
        out.print(r)
    assert "score channels" in out.file.getvalue() and "3 of 8 per layer and KV head" in out.file.getvalue()


def test_bad_score_channels_refused(models, calib_text, tmp_path, run_cli, assert_one_line_error):
    args = ("profile", "--target", models["other"], "--draft", models["draft"], "--calib", calib_text,
            "--context", "128", "--windows", "1", "--budget", "40", "--gamma", "2", "--sinks", "2", "--window", "8",
            "--budgets", "40", "--out", tmp_path / "p.json")
    assert_one_line_error(run_cli(*args, "--score-channels", "9"), "--score-channels 9 exceeds", "head dim 8", code=2)
    assert not (tmp_path / "p.json").exists()
