"""Memory plans: weights counted as the loader holds them, caches as allocated, and the one-line
refusal that names what does not fit and the settings that would."""

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.loader import load_model
from dustin_runtime.memory import GIB, kv_bytes, plan_decode, plan_profile, weight_bytes
from dustin_runtime.presets import preset


def test_weights_and_cache_bytes_are_what_the_loader_holds(tiny_hf):
    folder, _ = tiny_hf("llama3")
    model, _ = load_model(str(folder), dtype=torch.bfloat16)
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes(model.cfg, 1, 2) == held
    cache = model.allocate_cache(3, 40)
    assert kv_bytes(model.cfg, 3, 40, 1, 2) == sum(t.numel() * t.element_size() for t in cache.k + cache.v)


def test_weights_per_rank_split_by_the_world_size():
    cfg = preset("qwen2.5-7b")
    one, two = weight_bytes(cfg, 1), weight_bytes(cfg, 2)
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size * 2  # replicated on every rank
    assert 2 * (two - norms) == pytest.approx(one - norms, rel=1e-3)  # q/k/v biases are split too


def test_72b_profile_at_one_gpu_refuses_naming_the_weights_and_a_fitting_setting():
    plan = plan_profile(preset("qwen2.5-72b"), preset("qwen2.5-0.5b"), context=8192, windows=16)
    assert plan.part("weights") > 135 * GIB  # 72.7B parameters in bf16
    with pytest.raises(DustinError) as e:
        plan.check(139 * GIB, "H200")
    msg = str(e.value)
    assert "\n" not in msg and "weights 136." in msg and "139.0 GiB free on H200" in msg
    assert "--tp 2" in msg
    fixed = plan.remake(**{**plan.settings, "tp": 2})
    assert fixed.total <= 139 * GIB
    plan.remake(**{**plan.settings, "tp": 2}).check(139 * GIB)  # fits: no error


def test_smaller_context_or_windows_is_named_when_it_fits():
    t, d = preset("qwen2.5-7b"), preset("qwen2.5-0.5b")
    plan = plan_profile(t, d, context=32768, windows=64, tp_allowed=False)
    free = plan.part("weights") + plan.part("kv") // 2 + 3 * GIB
    with pytest.raises(DustinError) as e:
        plan.check(free)
    msg = str(e.value)
    assert "--tp" not in msg and ("--context" in msg or "--windows" in msg)
    for fix in msg.split("fits with ")[1].split(" or "):
        knob, value = fix.split()[:2]
        assert plan.remake(**{**plan.settings, knob.removeprefix("--"): int(value)}).total <= free


def test_decode_plan_is_weights_only_and_fits_when_nothing_would_else():
    t = preset("qwen2.5-7b")
    plan = plan_decode(t, None)
    assert plan.total == weight_bytes(t)
    plan.check(plan.total)
    with pytest.raises(DustinError, match="--tp 2"):
        plan.check(plan.total - 1)
