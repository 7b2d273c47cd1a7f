"""`dustin decode --policy/--profile/--budget` in a subprocess: a profile for other
models, a budget below sinks + window and a missing profile are refused with one line; a sparse
policy at a budget covering the context gives the tokens of full verification."""

import json

import pytest

from dustin_profile.artifact import HeadChoice, Profile, model_info
from dustin_runtime.loader import load_model
from dustin_runtime.tokenizer import load_tokenizer, vocab_hash


def write_profile(path, target_dir, draft_dir, *, sinks=4, window=16, budget=64, m=20):
    """A hand-written profile for (target, draft): first layer's KV head 0 of each model."""
    infos = []
    for folder in (target_dir, draft_dir):
        model, ckpt = load_model(str(folder))
        infos.append((model.cfg, model_info(str(folder), model.cfg, vocab_hash(load_tokenizer(ckpt)))))
    (tcfg, tinfo), (dcfg, dinfo) = infos

    def head(cfg, layer):
        return HeadChoice(layer, 0, tuple(range(cfg.n_rep)))

    prof = Profile(
        tool_version="test", git_commit="test", created="test", target=tinfo, draft=dinfo, gamma=3,
        budget=budget, sinks=sinks, window=window, m=m, m_by_budget={}, draft_heads=(head(dcfg, 0),),
        target_heads=(head(tcfg, tcfg.num_layers - 1),), arr=0.0, arr_baselines={}, calibration={},
        online_cost={},
    )
    return prof.save(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, small_models):
    """The session's small pair (2-layer target, 1-layer draft, 3-layer other; the 1024-token
    tokenizer, which loads in milliseconds where the Llama-3 one takes seconds per call)."""
    root = tmp_path_factory.mktemp("policy-cli")
    t, d, other = small_models["target"], small_models["draft"], small_models["other"]
    prompts = root / "batch.jsonl"
    prompts.write_text('{"prompt": "It was the best of times, it was the worst of times, it was the age of wisdom"}\n'
                       '{"prompt": "Call me Ishmael. Some years ago", "max_new_tokens": 6}\n')
    return {"t": t, "d": d, "prompts": prompts, "profile": write_profile(root / "p.json", t, d),
            "foreign": write_profile(root / "foreign.json", other, d)}


@pytest.fixture(scope="module")
def full(setup, run_cli):
    """The JSON record of full verification on the batch (the reference of both budget tests)."""
    return json.loads(run_cli(*common(setup, "--json"), ok=True).stdout.strip().splitlines()[-1])


def common(s, *extra):
    return ["decode", "--target", str(s["t"]), "--draft", str(s["d"]), "--prompts", str(s["prompts"]),
            "--max-new-tokens", "8", "--gamma", "3", *extra]


def test_profile_for_another_model_is_refused(setup, run_cli, assert_one_line_error):
    p = run_cli(*common(setup, "--policy", "dustin", "--profile", str(setup["foreign"])))
    assert_one_line_error(p, "foreign.json was made for target")


def test_budget_below_sinks_plus_window_is_refused(setup, run_cli, assert_one_line_error):
    p = run_cli(*common(setup, "--policy", "dustin", "--profile", str(setup["profile"]), "--budget", "10"))
    assert_one_line_error(p, "budget 10 is smaller than sinks + window (4 + 16)")


def test_head_policy_without_profile_and_unknown_policy_are_refused(setup, run_cli, assert_one_line_error):
    assert_one_line_error(run_cli(*common(setup, "--policy", "dustin")), "needs retrieval heads", "--profile")
    assert_one_line_error(run_cli(*common(setup, "--policy", "h2o")), "unknown policy 'h2o'")
    p = run_cli("decode", "--target", str(setup["t"]), "--prompt", "hi", "--policy", "quest", "--budget", "128")
    assert_one_line_error(p, "give --draft")


def test_sparse_policy_records_arr_and_full_budget_matches_full(setup, full, run_cli):
    small = json.loads(run_cli(*common(setup, "--policy", "dustin", "--profile", str(setup["profile"]), "--budget", "24",
                                       "--json"), ok=True).stdout.strip().splitlines()[-1])
    s = small["stats"]
    assert s["policy"] == "dustin" and s["extra"]["budget"] == 24 and s["extra"]["m"] == 2
    assert "mean_accepted" in s and "mean_tokens_per_step" in s
    big = json.loads(run_cli(*common(setup, "--policy", "dustin", "--profile", str(setup["profile"]), "--budget", "4096",
                                     "--json"), ok=True).stdout.strip().splitlines()[-1])
    assert big["tokens"] == full["tokens"]


def test_a_profile_implies_dustin_and_a_policy_reading_none_is_refused(setup, run_cli, assert_one_line_error):
    """--profile without --policy runs dustin; --policy full (which reads no profile) with --profile
    is refused in one line that names the fix."""
    rec = json.loads(run_cli(*common(setup, "--profile", str(setup["profile"]), "--budget", "24", "--json"),
                             ok=True).stdout.strip().splitlines()[-1])
    assert rec["stats"]["policy"] == "dustin"
    assert_one_line_error(run_cli(*common(setup, "--policy", "full", "--profile", str(setup["profile"]))),
                          "--policy full reads no profile", "drop --profile")
