"""Probe: dustin's signals scored on a side stream (`SignalPolicy.history_stream`: the target history
beside the rest of the verification pass; from bbf9e1e also the draft lookahead during the step's
last draft forward) against scoring them in line, end to end in `dustin bench e2e`'s loop (random
weights at the preset shapes, one process, the same caches): ms per step and the phases of each,
interleaved runs.

    python probes/probe_history_stream.py [policies] [batch] [context] [rounds]  -> $OUT/probe-history-stream.json"""

from __future__ import annotations

import sys

from common import e2e_ab

from dustin_runtime.sparse.policies import SignalPolicy


def main(policies: str = "dustin,dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2") -> None:
    e2e_ab(policies, batch, context, rounds, lambda on: setattr(SignalPolicy, "history_stream", on), "side_stream",
           "probe-history-stream.json")


if __name__ == "__main__":
    main(*sys.argv[1:])
