"""A small hand-made profile the artifact tests share (test_artifact.py)."""

from dustin_profile.artifact import HeadChoice, ModelInfo, Profile

INFO = ModelInfo("m", "c", "t", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)


def profile(**kw):
    base = dict(tool_version="t", git_commit="g", created="c", target=INFO, draft=INFO, gamma=4, budget=512,
                sinks=4, window=64, m=111, m_by_budget={256: 50}, draft_heads=(HeadChoice(0, 1, (2, 3)),),
                target_heads=(HeadChoice(1, 0, (0, 1)),), arr=0.9, arr_baselines={}, calibration={},
                online_cost={}, aggregation="max")
    return Profile(**{**base, **kw})
