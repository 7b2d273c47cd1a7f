"""`dustin bench e2e` parts that need no GPU: replayed acceptance counts and the byte floor."""

import json

import pytest
import torch

from dustin_eval.bench_e2e import E2EConfig, geometric_counts, recorded_counts, replay_counts
from dustin_runtime.errors import DustinError


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
