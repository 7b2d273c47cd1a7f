"""Probe: a skinny linear that loads its program's whole weight slice before it waits for the
previous kernel (programmatic dependent launch), so only the activations' load, one dot and the store
are left after the wait; against `skinny_linear` (which fetches its first K tile before the wait and
streams the rest after). Used for the two linears without split-K of the draft's layer: gate|up +
SwiGLU and the next qkv (+ bias). Timed as the post-attention sequence of the Qwen2.5-0.5B draft
(wo, add_rms_norm, gate|up + SwiGLU, w2, add_rms_norm, qkv) in one CUDA graph over 24 layers'
distinct weights, bf16, 16 and 32 rows. `python probes/probe_skinny_preload.py` -> $OUT/probe-skinny-preload.json"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl
from dustin_kernels.layer_ops import add_rms_norm
from dustin_kernels.skinny import skinny_linear, skinny_linear_ref, skinny_split
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dustin_eval.timing import graph_ms
from dustin_runtime.presets import preset


@triton.jit
def _preload_kernel(X, W, BIAS, Y, M, N, K, INTER, sxm, swn, sym,
                    HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    KP: tl.constexpr):
    pid = tl.program_id(0)
    dt = X.dtype.element_ty
    rm = tl.arange(0, BM)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, KP)
    nmask, kmask, mmask = rn < N, rk < K, rm < M
    wmask = nmask[:, None] & kmask[None, :]
    w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=wmask, other=0.0)  # the whole slice, before the wait
    if SWIGLU:
        wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
    gdc_wait()
    gdc_launch_dependents()
    x = tl.load(X + rm[:, None] * sxm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
    acc = tl.dot(x, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SWIGLU:
        g = acc.to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        u = tl.dot(x, tl.trans(wu)).to(dt).to(tl.float32)
        tl.store(Y + rm[:, None] * sym + rn[None, :], (s * u).to(dt), mask=omask)
    else:
        tl.store(Y + rm[:, None] * sym + rn[None, :], acc.to(dt), mask=omask)


def preload_linear(x, w, bias=None, swiglu=False, BN=16, warps=4):
    M, K = x.shape
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _preload_kernel[(triton.cdiv(N, BN),)](x, w, bias if bias is not None else w, y, M, N, K, N, x.stride(0),
                                           w.stride(0), y.stride(0), HAS_BIAS=bias is not None, SWIGLU=swiglu,
                                           BM=max(16, triton.next_power_of_2(M)), BN=BN,
                                           KP=triton.next_power_of_2(K), num_warps=warps, launch_pdl=True)
    return y


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@torch.inference_mode()
def main():
    c = preset("qwen2.5-0.5b")
    d, inter, q = c.hidden_size, c.intermediate_size, c.q_size
    n = c.q_size + 2 * c.kv_size
    dev, dt = torch.device("cuda"), torch.bfloat16

    def r(*shape, s=1.0):
        return (torch.randn(*shape, device=dev) * s).to(dt)

    W = [{"wo": r(d, q, s=q**-0.5), "n1": 1 + r(d, s=0.1), "w13": r(2 * inter, d, s=d**-0.5),
          "w2": r(d, inter, s=inter**-0.5), "n2": 1 + r(d, s=0.1), "wn": r(n, d, s=d**-0.5), "bn": r(n)}
         for _ in range(24)]
    out = {"gpu": torch.cuda.get_device_name(), "rows": {}}
    for M in (16, 32):
        o, x = r(M, q), r(M, d, s=2.0)
        res = {}
        for name, pre, BN, warps in (("skinny", False, 0, 0), ("preload BN16 w4", True, 16, 4),
                                     ("preload BN16 w8", True, 16, 8), ("preload BN32 w8", True, 32, 8),
                                     ("preload qkv only BN16 w4", "qkv", 16, 4)):
            def seq(w, o=o, x=x, pre=pre, BN=BN, warps=warps):
                h = skinny_linear(o, w["wo"], parts=skinny_split(w["wo"], dev))
                x1, y = add_rms_norm(x, h, w["n1"], 1e-6, partials=True)
                if pre is True:
                    a = preload_linear(y, w["w13"], swiglu=True, BN=BN, warps=warps)
                else:
                    a = skinny_linear(y, w["w13"], swiglu=True)
                p = skinny_linear(a, w["w2"], parts=skinny_split(w["w2"], dev))
                x2, y2 = add_rms_norm(x1, p, w["n2"], 1e-6, partials=True)
                if pre:
                    return x2, preload_linear(y2, w["wn"], bias=w["bn"], BN=BN, warps=warps), a, y, y2
                return x2, skinny_linear(y2, w["wn"], bias=w["bn"]), a, y, y2

            try:
                t = graph_ms([lambda w=w, f=seq: f(w) for w in W], replays=30, budget_ms=None, warmup=2)
                _, qkv, a, y, y2 = seq(W[0])
                err = max(rel(a, skinny_linear_ref(y, W[0]["w13"], swiglu=True)),
                          rel(qkv, skinny_linear_ref(y2, W[0]["wn"], bias=W[0]["bn"])))
                res[name] = {**t, "rel_err": err}
            except Exception as e:  # a variant that does not compile or fit is recorded
                res[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(M, name, res[name], flush=True)
        out["rows"][M] = res
    with open(os.path.join(os.environ.get("OUT", "."), "probe-skinny-preload.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
