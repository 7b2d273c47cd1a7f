"""`dustin bench e2e` parts that need no GPU: replayed acceptance counts, the byte floor, the
refresh-layer policies' config and plumbing (eager, tiny random models)."""

import json
from dataclasses import replace

import pytest
import torch

from dustin_eval.bench_e2e import (
    E2EConfig,
    Pair,
    _run,
    agreement_counts,
    byte_floor,
    geometric_counts,
    recorded_counts,
    replay_counts,
    sparse_config,
    split_agreement,
    split_policy,
)
from dustin_runtime.config import ModelConfig
from dustin_runtime.engine import Engine
from dustin_runtime.errors import DustinError
from dustin_runtime.exact import DEFAULT_K
from dustin_runtime.generate import generate
from dustin_runtime.loader import random_model
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate


def test_geometric_counts_follow_the_truncated_law():
    gamma, alpha = 4, 0.8
    c = geometric_counts(alpha, gamma, 4000, 16, seed=0)
    assert c.shape == (4000, 16) and c.min() >= 0 and c.max() <= gamma
    n = c.numel()
    for k in range(gamma + 1):  # P(n = k) = alpha^k (1 - alpha) for k < gamma, alpha^gamma at gamma
        p = alpha**k * (1 - alpha) if k < gamma else alpha**gamma
        got = float((c == k).sum()) / n
        assert abs(got - p) < 5 * (p * (1 - p) / n) ** 0.5 + 1e-9, (k, got, p)
    mean = sum(alpha**k for k in range(1, gamma + 1))  # E[n] = sum_{k=1..gamma} alpha^k
    assert abs(float(c.double().mean()) - mean) < 0.03
    assert torch.equal(c, geometric_counts(alpha, gamma, 4000, 16, seed=0))
    assert not torch.equal(c, geometric_counts(alpha, gamma, 4000, 16, seed=1))


def test_recorded_counts_cycle_over_sequences_and_steps(tmp_path):
    path = tmp_path / "runs.jsonl"
    recs = [{"stats": {"gamma": 4, "accepted": [[4, 0], [2, 1], [-1, 3]]}}, {"accepted": [[1], [0]]}]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    c = recorded_counts(path, 4, steps=5, batch=4)  # streams: [4, 2], [0, 1, 3], [1, 0]
    assert c[:, 0].tolist() == [4, 2, 4, 2, 4]
    assert c[:, 1].tolist() == [0, 1, 3, 0, 1]
    assert c[:, 2].tolist() == [1, 0, 1, 0, 1]
    assert c[:, 3].tolist() == c[:, 0].tolist()
    assert torch.equal(replay_counts(str(path), 4, 5, 4, 0), c)


@pytest.mark.parametrize("text, match", [
    ('{"stats": {"gamma": 3, "accepted": [[1]]}}', "gamma 3"),
    ('{"stats": {"accepted": [[7]]}}', "exceeds gamma"),
    ('{"stats": {}}', "stats.accepted"),
    ('not json', "stats.accepted"),
    ('{"accepted": [[-1]]}', "no accepted counts"),
])
def test_recorded_counts_refuse_bad_files(tmp_path, text, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(text + "\n")
    with pytest.raises(DustinError, match=match):
        recorded_counts(path, 4, 3, 2)


@pytest.mark.parametrize("spec", ["geometric:x", "geometric:1.5", "geometric:-0.1"])
def test_bad_geometric_spec(spec):
    with pytest.raises(DustinError, match="ALPHA"):
        replay_counts(spec, 4, 3, 2, 0)


@pytest.mark.parametrize("kw, match", [
    (dict(policies=("ar", "eagle")), "unknown policies"),
    (dict(batch=0), "batch"),
    (dict(budget=32), "smaller than sinks"),
    (dict(alphas=(1.2,)), "alphas"),
    (dict(m=1000), "outside"),
])
def test_config_refuses_bad_settings(kw, match):
    with pytest.raises(DustinError, match=match):
        E2EConfig(**kw).check()


@pytest.mark.parametrize("kw, match", [
    (dict(policies=("dustin", "dustin-r")), "give --refresh-layers"),
    (dict(policies=("dustin", "dustin-vs"), refresh_layers=(9,)), "applies to the -r policies"),
    (dict(policies=("dustin-r",), refresh_layers=(9, 28)), "refresh layer 28 is past the target's 28 layers"),
    (dict(policies=("dustin-r",), refresh_layers=(18, 9)), "ascending order"),
    (dict(policies=("streamingllm-r",), refresh_layers=(9,)), "unknown policies"),
])
def test_config_refuses_bad_refresh_layers(kw, match):
    with pytest.raises(DustinError, match=match):
        E2EConfig(**kw).check()


def test_refresh_layers_of_a_preset_within_its_layers_pass():
    E2EConfig(policies=("full", "dustin", "dustin-r", "dustin-vs-r"), refresh_layers=(9, 27)).check()
    assert split_policy("dustin-vs-r") == ("dustin", True, True)
    assert split_policy("dustin-r") == ("dustin", False, True)
    assert split_policy("streamingllm-vs") == ("streamingllm", True, False)
    assert split_policy("ar") == ("ar", False, False)


def tiny_pair(batch=2, seed=0):
    """Random tiny models on the CPU (fp32) and real prompts of a few dozen tokens."""
    t = ModelConfig("llama", 131, 64, 96, 3, 4, 2, 16, 512)
    d = ModelConfig("llama", 131, 64, 96, 1, 4, 2, 16, 512)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 131, (40 + 7 * b,), generator=g).tolist() for b in range(batch)]
    return Pair(random_model(t, dtype=torch.float32, device="cpu", seed=seed),
                random_model(d, dtype=torch.float32, device="cpu", seed=seed + 1), "t", "d", False, prompts)


