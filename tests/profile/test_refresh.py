"""`--max-refresh`: the greedy refresh-layer search by teacher-forced perplexity, the profile that
records its layers, and the runtime's dustin plan that follows them (unless told otherwise)."""

import io
import json
import math
from dataclasses import replace

import pytest
import torch
from rich.console import Console

from dustin_profile import refresh as rf
from dustin_profile.artifact import SCHEMA_VERSION, load_profile
from dustin_profile.plan import plan_runs, plan_sparse
from dustin_profile.run import ProfileConfig, run_profile
from dustin_runtime import pipeline
from dustin_runtime.errors import DustinError
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.sparse.teacher_forced import teacher_forced_nll

GAMMA = 3


def config(models, calib_text, out, **kw):
    base = dict(target=str(models["other"]), draft=str(models["draft"]), out=str(out), calib=(str(calib_text),),
                context=160, windows=2, positions=2, budget=48, gamma=GAMMA, sinks=4, window=12, budgets=(24, 48),
                max_heads=3, epsilon=0.0, m_points=5, heldout=1, max_refresh=2)
    return ProfileConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def made(models, calib_text, tmp_path_factory):
    """A 3-layer target profiled with --max-refresh 2 and one held-out window."""
    cfg = config(models, calib_text, tmp_path_factory.mktemp("refresh") / "p.json")
    return cfg, run_profile(cfg, console=Console(file=io.StringIO()))


@pytest.fixture(scope="module")
def setup(made, loaded):
    cfg, res = made
    return loaded(cfg, res.profile)


def test_profile_records_the_search(made):
    cfg, res = made
    p = res.profile
    assert p.schema_version == SCHEMA_VERSION == 8
    s = p.refresh_search
    assert len(p.refresh_layers) <= cfg.max_refresh and all(0 <= x < 3 for x in p.refresh_layers)
    assert list(p.refresh_layers) == sorted(set(p.refresh_layers))
    assert s["rounds"][0]["layers"] == [] and [c["layer"] for c in s["rounds"][1]["candidates"]] == [0, 1, 2]
    assert s["stop"] in ("max_refresh", "gain") and s["windows"] == cfg.windows
    assert s["ppl_ratio"] <= s["ppl_ratio_without"]  # a layer is kept only when it lowers the perplexity
    assert set(s["heldout"]) == {"windows", "dustin", "dustin + refresh"}
    assert "refresh" in p.calibration["run"]["seconds"]
    assert load_profile(res.path) == p


def test_round_one_is_the_best_single_layer(setup, monkeypatch):
    """Each single layer's NLL at the windows' last offset computed on its own (its own
    teacher-forced run, not the search's shared one): the search's round-1 table matches them and
    round 1 keeps their minimum."""
    target, draft, sparse, seqs = setup
    context = len(seqs[0]) - rf.scored_tokens(len(seqs[0]), GAMMA)
    own = []
    for layer in range(target.cfg.num_layers):
        full, one = teacher_forced_nll(target, draft, seqs, context, gamma=GAMMA, hooks=[
            None, make_policy("dustin", replace(sparse, refresh_layers=(layer,)), target=target, draft=draft)])
        own.append(rf.last_offset_nll(one, GAMMA) - rf.last_offset_nll(full, GAMMA))
    score = rf.nll_scorer(target, draft, sparse, seqs, GAMMA)
    found = rf.greedy_refresh(score, range(target.cfg.num_layers), 2, min_gain=-math.inf)
    table = found.rounds[1]["candidates"]
    assert [c["ppl_ratio"] for c in table] == pytest.approx([math.exp(x) for x in own], rel=1e-9)
    assert len(set(own)) == len(own)  # no tie: the best is one layer
    best = min(range(len(own)), key=own.__getitem__)
    assert found.rounds[1]["best"] == best and best in found.layers
    assert len(found.layers) == 2 and found.stop == "max_refresh" and len(found.rounds) == 3  # stops at K
    assert all(0 <= x < target.cfg.num_layers for x in found.layers)
    assert found.rounds[2]["candidates"][0]["layer"] != best
    every = rf.greedy_refresh(score, range(target.cfg.num_layers), 5, min_gain=-math.inf)
    assert every.layers == (0, 1, 2) and every.stop == "no candidates"
    monkeypatch.setattr(rf, "SETS_PER_PREFILL", 2)  # the sets split over prefills: the same scores
    assert score([None, (0,), (1,), (2,)]) == pytest.approx(rf.nll_scorer(target, draft, sparse, seqs, GAMMA)(
        [None, (0,), (1,), (2,)]), rel=1e-9)
    none = rf.greedy_refresh(score, range(target.cfg.num_layers), 2, min_gain=math.inf)
    assert none.layers == () and none.stop == "gain" and none.ppl_ratio == none.base_ratio


