"""Probe: sparse drafting with RoPE and the cache write inside the draft's attention kernel
(`sparse_verify_attention_rope`) against the separate RoPE kernel, end to end in `dustin bench e2e`'s
loop (random weights at the preset shapes, one process, interleaved rounds): ms per step and phases.

    python probes/probe_fused_rope.py [policies] [batch] [context] [rounds]  -> $OUT/probe-fused-rope.json"""

from __future__ import annotations

import json
import os
import sys

import torch

from dustin_eval.bench_e2e import E2EConfig, run_e2e
from dustin_runtime import policies


def main(names: str = "dustin-vs,streamingllm-vs", batch: str = "16", context: str = "32768", rounds: str = "2"):
    cfg = E2EConfig(batch=int(batch), context=int(context), policies=tuple(names.split(",")), alphas=(), phase_reps=10)
    fused = policies._DraftBackend.attend_qkv
    rows = []
    for r in range(int(rounds)):
        for on in (True, False):
            policies._DraftBackend.attend_qkv = fused if on else (lambda self, *a: None)
            for rec in run_e2e(cfg, command="probe_fused_rope")["records"]:
                row = {"round": r, "fused_rope": on, "policy": rec["policy"], "ms_per_step": rec["ms_per_step"],
                       "graph_phase_ms": rec["graph_phase_ms"]}
                rows.append(row)
                print(row, flush=True)
    policies._DraftBackend.attend_qkv = fused
    with open(os.path.join(os.environ.get("OUT", "."), "probe-fused-rope.json"), "w") as f:
        json.dump({"config": {"batch": cfg.batch, "context": cfg.context, "policies": list(cfg.policies)},
                   "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