@pytest.mark.parametrize("policy, refresh, draft_kv", [
    ("dustin", (), "full"), ("dustin-r", (1,), "full"), ("dustin-vs-r", (1, 2), "verify-set")])
def test_run_applies_refresh_layers_to_the_r_policies(policy, refresh, draft_kv):
    cfg = E2EConfig(target="tiny", draft="tiny", batch=2, context=40, gamma=2, budget=24, sinks=2, window=4, m=4,
                    srh=2, draft_srh=1, new_tokens=6, policies=(policy,), refresh_layers=(1, 2) if refresh else ())
    pair = tiny_pair()
    scfg = sparse_config(cfg, pair)
    eng = Engine(pair.target, pair.draft)
    res = _run(pair, eng, policy, cfg, scfg, None)
    hooks = eng.last.objs["hooks"]
    assert hooks.cfg.refresh_layers == ((1, 2) if refresh else ()) and hooks.cfg.draft_kv == draft_kv
    ref = make_policy("dustin", replace(scfg, refresh_layers=hooks.cfg.refresh_layers, draft_kv=draft_kv),
                      target=pair.target, draft=pair.draft)
    want = speculative_generate(pair.target, pair.draft, pair.prompts, 6, gamma=2, hooks=ref, cuda_graphs=False)
    assert res.tokens == want.tokens and res.stats.accepted == want.stats.accepted


def test_byte_floor_adds_the_keys_of_each_refresh_layer():
    cfg = E2EConfig(target="tiny", draft="tiny", batch=2, context=40, gamma=2, budget=24, sinks=2, window=4, m=4,
                    srh=2, draft_srh=1, new_tokens=6, policies=("dustin", "dustin-r"), refresh_layers=(1, 2))
    pair = tiny_pair()
    scfg = sparse_config(cfg, pair)
    plain, refreshed = (byte_floor(pair, p, cfg, scfg, 1.0) for p in ("dustin", "dustin-r"))
    t = pair.target.cfg
    assert refreshed["bytes"] - plain["bytes"] == 2 * cfg.batch * cfg.context * t.num_kv_heads * t.head_dim * 2
    assert byte_floor(pair, "dustin-vs-r", cfg, scfg, 1.0)["bytes"] - byte_floor(pair, "dustin-vs", cfg, scfg, 1.0)[
        "bytes"] == refreshed["bytes"] - plain["bytes"]


def test_exact_policies_and_the_replayed_agreement():
    assert split_policy("dustin-vs-r-x") == ("dustin", True, True) and split_policy("quest-x") == ("quest", False, False)
    assert split_agreement("geometric:0.8:agree=0.97") == ("geometric:0.8", 0.97)
    assert split_agreement("runs/a.jsonl") == ("runs/a.jsonl", None)
    for bad in ("geometric:0.8:agree=1.5", "geometric:0.8:agree=x"):
        with pytest.raises(DustinError, match="agreement"):
            split_agreement(bad)
    c = agreement_counts("geometric:0.8:agree=0.9", 20, 4000, 4, 0)
    assert c.shape == (4000, 4) and c.max() <= 20
    for k in (1, 5):  # P(confirmed >= k) = agree^k
        assert (c >= k).double().mean().item() == pytest.approx(0.9 ** k, abs=4 * (0.25 / 16000) ** 0.5)
    assert agreement_counts("geometric:0.8", 20, 10, 4, 0) is None
    assert torch.equal(replay_counts("geometric:0.8:agree=0.9", 3, 50, 2, 1), replay_counts("geometric:0.8", 3, 50, 2, 1))
    with pytest.raises(DustinError, match="agree="):  # random weights agree on nothing: the agreement is replayed
        E2EConfig(policies=("ar", "dustin-vs-x")).check()
    E2EConfig(policies=("ar", "full", "dustin-vs", "dustin-vs-x", "dustin-vs-x3"),
              acceptance="geometric:0.8:agree=0.97").check()
    with pytest.raises(DustinError, match="unknown policies ar-x2"):
        E2EConfig(policies=("ar-x2",), acceptance="geometric:0.8:agree=0.97").check()
    with pytest.raises(DustinError, match="unknown policies"):
        E2EConfig(policies=("ar-x",), acceptance="geometric:0.8:agree=0.97").check()


