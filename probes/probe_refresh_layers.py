"""How current must the verification set be? The verification pass re-selects the set at chosen
layers from the current queries of every KV head of that layer (its exact attention, as the pass
reaches it; the runtime's `refresh_layers`, `--refresh-layers`); each later layer attends the
latest such set. Layers before the first refresh attend
dustin's set (the previous pass's history of the profile's heads). Teacher-forced perplexity ratio
to full attention, overall and at the last window offset (the only offset whose token no window
query has seen), on the pg19-harness windows (CPU).

    python probes/probe_refresh_layers.py OUT.json [windows] [context] [eval_tokens] [layer lists...]
    (defaults: 8 4096 256 "4,12,20" "2,6,10,14,18,22,26" "1,2,...,29")"""

from __future__ import annotations

import sys
from dataclasses import replace

from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.policies import make_policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *lists: str) -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens)
    sets = [tuple(sorted(map(int, x.split(",")))) for x in (lists or ("4,12,20", "2,6,10,14,18,22,26",
                                                                       ",".join(map(str, range(30)))))]
    variants = [("full", None), ("dustin", make_policy("dustin", cfg, target=t, draft=d))]
    variants += [(f"dustin, refreshed at layers {list(s)}",
                  make_policy("dustin", replace(cfg, refresh_layers=s), target=t, draft=d)) for s in sets]
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=512)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:])
