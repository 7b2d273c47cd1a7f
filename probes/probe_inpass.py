"""In-pass selection: the verification pass re-selects the set at layer r from the current queries
of the retrieval heads of layers <= r (scored as the pass reaches them), and layers > r attend that
set; layers <= r attend the set chosen before the pass (from the previous pass's history, as
dustin does today). Teacher-forced perplexity ratio to full attention, overall and at the last
window offset, on the pg19-harness windows (CPU).

    python probes/probe_inpass.py OUT.json [windows] [context] [eval_tokens] [r values...]
    (defaults: 8 4096 256 3)"""

from __future__ import annotations

import sys
from dataclasses import replace

from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.config import every_head
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.sparse.signals import normalise_


def refresh_at(policy, r: int):
    """`policy` (dustin, one set) re-selecting at layer r from the pass's scores so far."""
    attend = policy.verify_attend

    def verify_attend(layer, q, cache, ctx):
        out = attend(layer, q, cache, ctx)  # scores this layer's retrieval heads, attends the current set
        if layer == r:
            c = policy.cfg
            g = policy.sig
            now = normalise_(g.history.clone())
            policy.ops.select_indices(now, None, ctx.start, g.indices, sinks=c.sinks, window=c.window, m=c.free)
        return out

    policy.verify_attend = verify_attend
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *rs: int) -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens)
    early = replace(cfg, target_heads=tuple(h for h in every_head(t.cfg) if h[0] <= 3))
    variants = [("full", None), ("dustin", make_policy("dustin", cfg, target=t, draft=d))]
    variants += [(f"dustin, in-pass at layer {r} (profile heads)",
                  refresh_at(make_policy("dustin", cfg, target=t, draft=d), r)) for r in rs or (3,)]
    variants.append(("dustin, in-pass at layer 3 (every KV head of layers 0-3)",
                     refresh_at(make_policy("dustin", early, target=t, draft=d), 3)))
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=512)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:]))
