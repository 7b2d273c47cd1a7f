"""Probe: `sparse_verify_attention`'s launch settings (splits x rows per block x warps x stages) at
the shapes the loop runs, against the launcher's default, timed as `dustin bench attention` times it
(per call inside one CUDA graph of calls over distinct buffers and index sets). Every setting's
output is checked against the default's. Shapes (name, query heads, KV heads, head dim, batch,
queries, rows): the 7B and 72B targets' verification (M = 5 at S = 512), the 72B over two GPUs
(half the heads, batch 8), and the 0.5B draft's one-query forward over the verification set
(S + 2 gamma + 1 = 521 rows).

    python probes/probe_sparse_launch.py [shapes]   (comma-separated names; JSON to $OUT)
"""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch
from common import graph_us
from dustin_kernels import sparse_verify_attention

from dustin_eval.bench_attention import random_index_sets, verify_buffers
from dustin_runtime.io.provenance import provenance

SHAPES = {  # name: (H, G, D, B, M, S)
    "7b": (28, 4, 128, 16, 5, 512),
    "72b": (64, 8, 128, 16, 5, 512),
    "72b-tp2": (32, 4, 128, 8, 5, 512),
    "0.5b-draft": (14, 2, 64, 16, 1, 521),
}
N = 32768


@torch.inference_mode()
def sweep(name: str) -> dict:
    H, G, D, B, M, S = SHAPES[name]
    n_buf = 12
    ks, vs, qs, outs, lens = verify_buffers(B, H, G, D, N, M, n_buf, torch.bfloat16, "cuda")
    sets = random_index_sets(B, N, S, n_buf, "cuda")

    def timed(**kw) -> float:
        return graph_us(lambda i: sparse_verify_attention(qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], sets[i % n_buf],
                                                          lens, out=outs[i % n_buf], **kw), n=n_buf * 2)

    ref = sparse_verify_attention(qs[0], ks[0], vs[0], sets[0], lens).float()
    rows = [{"setting": "default", "us": timed()}]
    print(f"{name}: default {rows[0]['us']:.2f} us", flush=True)
    for splits, bn, warps, stages in itertools.product((1, 2, 3, 4, 6, 8), (32, 64, 128), (4, 8), (2, 3)):
        kw = dict(num_splits=splits, block_n=bn, num_warps=warps, num_stages=stages)
        try:
            err = (sparse_verify_attention(qs[0], ks[0], vs[0], sets[0], lens, **kw).float() - ref).abs().max().item()
            us = timed(**kw)
        except Exception as e:  # a setting over the shared memory limit
            rows.append({**kw, "error": type(e).__name__})
            continue
        rows.append({**kw, "us": us, "max_abs_diff_vs_default": err})
    best = min((r for r in rows if "us" in r and r.get("setting") != "default"), key=lambda r: r["us"])
    print(f"{name}: best {best}", flush=True)
    return {"shape": dict(zip("H G D B M S".split(), SHAPES[name], strict=True)), "N": N, "rows": rows, "best": best}


def main(shapes: str = ",".join(SHAPES)) -> None:
    out = {"provenance": provenance(), "shapes": {n: sweep(n) for n in shapes.split(",")}}
    path = os.path.join(os.environ.get("OUT", "."), "probe-sparse-launch.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
