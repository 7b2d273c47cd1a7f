"""Does attending the whole cache in a few layers close dustin's perplexity gap? Teacher-forced
perplexity (the pg19 harness's windows) of full attention, dustin (the committed profile, S = 512)
and dustin with layers `dense` verified over the whole cache, on the same windows.

    python probes/probe_dense_layers.py OUT.json [windows] [context] [eval_tokens] [dense sets...]
    (defaults: 8 4096 256 "0,1" "0" "0,1,29"; a dense set is comma-separated layer numbers)"""

from __future__ import annotations

import sys

from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.policies import make_policy


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
    sets = [set(map(int, x.split(","))) for x in (dense or ("0,1", "0", "0,1,29"))]
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens)
    variants = [("full", None), ("dustin", make_policy("dustin", cfg, target=t, draft=d))]
    variants += [(f"dustin+dense{sorted(s)}", dense_in(make_policy("dustin", cfg, target=t, draft=d), s))
                 for s in sets]
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=512)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:])
