"""Probe: `layer_tail` (a decoder layer after its attention as one persistent kernel) against the
skinny path's six kernels (wo, add_rms_norm, gate|up + SwiGLU, w2, add_rms_norm, the next qkv) at the
Qwen2.5-0.5B draft's shapes in bf16: one CUDA graph over 24 layers' distinct weights (no L2 reuse
between layers, as a forward runs them), 16 and 32 rows; then launch variants of the kernel (grid
size, columns per tile, K step, stages, warps, one launch vs a launch per phase). Each variant is
checked against the torch twin. `python probes/probe_layer_tail.py [rows,...] [layers]`
-> $OUT/probe-layer-tail.json. Runs against commit e81a066: `dustin_kernels.layer_tail` was removed
after this probe measured it slower than the skinny path (kernels/NOTES.md)."""

from __future__ import annotations

import json
import os
import sys

import torch
from dustin_kernels.layer_ops import add_rms_norm
from dustin_kernels.layer_tail import layer_tail, layer_tail_ref, tail_config
from dustin_kernels.skinny import skinny_linear, skinny_split

from dustin_eval.timing import graph_ms
from dustin_runtime.presets import preset


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.inference_mode()
def main(rows: str = "16,32", layers: str = "24"):
    c = preset("qwen2.5-0.5b")
    d, inter, q = c.hidden_size, c.intermediate_size, c.q_size
    n = c.q_size + 2 * c.kv_size
    dev, dt = torch.device("cuda"), torch.bfloat16
    L = int(layers)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, device=dev) * s).to(dt)

    W = [{"wo": r(d, q, s=q**-0.5), "n1": 1 + r(d, s=0.1), "w13": r(2 * inter, d, s=d**-0.5), "w2": r(d, inter, s=inter**-0.5),
          "n2": 1 + r(d, s=0.1), "wn": r(n, d, s=d**-0.5), "bn": r(n)} for _ in range(L)]
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = {"gpu": torch.cuda.get_device_name(), "shape": {"d": d, "inter": inter, "q": q, "n": n, "layers": L}, "rows": {}}
    for M in (int(x) for x in rows.split(",")):
        o, x = r(M, q), r(M, d, s=2.0)

        def skinny(w, o=o, x=x):
            h = skinny_linear(o, w["wo"], parts=skinny_split(w["wo"], dev))
            x1, y = add_rms_norm(x, h, w["n1"], 1e-6, partials=True)
            a = skinny_linear(y, w["w13"], swiglu=True)
            p = skinny_linear(a, w["w2"], parts=skinny_split(w["w2"], dev))
            x2, y2 = add_rms_norm(x1, p, w["n2"], 1e-6, partials=True)
            return x2, skinny_linear(y2, w["wn"], bias=w["bn"])

        def tail(w, o=o, x=x, **kw):
            return layer_tail(o, x, w["wo"], w["n1"], w["w13"], w["w2"], w["n2"], w["wn"], eps=1e-6, next_b=w["bn"], **kw)

        ref = layer_tail_ref(o, x, W[0]["wo"], W[0]["n1"], W[0]["w13"], W[0]["w2"], W[0]["n2"], W[0]["wn"], eps=1e-6,
                             next_b=W[0]["bn"])
        res = {}
        base = graph_ms([lambda w=w: skinny(w) for w in W], replays=30, budget_ms=None, warmup=2)
        res["skinny path (6 kernels)"] = {**base, "rel_err": max(rel(a, b) for a, b in zip(skinny(W[0]), ref, strict=True))}
        print(M, "skinny", res["skinny path (6 kernels)"], flush=True)
        cfg0 = tail_config(M)
        variants = [("default", {})]
        for P in (sms // 2, 2 * sms):
            variants.append((f"programs {P}", {"programs": P}))
        variants.append(("a launch per phase", {"phases_per_launch": 1}))
        for key, vals in (("BN", (32,)), ("BK", (64, 256)), ("STAGES", (2, 4)), ("num_warps", (2, 8))):
            for v in vals:
                variants.append((f"{key} {v}", {"config": {**cfg0, key: v}}))
        variants.append(("BN 32, programs 2 x SMs", {"config": {**cfg0, "BN": 32}, "programs": 2 * sms}))
        for name, kw in variants:
            try:
                t = graph_ms([lambda w=w, kw=kw: tail(w, **kw) for w in W], replays=30, budget_ms=None, warmup=2)
                err = max(rel(a, b) for a, b in zip(tail(W[0], **kw), ref, strict=True))
                res[name] = {**t, "rel_err": err}
            except Exception as e:  # a variant that does not fit (shared memory, registers) is recorded
                res[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(M, name, res[name], flush=True)
        out["rows"][M] = res
    with open(os.path.join(os.environ.get("OUT", "."), "probe-layer-tail.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
