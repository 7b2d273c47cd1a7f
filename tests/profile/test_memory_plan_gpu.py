"""The memory plan on one GPU, at the presets' shapes with random weights: the 72B profile at one GPU
is refused before loading with the plan's line; the 7B profile runs and its peak is the plan's
estimate within 15%."""

import json

import pytest
import torch

from dustin_profile.run import ProfileConfig, run_profile

pytestmark = pytest.mark.gpu


def test_72b_profile_on_one_gpu_refused_with_the_plan(run_cli, assert_one_line_error, tmp_path):
    p = run_cli("profile", "--target", "random:qwen2.5-72b", "--draft", "random:qwen2.5-0.5b", "--context", "8192",
                "--windows", "16", "--out", str(tmp_path / "p.json"))
    assert_one_line_error(p, "memory: profile needs", "weights 136.", "free on", code=2)
    assert not (tmp_path / "p.json").exists()


def test_7b_profile_peak_is_the_plan_within_15_percent(tmp_path):
    torch.cuda.reset_peak_memory_stats()
    cfg = ProfileConfig(target="random:qwen2.5-7b", draft="random:qwen2.5-0.5b", out=str(tmp_path / "p.json"),
                        context=8192, windows=2)
    res = run_profile(cfg, command="test")
    mem = json.loads(res.path.read_text())["calibration"]["run"]["memory"]
    plan, peak = mem["plan"]["total_bytes"], mem["peak_bytes"]
    print(f"plan {plan / 2**30:.2f} GiB, peak {peak / 2**30:.2f} GiB ({mem['plan']['bytes']})")
    assert abs(peak - plan) <= 0.15 * plan