def test_scored_tokens():
    assert rf.scored_tokens(4101, 4) == 320 and rf.scored_tokens(4101, 4, 64) == 60
    assert rf.scored_tokens(164, 3, 64) == 64 and rf.scored_tokens(12, 3) == 4
    with pytest.raises(DustinError):
        rf.scored_tokens(8, 3)


def test_plan_follows_the_profile_unless_told(made, tmp_path):
    cfg, res = made
    target, draft = (pipeline.load(x, dtype=torch.float32, device="cpu") for x in (cfg.target, cfg.draft))
    path = tmp_path / "r.json"
    replace(res.profile, refresh_layers=(1, 2)).save(path)
    plan = plan_sparse("dustin", path, None, None, None)
    assert plan.refresh_layers == (1, 2) and plan.config(target, draft).refresh_layers == (1, 2)
    off = plan_sparse("dustin", path, None, None, None, refresh_layers=())
    assert off.refresh_layers == () and off.config(target, draft).refresh_layers == ()
    assert plan_sparse("dustin", path, None, None, None, refresh_layers=(0,)).refresh_layers == (0,)
    assert plan_sparse("streamingllm", path, None, None, None).refresh_layers == ()
    runs = plan_runs(["full", "dustin", "quest"], [48], path, None, None)
    assert {r.policy: p.refresh_layers for r, p in runs.items()} == {"full": (), "dustin": (1, 2), "quest": ()}
    assert all(p.refresh_layers == () for p in plan_runs(["dustin"], [48], path, None, None, refresh_layers=()).values())


def test_older_profiles_have_no_refresh_layers(made, tmp_path):
    _, res = made
    d = json.loads(replace(res.profile, refresh_layers=(1,)).to_json())
    for k in ("refresh_layers", "refresh_search"):
        d.pop(k)
    (tmp_path / "v2.json").write_text(json.dumps({**d, "schema_version": 2}))
    p = load_profile(tmp_path / "v2.json")
    assert p.schema_version == 2 and p.refresh_layers == () and p.refresh_search == {}
    assert plan_sparse("dustin", tmp_path / "v2.json", None, None, None).refresh_layers == ()


@pytest.mark.parametrize("value,needle", [([3], "must be distinct target layers"), ([1, 0], "ascending"),
                                          ([1, 1], "distinct"), ("1", "must be a list"), ([True], "must be a list")])
