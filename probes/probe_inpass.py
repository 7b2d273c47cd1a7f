"""In-pass selection: the verification pass re-selects the set at layer r from the current queries
of the retrieval heads of layers <= r (scored as the pass reaches them), and layers > r attend that
set; layers <= r attend the set chosen before the pass (from the previous pass's history, as
dustin does today). Teacher-forced perplexity ratio to full attention, overall and at the last
window offset, on the pg19-harness windows (CPU).

    python probes/probe_inpass.py OUT.json [windows] [context] [eval_tokens] [r values...]
    (defaults: 8 4096 256 3)"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

import numpy as np
import torch

from dustin_eval.corpus import gutenberg_split
from dustin_eval.intervals import bootstrap, ppl_ratio
from dustin_eval.pg19 import iter_windows
from dustin_profile.artifact import load_profile
from dustin_runtime.pipeline import load_pair
from dustin_runtime.policies import make_policy
from dustin_runtime.provenance import provenance
from dustin_runtime.signals import normalise_
from dustin_runtime.sparse import every_head
from dustin_runtime.teacher_forced import teacher_forced_nll


def refresh_at(policy, r: int):
    """`policy` (dustin, one set) re-selecting at layer r from the pass's scores so far."""
    attend = policy.verify_attend

    def verify_attend(layer, q, cache, ctx):
        out = attend(layer, q, cache, ctx)  # scores this layer's retrieval heads, attends the current set
        if layer == r:
            c = policy.cfg
            for g in policy.groups:
                now = normalise_(g.history.clone())
                policy.ops.select_indices(now, None, ctx.start, g.indices, sinks=c.sinks, window=c.window, m=c.free)
        return out

    policy.verify_attend = verify_attend
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *rs: int) -> None:
    torch.set_num_threads(2)
    t, d = load_pair("smollm2", "models/smollm2-draft", dtype=torch.float32, device="cpu")
    cfg = load_profile("profiles/smollm2-draft.json").to_sparse_config(512)
    wins = list(iter_windows(t.tokenizer, gutenberg_split("eval"), context + eval_tokens, max_windows=windows,
                             max_windows_per_book=1))
    early = replace(cfg, target_heads=tuple(h for h in every_head(t.model.cfg) if h[0] <= 3))
    variants = [("full", None), ("dustin", make_policy("dustin", cfg, target=t.model, draft=d.model))]
    for r in rs or (3,):
        variants.append((f"dustin, in-pass at layer {r} (profile heads)",
                         refresh_at(make_policy("dustin", cfg, target=t.model, draft=d.model), r)))
    variants.append(("dustin, in-pass at layer 3 (every KV head of layers 0-3)",
                     refresh_at(make_policy("dustin", early, target=t.model, draft=d.model), 3)))
    res = teacher_forced_nll(t.model, d.model, [w.ids for w in wins], context, gamma=4, hooks=[h for _, h in variants])
    full, rows = res[0], []
    per = np.array(full.tokens) // 5
    for (name, _), r in zip(variants, res, strict=True):
        v, lo, hi = bootstrap(ppl_ratio, r.nll, r.tokens, full.nll, full.tokens)
        last = bootstrap(ppl_ratio, [a[4] for a in r.nll_by_offset], per, [b[4] for b in full.nll_by_offset], per)
        rows.append({"policy": name, "ppl": math.exp(sum(r.nll) / sum(r.tokens)), "ppl_ratio": [v, lo, hi],
                     "ppl_ratio_last": list(last)})
        print(f"{name:60s} ppl ratio {v:.4f} [{lo:.4f}, {hi:.4f}]  last offset {last[0]:.4f} "
              f"[{last[1]:.4f}, {last[2]:.4f}]", flush=True)
    json.dump({"provenance": provenance(models={"target": "smollm2", "draft": "models/smollm2-draft"}),
               "windows": windows, "context": context, "eval_tokens": eval_tokens, "budget": 512,
               "books": [w.book for w in wins], "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:]))
