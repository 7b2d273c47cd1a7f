"""Does attending the whole cache in a few layers close dustin's perplexity gap? Teacher-forced
perplexity (the pg19 harness's windows) of full attention, dustin (the committed profile, S = 512)
and dustin with layers `dense` verified over the whole cache, on the same windows.

    python probes/probe_dense_layers.py OUT.json [windows] [context] [eval_tokens] [dense sets...]
    (defaults: 8 4096 256 "0,1" "0" "0,1,29"; a dense set is comma-separated layer numbers)"""

from __future__ import annotations

import json
import math
import sys

import torch

from dustin_eval.corpus import gutenberg_split
from dustin_eval.intervals import bootstrap, ppl_ratio
from dustin_eval.pg19 import iter_windows
from dustin_profile.artifact import load_profile
from dustin_runtime.pipeline import load_pair
from dustin_runtime.policies import make_policy
from dustin_runtime.provenance import provenance
from dustin_runtime.teacher_forced import teacher_forced_nll


def dense_in(policy, layers: set[int]):
    """`policy` with `layers` verified by full attention (the rest through its sets)."""
    sparse, make_backend = policy.verify_attend, policy.target_backend
    full = {}

    def target_backend(default):
        full["backend"] = default
        return make_backend(default)

    def verify_attend(layer, q, cache, ctx):
        if layer in layers:
            policy.observe_verify(layer, q, cache, ctx)
            return full["backend"].attend(layer, q, cache, ctx)
        return sparse(layer, q, cache, ctx)

    policy.target_backend, policy.verify_attend = target_backend, verify_attend
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *dense: str) -> None:
    sets = [set(map(int, d.split(","))) for d in (dense or ("0,1", "0", "0,1,29"))]
    torch.set_num_threads(2)
    t, d = load_pair("smollm2", "models/smollm2-draft", dtype=torch.float32, device="cpu")
    cfg = load_profile("profiles/smollm2-draft.json").to_sparse_config(512)
    wins = list(iter_windows(t.tokenizer, gutenberg_split("eval"), context + eval_tokens, max_windows=windows,
                             max_windows_per_book=1))
    names = ["full", "dustin"] + [f"dustin+dense{sorted(s)}" for s in sets]

    def hooks():
        yield None
        yield make_policy("dustin", cfg, target=t.model, draft=d.model)
        for s in sets:
            yield dense_in(make_policy("dustin", cfg, target=t.model, draft=d.model), s)

    res = teacher_forced_nll(t.model, d.model, [w.ids for w in wins], context, gamma=4, hooks=list(hooks()))
    full = res[0]
    rows = []
    for name, r in zip(names, res, strict=True):
        v, lo, hi = bootstrap(ppl_ratio, r.nll, r.tokens, full.nll, full.tokens)
        rows.append({"policy": name, "ppl": math.exp(sum(r.nll) / sum(r.tokens)), "ppl_ratio": v,
                     "lo": lo, "hi": hi})
        print(f"{name:28s} ppl ratio {v:.4f} [{lo:.4f}, {hi:.4f}]", flush=True)
    json.dump({"provenance": provenance(models={"target": "smollm2", "draft": "models/smollm2-draft"}),
               "windows": windows, "context": context, "eval_tokens": eval_tokens, "books": [w.book for w in wins],
               "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:])
