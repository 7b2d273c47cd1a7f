"""Probe: the target history of a verification pass scored on the side stream while the next step
drafts (`SignalPolicy.history_in_draft`) against scoring it beside the rest of the pass (the side
stream, as before), end to end in `dustin bench e2e`'s loop (random weights at the preset shapes, one
process, the same caches): ms per step and the phases of each, interleaved runs.

    python probes/probe_history_in_draft.py [policies] [batch] [context] [rounds]  -> $OUT/probe-history-in-draft.json"""

from __future__ import annotations

import sys

from common import e2e_ab

from dustin_runtime.policies import SignalPolicy


def main(policies: str = "dustin,dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2") -> None:
    e2e_ab(policies, batch, context, rounds, lambda on: setattr(SignalPolicy, "history_in_draft", on), "in_draft",
           "probe-history-in-draft.json")


if __name__ == "__main__":
    main(*sys.argv[1:])
