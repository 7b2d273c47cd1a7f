"""Probe: `srh_scores` launch settings over label keys (r = 16 / 32 channels instead of D = 128), at the
72B scorers' shapes: 2 KV heads (the estimate's layer) and 8 (a refresh layer), 40 stacked queries per
KV head, batch 16, 32k rows. At r = 32 the default runs at ~23% of copy bandwidth
(results/bench/label-keys-da3c554): past the bytes, its cost is the exponentials (both passes
compute 64 padded queries x every row) and the programs' fixed work. Timed as `dustin bench
attention` times it (per call in one CUDA graph over distinct buffers); each setting checked against
the default's output.

    python probes/probe_srh_label_launch.py [widths]   (comma-separated; JSON to $OUT)
"""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch
from common import graph_us
from dustin_kernels import srh_scores

from dustin_runtime.io.provenance import provenance

B, N, M, D = 16, 32768, 40, 128


@torch.inference_mode()
def sweep(width: int, heads: int) -> dict:
    n_buf = 12
    g = torch.Generator(device="cuda").manual_seed(0)
    ks = [torch.randn(B, 8, N + 5, width, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_buf)]
    qs = [torch.randn(B, heads, M, width, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_buf)]
    kv = torch.arange(0, 8, 8 // heads, dtype=torch.int32, device="cuda")
    lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
    outs = [torch.empty(B, N + 5, device="cuda") for _ in range(4)]
    scale = D ** -0.5

    def timed(**kw) -> float:
        return graph_us(lambda i: srh_scores(qs[i % n_buf], kv, ks[i % n_buf], lens, out=outs[i % 4], scale=scale,
                                             **kw), n=n_buf * 2)

    ref = srh_scores(qs[0], kv, ks[0], lens, scale=scale)
    rows = [{"setting": "default", "us": timed()}]
    print(f"r {width}, {heads} heads: default {rows[0]['us']:.1f} us", flush=True)
    for bn, warps, stages, qm, store in itertools.product((64, 128, 256), (4, 8), (2, 3), (True, False),
                                                          (False, True)):
        kw = dict(block_n=bn, num_warps=warps, num_stages=stages, queries_as_m=qm, store_probs=store)
        try:
            err = ((srh_scores(qs[0], kv, ks[0], lens, scale=scale, **kw) - ref).abs().max() / ref.abs().max()).item()
            us = timed(**kw)
        except Exception as e:  # a setting over the shared memory or register limit
            rows.append({**kw, "error": type(e).__name__})
            continue
        rows.append({**kw, "us": us, "rel_diff_vs_default": err})
    best = min((r for r in rows if "us" in r and r.get("setting") != "default"), key=lambda r: r["us"])
    print(f"r {width}, {heads} heads: best {best}", flush=True)
    return {"width": width, "heads": heads, "rows": rows, "best": best}


def main(widths: str = "32,16") -> None:
    out = {"provenance": provenance(), "shape": {"B": B, "N": N, "M": M, "D": D},
           "sweeps": [sweep(int(w), h) for w in widths.split(",") for h in (2, 8)]}
    with open(os.path.join(os.environ.get("OUT", "."), "probe-srh-label-launch.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
