"""Paired perplexity ratio of one policy between two `dustin eval pg19` runs on the same windows.

Reads each run's records-<context>.jsonl, matches the policy's windows by (book, window, start),
checks that full attention's NLL agrees on them (the same windows and model), and prints
ppl(B) / ppl(A) with a 95% bootstrap interval over the windows (`dustin_eval.intervals`).

    python probes/paired_pg19.py A_DIR B_DIR [context ...] [--policy dustin] [--budget 512]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dustin_eval.intervals import bootstrap, ppl_ratio


def load(folder: Path, context: int, policy: str, budget: int | None) -> dict:
    out = {}
    for line in (folder / f"records-{context}.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["policy"] == policy and r["budget"] == budget:
            out[(r["book"], r["window"], r["start"])] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("contexts", nargs="*", type=int, default=[4096, 7168])
    ap.add_argument("--policy", default="dustin")
    ap.add_argument("--budget", type=int, default=512)
    args = ap.parse_args()
    for ctx in args.contexts:
        fa, fb = (load(f, ctx, "full", None) for f in (args.a, args.b))
        pa, pb = (load(f, ctx, args.policy, args.budget) for f in (args.a, args.b))
        keys = sorted(set(pa) & set(pb))
        drift = max(abs(fa[k]["nll"] / fa[k]["tokens"] - fb[k]["nll"] / fb[k]["tokens"]) for k in keys)
        v, lo, hi = bootstrap(ppl_ratio, [pb[k]["nll"] for k in keys], [pb[k]["tokens"] for k in keys],
                              [pa[k]["nll"] for k in keys], [pa[k]["tokens"] for k in keys])
        print(f"context {ctx}: {len(keys)} windows, {args.policy} S={args.budget}: B / A = {v:.4f} "
              f"[{lo:.4f}, {hi:.4f}] (full attention's NLL per token differs by at most {drift:.2e})")


if __name__ == "__main__":
    main()
