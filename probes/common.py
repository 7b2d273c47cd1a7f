"""What the probes share: a per-call time in microseconds from `dustin_eval.timing.graph_ms`."""

from __future__ import annotations

from collections.abc import Callable

from dustin_eval.timing import graph_ms


def graph_us(fn: Callable[[int], object], n: int = 24) -> float:
    """Median per-call time (us) of fn(0..n-1) captured back to back in one CUDA graph."""
    return graph_ms([lambda i=i: fn(i) for i in range(n)])["median_ms"] * 1e3


def smollm2_windows(windows: int, context: int, eval_tokens: int, split: str = "eval", refresh: bool = False):
    """The perplexity probes' setup on the CPU: the embedded SmolLM2 pair, the committed profile's
    config at S = 512 (with its refresh layers if `refresh`) and the pg19 harness's first `windows`
    windows of a corpus split."""
    from dataclasses import replace

    import torch

    from dustin_eval.corpus import gutenberg_split
    from dustin_eval.pg19 import iter_windows
    from dustin_profile.artifact import load_profile
    from dustin_runtime.pipeline import load_pair

    torch.set_num_threads(2)
    t, d = load_pair("smollm2", "models/smollm2-draft", dtype=torch.float32, device="cpu")
    prof = load_profile("profiles/smollm2-draft.json")
    cfg = prof.to_sparse_config(512)
    if refresh:
        cfg = replace(cfg, refresh_layers=prof.refresh_layers)
    wins = list(iter_windows(t.tokenizer, gutenberg_split(split), context + eval_tokens, max_windows=windows,
                             max_windows_per_book=1))
    return t.model, d.model, cfg, wins


def report_set_ppl(out: str, target, draft, wins, context: int, variants, **record) -> None:
    """Teacher-forced NLL of `wins` under every (name, hooks) of `variants` (the first is full
    attention), printed and written to `out` as each one's perplexity ratio to the first, overall
    and at the last window offset, with 95% bootstrap intervals over windows."""
    import json
    import math

    import numpy as np

    from dustin_eval.intervals import bootstrap, ppl_ratio
    from dustin_runtime.io.provenance import provenance
    from dustin_runtime.sparse.teacher_forced import teacher_forced_nll

    res = teacher_forced_nll(target, draft, [w.ids for w in wins], context, gamma=4, hooks=[h for _, h in variants])
    full, rows = res[0], []
    per = np.array(full.tokens) // 5  # tokens per window offset
    for (name, _), r in zip(variants, res, strict=True):
        v, lo, hi = bootstrap(ppl_ratio, r.nll, r.tokens, full.nll, full.tokens)
        last = bootstrap(ppl_ratio, [a[-1] for a in r.nll_by_offset], per, [b[-1] for b in full.nll_by_offset], per)
        rows.append({"policy": name, "ppl": math.exp(sum(r.nll) / sum(r.tokens)), "ppl_ratio": [v, lo, hi],
                     "ppl_ratio_last": list(last)})
        print(f"{name[:70]:70s} ppl ratio {v:.4f} [{lo:.4f}, {hi:.4f}]  last offset {last[0]:.4f} "
              f"[{last[1]:.4f}, {last[2]:.4f}]", flush=True)
    with open(out, "w") as f:
        json.dump({"provenance": provenance(models={"target": "smollm2", "draft": "models/smollm2-draft"}),
                   "windows": len(wins), "context": context, "books": [w.book for w in wins], **record,
                   "rows": rows}, f, indent=1)


def e2e_arms(names: str, batch: str, context: str, rounds: str, arms, set_arm, final, out_file: str,
             key: str = "arm") -> None:
    """`dustin bench e2e`'s loop for the policies `names` under each of `arms` (`set_arm(a)` switches to
    arm a), interleaved for `rounds` rounds in one process: ms per step and phase graph times of each,
    printed and written to $OUT/out_file (rows labelled `key`: the arm); `final` is switched on last."""
    import json
    import os

    import torch

    from dustin_eval.bench_e2e import E2EConfig, run_e2e

    cfg = E2EConfig(batch=int(batch), context=int(context), policies=tuple(names.split(",")), alphas=(), phase_reps=10)
    rows = []
    for r in range(int(rounds)):
        for a in arms:
            set_arm(a)
            for rec in run_e2e(cfg, command=out_file)["records"]:
                row = {"round": r, key: a, "policy": rec["policy"], "ms_per_step": rec["ms_per_step"],
                       "graph_phase_ms": rec["graph_phase_ms"]}
                rows.append(row)
                print(row, flush=True)
    set_arm(final)
    with open(os.path.join(os.environ.get("OUT", "."), out_file), "w") as f:
        json.dump({"config": {"batch": cfg.batch, "context": cfg.context, "policies": list(cfg.policies)},
                   "gpu": torch.cuda.get_device_name(), "commit": os.environ.get("DUSTIN_GIT_COMMIT"),
                   "rows": rows}, f, indent=1)


def e2e_ab(names: str, batch: str, context: str, rounds: str, arm, key: str, out_file: str) -> None:
    """`e2e_arms` with a switch on and off (`arm(on)` sets it; rows labelled `key`: on), left on."""
    e2e_arms(names, batch, context, rounds, (True, False), arm, True, out_file, key)
