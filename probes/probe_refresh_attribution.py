"""Where does the perplexity that refresh layers leave come from? dustin with the profile's refresh
layers, and the same with one range of layers given full attention (their sets replaced by the
whole cache; every signal and refresh still computed): the ratio that remains when a range is made
exact is the loss the other ranges cause. Teacher-forced on the CPU, on calibration windows (a
diagnosis, not a choice made on the eval split).

    python probes/probe_refresh_attribution.py OUT.json [windows] [context] [eval_tokens] [split] [ranges...]
    (defaults: 8 4096 256 calib, the ranges between refresh layers; a range is A-B, layers A..B)"""

from __future__ import annotations

import sys

from common import report_set_ppl, smollm2_windows

from dustin_runtime.attention import TorchAttention
from dustin_runtime.sparse.policies import make_policy


def exact_at(policy, layers: set[int]):
    """`policy` with full attention at `layers` of its verification passes (signals untouched)."""
    full, sparse = TorchAttention(), policy.verify_attend

    def verify_attend(layer, q, cache, ctx):
        if layer not in layers:
            return sparse(layer, q, cache, ctx)
        policy.observe_verify(layer, q, cache, ctx)  # the refresh and history scoring still run
        return full.attend(layer, q, cache, ctx)

    policy.verify_attend = verify_attend
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, split: str = "calib",
         *spans: str) -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens, split, refresh=True)
    refresh = list(cfg.refresh_layers)
    n = t.cfg.num_layers
    bounds = [0, *refresh, n]
    ranges = [set(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False) if a < b]
    if spans:
        ranges = [set(range(int(x.split("-")[0]), int(x.split("-")[1]) + 1)) for x in spans]
    variants = [("full", None), ("dustin (profile, refresh at " + ",".join(map(str, refresh)) + ")",
                                 make_policy("dustin", cfg, target=t, draft=d))]
    for r in ranges:
        variants.append((f"dustin, layers {min(r)}-{max(r)} exact", exact_at(make_policy("dustin", cfg, target=t,
                                                                                        draft=d), r)))
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=512, split=split,
                   refresh_layers=refresh)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:])
