"""Which verification sets keep teacher-forced perplexity: full attention, the committed dustin
profile (S = 512, m = 0), dustin with the draft's lookahead (every draft KV head) choosing m rows,
target-only (every target KV head), quest and the oracle, on the same pg19-harness windows. Reports
each policy's perplexity ratio to full attention, overall and at the last window offset (whose
token no window query has seen), with 95% bootstrap intervals over windows.

    python probes/probe_set_ppl.py OUT.json [windows] [context] [eval_tokens] [m values...]
    (defaults: 8 4096 256 64 197 320)"""

from __future__ import annotations

import sys
from dataclasses import replace

from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.config import every_head
from dustin_runtime.sparse.policies import make_policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, *ms: int) -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens)
    variants = [("full", None), ("dustin m=0 (profile)", make_policy("dustin", cfg, target=t, draft=d))]
    variants += [(f"dustin m={m} (all draft heads)",
                  make_policy("dustin", replace(cfg, m=m, draft_heads=every_head(d.cfg)), target=t, draft=d))
                 for m in ms or (64, 197, 320)]
    variants += [(p, make_policy(p, cfg, target=t, draft=d)) for p in ("target-only", "quest", "oracle")]
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=512)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:]))
