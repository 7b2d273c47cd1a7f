"""Probe: the draft's forwards over the set as one persistent CUDA kernel (`Transformer.whole`,
`dustin_kernels.draft_forward`) against the layer-by-layer Triton path, end to end in `dustin bench
e2e`'s loop (random weights at the preset shapes, one process), interleaved rounds. Arms: `layers`
(the kernel off), `whole` (on; 16 SMs left to the side stream's history scoring while drafting),
`whole-r0` (on, every SM). Runs against b3ecc3d, the last commit where the runtime routes draft
forwards to the kernel (removed after: measured slower, kernels/NOTES.md).

    python probes/probe_whole_draft.py [policies] [batch] [context] [rounds] [arms]
      -> $OUT/probe-whole-draft.json"""

from __future__ import annotations

import json
import os
import sys

import torch

from dustin_eval.bench_e2e import E2EConfig, run_e2e
from dustin_runtime import policies as pol
from dustin_runtime.model import Transformer

WHOLE_SET = Transformer._whole_set
FORWARD_SET = pol._DraftBackend.forward_set


def arm(name: str) -> None:
    Transformer._whole_set = WHOLE_SET if name != "layers" else (lambda self, backend, ctx, B, T: None)
    if name == "whole-r0":
        def forward_set(self, ctx):
            r = FORWARD_SET(self, ctx)
            return None if r is None else (r[0], 0)
        pol._DraftBackend.forward_set = forward_set
    else:
        pol._DraftBackend.forward_set = FORWARD_SET


def main(policies: str = "dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2",
         arms: str = "layers,whole,whole-r0") -> None:
    cfg = E2EConfig(batch=int(batch), context=int(context), policies=tuple(policies.split(",")), alphas=(),
                    phase_reps=10)
    rows = []
    for r in range(int(rounds)):
        for name in arms.split(","):
            arm(name)
            for rec in run_e2e(cfg, command="probe_whole_draft")["records"]:
                row = {"round": r, "arm": name, "policy": rec["policy"], "ms_per_step": rec["ms_per_step"],
                       "graph_phase_ms": rec["graph_phase_ms"]}
                rows.append(row)
                print(row, flush=True)
    arm("whole")
    with open(os.path.join(os.environ.get("OUT", "."), "probe-whole-draft.json"), "w") as f:
        json.dump({"config": {"batch": cfg.batch, "context": cfg.context, "policies": list(cfg.policies)},
                   "gpu": torch.cuda.get_device_name(), "commit": os.environ.get("DUSTIN_GIT_COMMIT"),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
