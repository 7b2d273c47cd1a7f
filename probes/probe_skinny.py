"""Probe: `skinny_linear` at decode shapes (16 rows: the Qwen2.5-0.5B and Llama-3.2-1B drafts, the
Qwen2.5-7B target) against the cuBLAS path it would replace (F.linear, + the SwiGLU kernel after
gate|up), CUDA graphs over distinct weight copies (no L2 reuse between calls); a grid of block
sizes and K slices at the 0.5B draft's shapes. JSON to $OUT/probe-skinny.json.
`python probes/probe_skinny.py [rows]`."""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
from dustin_kernels._util import num_sms
from dustin_kernels.layer_ops import swiglu
from dustin_kernels.skinny import skinny_config, skinny_linear, skinny_split

from dustin_eval.timing import graph_ms
from dustin_runtime.presets import preset


def shapes(cfg):  # kind: (rows of w, K)
    d, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"qkv": (q + 2 * kv, d), "wo": (d, q), "w13": (2 * i, d), "w2": (d, i), "head": (cfg.vocab_size, d)}


def calls(kind, N, K, M, copies, parts=None, config=None, base=False):
    dev, dt = "cuda", torch.bfloat16
    ws = [torch.randn(N, K, device=dev, dtype=dt) * K**-0.5 for _ in range(copies)]
    x = torch.randn(M, K, device=dev, dtype=dt)
    b = torch.zeros(N, device=dev, dtype=dt) if kind == "qkv" else None
    fns = []
    for w in ws:
        if base:
            def f(w=w):
                y = F.linear(x, w, b)
                if kind == "w13":
                    swiglu(y)
        else:
            def f(w=w):
                skinny_linear(x, w, bias=b, swiglu=kind == "w13", parts=parts, config=config)
        fns.append(f)
    return fns


def timed(fns):
    return graph_ms(fns, replays=30, budget_ms=None, warmup=2)["median_ms"] * 1e3  # us per call


@torch.inference_mode()
def main(M=16):
    sms = num_sms(torch.device("cuda"))
    out = {"rows": M, "device": torch.cuda.get_device_name(), "sms": sms, "models": {}}
    for model in ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-7b"):
        cfg = preset(model)
        rec = {}
        for kind, (N, K) in shapes(cfg).items():
            copies = max(2, min(16, int(400e6 // (N * K * 2))))
            parts = skinny_split(torch.empty(N, K), torch.device("cuda")) if kind in ("wo", "w2") else None
            base = timed(calls(kind, N, K, M, copies, base=True))
            mine = timed(calls(kind, N, K, M, copies, parts=parts))
            c0 = skinny_config(M, N // 2 if kind == "w13" else N, K, parts or 1, kind == "w13", sms)
            r = {"N": N, "K": K, "bytes": N * K * 2, "cublas_path_us": base, "skinny_us": mine, "default_config": c0,
                 "parts": parts, "skinny_tbps": N * K * 2 / mine / 1e6, "grid": []}
            print(f"{model} {kind} N={N} K={K}: cublas path {base:.2f} us, skinny {mine:.2f} us "
                  f"({r['skinny_tbps']:.2f} TB/s) {c0} parts {parts}", flush=True)
            if model == "qwen2.5-0.5b":
                splits = [1, 2, 4, 7, 10, 16] if kind in ("wo", "w2") else [None]
                for bn, bk, st, nw, sp in itertools.product((16, 32, 64), (64, 128, 256), (3, 4), (2, 4), splits):
                    if kind == "head" and bn == 16:
                        continue
                    c = {"BN": bn, "BK": bk, "STAGES": st, "num_warps": nw}
                    try:
                        us = timed(calls(kind, N, K, M, copies, parts=sp, config=c))
                    except Exception as e:  # out of shared memory etc.
                        us = None
                        print("  fail", c, sp, type(e).__name__)
                    r["grid"].append({**c, "parts": sp, "us": us})
                best = sorted((g for g in r["grid"] if g["us"]), key=lambda g: g["us"])[:4]
                print("  best:", best, flush=True)
            rec[kind] = r
        out["models"][model] = rec
    with open(os.path.join(os.environ.get("OUT", "."), "probe-skinny.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
