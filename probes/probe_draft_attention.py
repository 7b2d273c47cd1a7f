"""Probe: `sparse_verify_attention` at the draft's shape over its verification set (Qwen2.5-0.5B:
14 query heads, 2 KV heads, D 64; batch 16, 32k cache, one query, S + 2 gamma + 1 = 521 rows), 24
layers' caches back to back in a CUDA graph: splits x rows per block x warps against the launcher's
default. JSON to $OUT/probe-draft-attention.json."""

from __future__ import annotations

import itertools
import json
import os

import torch
from dustin_kernels import sparse_verify_attention

from dustin_eval.timing import graph_ms


@torch.inference_mode()
def main(B=16, H=14, G=2, D=64, N=32768, rows=521, layers=24):
    dev, dt = "cuda", torch.bfloat16
    ks = [torch.randn(B, G, N + 8, D, device=dev, dtype=dt) for _ in range(layers)]
    vs = [torch.randn_like(k) for k in ks]
    q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
    lens = torch.full((B,), N, dtype=torch.int32, device=dev)
    idx = torch.stack([torch.sort(torch.randperm(N, device=dev)[:rows]).values for _ in range(B)]).int()

    def run(**kw):
        fns = [lambda k=k, v=v: sparse_verify_attention(q, k, v, idx, lens, **kw) for k, v in zip(ks, vs, strict=True)]
        return graph_ms(fns, replays=30, budget_ms=None, warmup=2)["median_ms"] * 1e3

    out = {"shape": dict(B=B, H=H, G=G, D=D, N=N, rows=rows), "default_us": run(), "grid": []}
    print(f"default: {out['default_us']:.2f} us per layer", flush=True)
    for sp, bn, nw in itertools.product((1, 2, 3, 4, 6, 8, 12), (16, 32, 64, 128), (1, 2, 4)):
        try:
            us = run(num_splits=sp, block_n=bn, num_warps=nw)
        except Exception as e:
            us = None
            print("fail", sp, bn, nw, type(e).__name__)
        out["grid"].append({"num_splits": sp, "block_n": bn, "num_warps": nw, "us": us})
    best = sorted((g for g in out["grid"] if g["us"]), key=lambda g: g["us"])[:6]
    print("best:", best, flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "probe-draft-attention.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
