"""Intervals of committed acceptance runs, recomputed from their runs files with the product's own
`dustin_eval.acceptance.intervals` (tables written before `tau_ci` existed lack tau's interval).

    python probes/acceptance_ci.py results/acceptance-24x256/*.runs.jsonl

Per (file, context, policy, budget): tau [95%], accepted drafts per step [95%] (tau - 1), retention
vs full, paired drafting retention and the share of drafts the context lookup copied, where recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dustin_eval.acceptance import intervals


def main(paths: list[str]) -> None:
    for path in paths:
        recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        for r in recs:
            full = next(f for f in recs if f["context"] == r["context"] and f["policy"] == "full")
            ci = intervals(r, full)
            lo, hi = ci["tau_ci"]
            line = (f"{Path(path).name.removesuffix('.runs.jsonl')}  context {r['context']}  {r['policy']:>8} "
                    f"S={r['budget']}: tau {r['tau']:.3f} [{lo:.3f}, {hi:.3f}], accepted/step {r['tau'] - 1:.3f} "
                    f"[{lo - 1:.3f}, {hi - 1:.3f}]")
            if r["policy"] != "full":
                rlo, rhi = ci["retention_ci"]
                line += f", retention {r['tau'] / full['tau']:.3f} [{rlo:.3f}, {rhi:.3f}]"
            if r.get("draft_retention") is not None:
                dlo, dhi = ci["draft_retention_ci"]
                line += f", paired drafting retention {r['draft_retention']:.3f} [{dlo:.3f}, {dhi:.3f}]"
            if r.get("lookup_share") is not None:
                line += f", lookup share {r['lookup_share']:.3f}"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
