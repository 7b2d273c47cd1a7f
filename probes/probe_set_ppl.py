"""Which verification sets keep teacher-forced perplexity: full attention, the committed dustin
profile (S = 512, m = 0), dustin with the draft's lookahead (every draft KV head) choosing m rows,
target-only (every target KV head), quest and the oracle, on the same pg19-harness windows. Reports
each policy's perplexity ratio to full attention, overall and at the last window offset (whose
token no window query has seen), with 95% bootstrap intervals over windows.

    python probes/probe_set_ppl.py OUT.json [windows] [context] [eval_tokens] [m values...]
    (defaults: 8 4096 256 64 197 320)"""

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
from dustin_runtime.sparse import every_head
from dustin_runtime.teacher_forced import teacher_forced_nll


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *ms: int) -> None:
    torch.set_num_threads(2)
    t, d = load_pair("smollm2", "models/smollm2-draft", dtype=torch.float32, device="cpu")
    cfg = load_profile("profiles/smollm2-draft.json").to_sparse_config(512)
    wins = list(iter_windows(t.tokenizer, gutenberg_split("eval"), context + eval_tokens, max_windows=windows,
                             max_windows_per_book=1))
    variants = [("full", None, None), ("dustin m=0 (profile)", "dustin", cfg)]
    for m in ms or (64, 197, 320):
        variants.append((f"dustin m={m} (all draft heads)", "dustin",
                         replace(cfg, m=m, draft_heads=every_head(d.model.cfg))))
    variants += [("target-only", "target-only", cfg), ("quest", "quest", cfg), ("oracle", "oracle", cfg)]
    hooks = [None if p is None else make_policy(p, c, target=t.model, draft=d.model) for _, p, c in variants]
    res = teacher_forced_nll(t.model, d.model, [w.ids for w in wins], context, gamma=4, hooks=hooks)
    full, rows = res[0], []
    per = np.array(full.tokens) // 5
    for (name, _, _), r in zip(variants, res, strict=True):
        v, lo, hi = bootstrap(ppl_ratio, r.nll, r.tokens, full.nll, full.tokens)
        last = [bootstrap(ppl_ratio, [a[i] for a in r.nll_by_offset], per, [b[i] for b in full.nll_by_offset], per)
                for i in (4,)][0]
        rows.append({"policy": name, "ppl": math.exp(sum(r.nll) / sum(r.tokens)), "ppl_ratio": [v, lo, hi],
                     "ppl_ratio_last": list(last)})
        print(f"{name:34s} ppl ratio {v:.4f} [{lo:.4f}, {hi:.4f}]  last offset {last[0]:.4f} "
              f"[{last[1]:.4f}, {last[2]:.4f}]", flush=True)
    json.dump({"provenance": provenance(models={"target": "smollm2", "draft": "models/smollm2-draft"}),
               "windows": windows, "context": context, "eval_tokens": eval_tokens, "budget": 512,
               "books": [w.book for w in wins], "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:]))
