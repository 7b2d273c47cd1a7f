"""Time the offline profiler at a real scale on a GPU with random weights (timings do not depend on
values): record `windows` calibration windows of `context` tokens for a target/draft shape pair,
then run the greedy search over every candidate KV head, and extrapolate to 16 windows.

    python scripts/profile_scale.py --target qwen2.5-7b --draft qwen2.5-0.5b --context 32763 \
        --windows 2 --out results/profile-arr/profile-scale-qwen2.5-7b-0.5b-32k.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dustin_profile import calibration as cal
from dustin_profile.candidates import candidates_of
from dustin_profile.groundtruth import record_window
from dustin_profile.run import stack_windows
from dustin_profile.search import SearchConfig, budget_sweep, greedy_search
from dustin_runtime.io.provenance import provenance
from dustin_runtime.loader import random_model
from dustin_runtime.presets import preset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-7b")
    ap.add_argument("--draft", default="qwen2.5-0.5b")
    ap.add_argument("--context", type=int, default=32763)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = a.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    tcfg, dcfg = preset(a.target), preset(a.draft)
    target = random_model(tcfg, dtype=torch.bfloat16, device=dev).use_kernels()
    draft = random_model(dcfg, dtype=torch.bfloat16, device=dev).use_kernels()
    sync()
    t_load = time.perf_counter() - t0
    positions = cal.verification_positions(a.context, a.gamma, a.positions)
    budgets = (128, 256, 512, 1024)
    g = torch.Generator().manual_seed(0)
    recs, per_window = [], []
    for _ in range(a.windows):
        tokens = torch.randint(0, min(tcfg.vocab_size, dcfg.vocab_size), (a.context + a.gamma + 1,), generator=g)
        sync()
        t = time.perf_counter()
        recs.append(record_window(target, draft, tokens.tolist(), positions, gamma=a.gamma, quest_budgets=budgets))
        sync()
        per_window.append(time.perf_counter() - t)
        print(f"window recorded in {per_window[-1]:.1f} s", flush=True)
    stats = stack_windows(recs, budgets).to(dev)
    cands = candidates_of(dcfg, "draft") + candidates_of(tcfg, "target")
    t = time.perf_counter()
    res = greedy_search(stats, cands, SearchConfig(a.budget, 4, 64, 8, 1e-3, 9))
    budget_sweep(stats, cands, res.chosen, list(budgets), 4, 64, 9)
    sync()
    t_search = time.perf_counter() - t
    steady = per_window[-1] if len(per_window) > 1 else per_window[0]
    out = {
        "target": a.target, "draft": a.draft, "weights": "random N(0, 0.02), bf16", "context": a.context,
        "windows_run": a.windows, "positions": len(positions), "candidates": len(cands),
        "load_s": t_load, "window_s": per_window, "search_s": t_search, "rounds": len(res.rounds) - 1,
        "estimated_16_windows_s": t_load + per_window[0] + 15 * steady + t_search,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if dev == "cuda" else None,
        "provenance": provenance(models={"target": tcfg.name, "draft": dcfg.name},
                                 shapes={"context": a.context, "gamma": a.gamma, "budget": a.budget}),
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps({k: v for k, v in out.items() if k != "provenance"}, indent=2))


if __name__ == "__main__":
    main()
