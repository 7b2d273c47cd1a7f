"""How current must the verification set be? The verification pass re-selects the set at chosen
layers from the current queries of every KV head of that layer (its exact attention, as the pass
reaches it); each later layer attends the latest such set. Layers before the first refresh attend
dustin's set (the previous pass's history of the profile's heads). Teacher-forced perplexity ratio
to full attention, overall and at the last window offset (the only offset whose token no window
query has seen), on the pg19-harness windows (CPU).

    python probes/probe_refresh_layers.py OUT.json [windows] [context] [eval_tokens] [layer lists...]
    (defaults: 8 4096 256 "4,12,20" "2,6,10,14,18,22,26" "1,2,...,29")"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch

from dustin_eval.corpus import gutenberg_split
from dustin_eval.intervals import bootstrap, ppl_ratio
from dustin_eval.pg19 import iter_windows
from dustin_profile.artifact import load_profile
from dustin_runtime.pipeline import load_pair
from dustin_runtime.policies import make_policy
from dustin_runtime.provenance import provenance
from dustin_runtime.signals import TargetHistory, normalise_
from dustin_runtime.teacher_forced import teacher_forced_nll


def refresh_at(policy, layers: set[int], cfg):
    """`policy` (dustin, one set) re-selecting at each of `layers` from that layer's every KV head."""
    attend, scorers, buf = policy.verify_attend, {}, {}
    g = cfg.num_kv_heads
    for layer in layers:
        heads = tuple((layer, h, tuple(range(h * cfg.n_rep, (h + 1) * cfg.n_rep))) for h in range(g))
        scorers[layer] = TargetHistory(heads, "cpu", "sum", policy.ops)

    def verify_attend(layer, q, cache, ctx):
        if layer in scorers:
            out = buf.setdefault("s", torch.zeros_like(policy.history))
            scorers[layer].score(layer, q, cache.k[layer], ctx.start, out)
            c = policy.cfg
            policy.ops.select_indices(normalise_(out), None, ctx.start, policy.indices, sinks=c.sinks,
                                      window=c.window, m=c.free)
        return attend(layer, q, cache, ctx)

    policy.verify_attend = verify_attend
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *lists: str) -> None:
    torch.set_num_threads(2)
    t, d = load_pair("smollm2", "models/smollm2-draft", dtype=torch.float32, device="cpu")
    cfg = load_profile("profiles/smollm2-draft.json").to_sparse_config(512)
    wins = list(iter_windows(t.tokenizer, gutenberg_split("eval"), context + eval_tokens, max_windows=windows,
                             max_windows_per_book=1))
    sets = [sorted(map(int, x.split(","))) for x in (lists or ("4,12,20", "2,6,10,14,18,22,26",
                                                                ",".join(map(str, range(30)))))]
    variants = [("full", None), ("dustin", make_policy("dustin", cfg, target=t.model, draft=d.model))]
    for s in sets:
        variants.append((f"dustin, refreshed at layers {s}",
                         refresh_at(make_policy("dustin", cfg, target=t.model, draft=d.model), set(s), t.model.cfg)))
    res = teacher_forced_nll(t.model, d.model, [w.ids for w in wins], context, gamma=4, hooks=[h for _, h in variants])
    full, rows = res[0], []
    per = np.array(full.tokens) // 5
    for (name, _), r in zip(variants, res, strict=True):
        v, lo, hi = bootstrap(ppl_ratio, r.nll, r.tokens, full.nll, full.tokens)
        last = bootstrap(ppl_ratio, [a[4] for a in r.nll_by_offset], per, [b[4] for b in full.nll_by_offset], per)
        rows.append({"policy": name, "ppl": math.exp(sum(r.nll) / sum(r.tokens)), "ppl_ratio": [v, lo, hi],
                     "ppl_ratio_last": list(last)})
        print(f"{name[:70]:70s} ppl ratio {v:.4f} [{lo:.4f}, {hi:.4f}]  last offset {last[0]:.4f} "
              f"[{last[1]:.4f}, {last[2]:.4f}]", flush=True)
    json.dump({"provenance": provenance(models={"target": "smollm2", "draft": "models/smollm2-draft"}),
               "windows": windows, "context": context, "eval_tokens": eval_tokens, "budget": 512,
               "books": [w.book for w in wins], "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:])
