"""Probe: the target history of a verification pass scored on the side stream while the next step
drafts (`SignalPolicy.history_in_draft`) against scoring it beside the rest of the pass (the side
stream, as before), end to end in `dustin bench e2e`'s loop (random weights at the preset shapes, one
process, the same caches): ms per step and the phases of each, interleaved runs. Arms `sN` score the
history in the draft with the scoring kernels' grids sized for N SMs (`signals.HISTORY_SMS`; fewer
programs beside the draft's kernels), `all` on the whole GPU's grids. (7eef98c ran the arms
beside,draft,s33,s16,s8 with `draft` = the whole GPU's grids, patching `srh_scores.num_sms`; d33c923
ran beside,draft. The `beside` arm needs d33c923 or earlier: scoring beside the pass was removed
after it.)

    python probes/probe_history_in_draft.py [policies] [batch] [context] [rounds] [arms]
      arms: comma-separated, of beside,draft,sN (default draft,all,s8)  -> $OUT/probe-history-in-draft.json"""

from __future__ import annotations

import sys

from common import e2e_arms

from dustin_runtime.sparse import signals
from dustin_runtime.sparse.policies import SignalPolicy

DEFAULT = signals.HISTORY_SMS


def arm(name: str) -> None:
    """beside: scored beside the pass; draft: in the draft on the default grids; all: in the draft on the
    whole GPU's grids; sN: in the draft on grids for N SMs."""
    if hasattr(SignalPolicy, "history_in_draft"):  # d33c923 and earlier
        SignalPolicy.history_in_draft = name != "beside"
    elif name == "beside":
        raise SystemExit("the beside arm runs against d33c923 or earlier (scoring beside the pass was removed)")
    signals.HISTORY_SMS = (DEFAULT if name in ("beside", "draft") else None if name == "all" else int(name[1:]))


def main(policies: str = "dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2",
         arms: str = "draft,all,s8") -> None:
    e2e_arms(policies, batch, context, rounds, arms.split(","), arm, "draft", "probe-history-in-draft.json")

if __name__ == "__main__":
    main(*sys.argv[1:])
