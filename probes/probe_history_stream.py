"""Probe: dustin's signals scored on a side stream (`SignalPolicy.history_stream`: the target history
beside the rest of the verification pass; from bbf9e1e also the draft lookahead during the step's
last draft forward) against scoring them in line, end to end in `dustin bench e2e`'s loop (random weights at the preset
shapes, one process, the same caches): ms per step and the verify phase of each, interleaved runs.

    python probes/probe_history_stream.py [policies] [batch] [context] [rounds]  -> $OUT/probe-history-stream.json"""

from __future__ import annotations

import json
import os
import sys

import torch

from dustin_eval.bench_e2e import E2EConfig, run_e2e
from dustin_runtime.policies import SignalPolicy


def main(policies: str = "dustin,dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2") -> None:
    cfg = E2EConfig(batch=int(batch), context=int(context), policies=tuple(policies.split(",")), alphas=(),
                    phase_reps=10)
    rows = []
    for r in range(int(rounds)):
        for side in (True, False):
            SignalPolicy.history_stream = side
            res = run_e2e(cfg, command="probe_history_stream")
            for rec in res["records"]:
                row = {"round": r, "side_stream": side, "policy": rec["policy"], "ms_per_step": rec["ms_per_step"],
                       "graph_phase_ms": rec["graph_phase_ms"]}
                rows.append(row)
                print(row, flush=True)
    out = {"config": {"batch": cfg.batch, "context": cfg.context, "policies": list(cfg.policies)},
           "gpu": torch.cuda.get_device_name(), "rows": rows}
    with open(os.path.join(os.environ.get("OUT", "."), "probe-history-stream.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