def test_bad_refresh_layers_refused(made, tmp_path, value, needle):
    _, res = made
    d = json.loads(res.profile.to_json())
    d["refresh_layers"] = value
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(DustinError) as e:
        load_profile(tmp_path / "p.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_max_refresh_refused(models, calib_text, tmp_path, run_cli, assert_one_line_error):
    args = ("profile", "--target", models["other"], "--draft", models["draft"], "--calib", calib_text,
            "--context", "128", "--windows", "1", "--budget", "40", "--sinks", "2", "--window", "8",
            "--out", tmp_path / "p.json")
    assert_one_line_error(run_cli(*args, "--max-refresh", "-1"), "--max-refresh must be >= 0", code=2)
    assert_one_line_error(run_cli(*args, "--max-refresh", "4"), "--max-refresh 4 exceeds", "3 layers", code=2)
    assert not (tmp_path / "p.json").exists()


def test_refresh_layers_option_spelling():
    from dustin_profile.plan import parse_layers

    assert parse_layers("") is None and parse_layers(" none ") == () and parse_layers("NONE") == ()
    assert parse_layers("8,20") == (8, 20)
    with pytest.raises(DustinError):
        parse_layers("8,x")


def test_last_offset_nll_counts_whole_windows_only():
    """The objective reads offset gamma alone: a window cut short (no last offset) adds nothing."""
    from dustin_runtime.sparse.teacher_forced import TeacherForcedResult

    r = TeacherForcedResult(nll=[10.0, 7.0], tokens=[10, 8], windows=2,
                            nll_by_offset=[[1.0, 1.0, 1.0, 1.0, 6.0], [1.0, 1.0, 1.0, 1.0, 3.0]])
    assert rf.last_offset_nll(r, 4) == pytest.approx((6.0 + 3.0) / (2 + 1))  # 10 tokens: 2 windows, 8: 1


def test_layer_sets_score_as_their_own_runs(setup):
    """A refresh set in the search's shared run scores what dustin refreshed at those layers scores
    in a teacher-forced run of its own (the order a set lists its layers in does not matter)."""
    target, draft, sparse, seqs = setup
    context = len(seqs[0]) - rf.scored_tokens(len(seqs[0]), GAMMA)
    score = rf.nll_scorer(target, draft, sparse, seqs, GAMMA)
    got = score([None, (1, 2), (1,), (2,), (2, 1)])
    runs = [None] + [make_policy("dustin", replace(sparse, refresh_layers=layers), target=target, draft=draft)
                     for layers in ((1, 2), (1,), (2,))]
    own = [rf.last_offset_nll(r, GAMMA) for r in teacher_forced_nll(target, draft, seqs, context, gamma=GAMMA,
                                                                      hooks=runs)]
    assert got[:4] == pytest.approx(own, rel=1e-9) and got[1] == got[4]
    assert len(set(got[1:4])) == 3  # the layers change the set


def test_refresh_search_at_2_ranks_equals_one_process(made, tmp_path, tp_run):
    """`run_profile` with --max-refresh 2 under a gloo group of 2 (what `dustin profile --tp 2` runs):
    the refresh search's teacher-forced passes run sharded on every rank, rank 0's perplexities
    decide; the same heads, m and refresh layers as one process, every round's perplexity ratios
    and the held-out ones within float rounding."""
    cfg, res = made
    kw = {k: getattr(cfg, k) for k in ("target", "draft", "context", "windows", "positions", "budget", "gamma",
                                       "sinks", "window", "max_heads", "epsilon", "m_points", "heldout",
                                       "max_refresh")}
    kw.update(calib=list(cfg.calib), budgets=list(cfg.budgets))
    ranks = tp_run.case("profile", 2, timeout=300, out=str(tmp_path / "tp.json"), **kw)
    assert ranks[1] is None and ranks[0] is not None
    one, tp = res.profile, load_profile(tmp_path / "tp.json")
    assert one.has_heads and "skipped" not in one.refresh_search  # the search ran
    assert (tp.draft_heads, tp.target_heads, tp.m, tp.refresh_layers) == \
        (one.draft_heads, one.target_heads, one.m, one.refresh_layers)
    a, b = one.refresh_search, tp.refresh_search
    assert (b["stop"], len(b["rounds"])) == (a["stop"], len(a["rounds"])) and len(a["rounds"]) >= 2
    for x, y in zip(a["rounds"][1:], b["rounds"][1:], strict=True):
        assert (y["best"], [c["layer"] for c in y["candidates"]]) == (x["best"], [c["layer"] for c in x["candidates"]])
        assert [c["ppl_ratio"] for c in y["candidates"]] == pytest.approx([c["ppl_ratio"] for c in x["candidates"]],
                                                                          rel=1e-5)
    for k in ("ppl_ratio", "ppl_ratio_without"):
        assert b[k] == pytest.approx(a[k], rel=1e-5), k
    for k in ("dustin", "dustin + refresh"):
        assert b["heldout"][k] == pytest.approx(a["heldout"][k], rel=1e-5), k
    assert tp.calibration["run"]["tp"] == 2 and "refresh" in tp.calibration["run"]["seconds"]