@pytest.mark.parametrize("policy", ["dustin-x4", "dustin-vs-x4", "streamingllm-x4", "quest-x4"])
def test_run_of_an_exact_policy_is_greedy_decoding(policy):
    cfg = E2EConfig(target="tiny", draft="tiny", batch=2, context=40, gamma=2, budget=12, sinks=2, window=4, m=4,
                    srh=2, draft_srh=1, new_tokens=9, policies=(policy,))
    pair = tiny_pair()
    scfg = sparse_config(cfg, pair)
    res = _run(pair, Engine(pair.target, pair.draft), policy, cfg, scfg, None)
    assert res.tokens == generate(pair.target, pair.prompts, 9).tokens
    assert res.stats.extra["exact_k"] == 4 and res.stats.extra["confirm_passes"] >= 1
    forced = _run(pair, Engine(pair.target, pair.draft), policy, cfg, scfg, torch.full((10, 2), 2),
                  torch.zeros(10, 2, dtype=torch.long))  # replayed: each pass confirms nothing but its correction
    x = forced.stats.extra  # a pass after k confirmed tokens comes when 3 tokens a step reach 9 (< K = 4 steps)
    assert x["confirmed_share"] == 0 and x["confirm_passes"] == 9
    assert forced.stats.steps == sum(-(-(9 - k) // 3) for k in range(9))


def test_byte_floor_of_an_exact_policy_adds_a_full_pass_every_k_steps():
    cfg = E2EConfig(target="tiny", draft="tiny", batch=2, context=40, gamma=2, budget=24, sinks=2, window=4, m=4,
                    srh=2, draft_srh=1, new_tokens=6, policies=("dustin-vs", "dustin-vs-x", "dustin-vs-x3"))
    pair = tiny_pair()
    scfg = sparse_config(cfg, pair)
    plain, exact, exact3 = (byte_floor(pair, p, cfg, scfg, 1.0)["bytes"] for p in cfg.policies)
    full = byte_floor(pair, "ar", cfg, scfg, 1.0)["bytes"]  # the weights and every KV row once
    assert exact - plain == pytest.approx(full / DEFAULT_K) and exact3 - plain == pytest.approx(full / 3)


def test_each_policy_runs_at_the_budget_decode_would_use():
    from dustin_eval.bench_e2e import BUDGET, budget_label
    from dustin_runtime.exact import exact_budget

    cfg = E2EConfig(policies=("ar", "full", "dustin-vs", "dustin-vs-x", "quest-x3"), acceptance="geometric:0.8:agree=0.97")
    cfg.check()
    assert [cfg.budget_of(p) for p in ("dustin-vs", "dustin-vs-x", "quest-x3")] == [BUDGET, exact_budget(None),
                                                                                     exact_budget(None)]
    assert exact_budget(None) != BUDGET and budget_label(cfg) == f"{BUDGET}, -x {exact_budget(None)}"
    given = replace(cfg, budget=768)  # --budget: every sparse policy at it
    assert {given.budget_of(p) for p in cfg.policies} == {768} and budget_label(given) == "768"
    assert budget_label(replace(cfg, policies=("ar", "full"))) == "-"
    with pytest.raises(DustinError, match="smaller than sinks"):  # each policy's budget is checked
        replace(cfg, budget=None, sinks=600, m=0).check()
    pair = tiny_pair()
    small = replace(cfg, target="tiny", draft="tiny", batch=2, context=40, gamma=2, sinks=2, window=4, m=4, srh=2,
                    draft_srh=1)
    lossy, exact = (byte_floor(pair, p, replace(small, budget=small.budget_of(p)), sparse_config(small, pair), 1.0)
                    for p in ("dustin-vs", "dustin-vs-x"))
    assert byte_floor(pair, "dustin-vs-x", small, sparse_config(small, pair), 1.0) == exact  # budget None: budget_of
    assert exact["bytes"] > lossy["bytes"]
