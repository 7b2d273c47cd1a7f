"""Can a refreshed set serve the layers after it better? (probe_refresh_attribution.py: the loss left by
refresh layers sits in the layers that borrow the refresh layer's set.) Variants of what a refresh
layer selects from, teacher-forced on the CPU on calibration windows:
  replace  - that layer's current scores (the runtime's refresh);
  blend    - those + the set's own signal from before the pass (the history the step selected with),
             each normalised to sum 1 per sequence;
  cumulate - the scores of every refresh layer so far in the pass (layer 17 selects from 5 + 17).

    python probes/probe_refresh_blend.py OUT.json [windows] [context] [eval_tokens] [split]
    (defaults: 8 4096 256 calib)"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.policies import make_policy


def variant(policy, mode: str):
    """`policy` (dustin with refresh layers) selecting at its refresh layers as `mode` says: the
    runtime's refresh runs first (history scoring, this layer's scores normalised into `current`,
    its selection), then the set is selected again from the mode's scores."""
    if mode == "replace":
        return policy
    select, observe, first = policy.select, policy.observe_verify, min(policy.cfg.refresh_layers)
    kept = {}

    def select_and_keep(lens):
        select(lens)
        kept["history"] = policy.history.clone()  # normalised by select: the pre-pass signal

    def observe_verify(layer, q, cache, ctx):
        if layer not in policy.refresh:
            return observe(layer, q, cache, ctx)
        earlier = policy.current.clone() if mode == "cumulate" and layer != first else None
        observe(layer, q, cache, ctx)
        if mode == "blend":
            scores = policy.current + kept["history"]
        elif earlier is not None:  # the earlier refresh layers' scores, kept for the next one
            scores = policy.current.add_(earlier)
        else:
            return
        c = policy.cfg
        policy.ops.select_indices(scores, None, ctx.start, policy.indices, sinks=c.sinks, window=c.window, m=c.free)

    policy.select = select_and_keep
    policy.observe_verify = observe_verify
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, split: str = "calib") -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens, split, refresh=True)
    refresh = list(cfg.refresh_layers)
    variants = [("full", None), ("dustin, no refresh", make_policy("dustin", replace(cfg, refresh_layers=()),
                                                                    target=t, draft=d))]
    for mode in ("replace", "blend", "cumulate"):
        variants.append((f"dustin, refresh {refresh}: {mode}", variant(make_policy("dustin", cfg, target=t, draft=d),
                                                                       mode)))
    torch.manual_seed(0)
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=512, split=split,
                   refresh_layers=refresh)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:5])
