"""Probe: a swap-AB Triton GEMM for the target's verification linears (33-128 rows: batch x (gamma + 1)
tokens), against cuBLAS (F.linear, + the SwiGLU kernel after gate|up) and `skinny_linear`.

Swap-AB: each program owns BN output columns (= BN weight rows) and computes W_tile [BN, BK] @ x^T
[BK, BT] on the tensor cores, with the rows of x padded to BT (a power of two >= 16), so the wide
dimension of the MMA is the weights' and the narrow one the tokens'. Optional split-K (fp32 partial
sums, as `skinny_linear` leaves them for the next norm) and a SwiGLU epilogue for gate|up.

Shapes: Qwen2.5-7B's qkv / wo / w13 / w2 at 40 and 80 rows (batch 8 and 16, gamma 4), and the 0.5B
draft's at 16 and 32. CUDA graphs over distinct weight copies (no L2 reuse between calls).
`python probes/probe_wide_gemm.py [rows,...]` -> $OUT/probe-wide-gemm.json."""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from dustin_kernels._util import cdiv, next_pow2, num_sms
from dustin_kernels.layer_ops import swiglu
from dustin_kernels.skinny import MAX_ROWS, skinny_linear

from dustin_eval.timing import graph_ms
from dustin_runtime.presets import preset


@triton.jit
def _wide_kernel(X, W, Y, M, N, K, K_SPLIT, INTER, sxm, swn, syp, sym,
                 SWIGLU: tl.constexpr, PARTIAL: tl.constexpr,
                 BN: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dt = X.dtype.element_ty
    rn = pid_n * BN + tl.arange(0, BN)
    rt = tl.arange(0, BT)
    nmask = rn < N
    tmask = rt < M
    acc = tl.zeros([BN, BT], dtype=tl.float32)
    acc2 = tl.zeros([BN, BT], dtype=tl.float32)
    k_lo = pid_k * K_SPLIT
    for k0 in tl.range(k_lo, k_lo + K_SPLIT, BK, num_stages=STAGES):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        xt = tl.load(X + rt[None, :] * sxm + rk[:, None], mask=kmask[:, None] & tmask[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
        if SWIGLU:
            wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=nmask[:, None] & kmask[None, :],
                         other=0.0)
            acc2 = tl.dot(wu, xt, acc2)
    omask = nmask[:, None] & tmask[None, :]
    yp = Y + pid_k * syp + rt[None, :] * sym + rn[:, None]
    if SWIGLU:
        g = acc.to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(yp, (s * acc2.to(dt).to(tl.float32)).to(Y.dtype.element_ty), mask=omask)
    elif PARTIAL:
        tl.store(yp, acc, mask=omask)
    else:
        tl.store(yp, acc.to(Y.dtype.element_ty), mask=omask)


def wide_linear(x, w, *, swiglu=False, split=1, BN=128, BK=64, STAGES=4, warps=4):
    M, K = x.shape
    n_w = w.shape[0]
    N = n_w // 2 if swiglu else n_w
    k_split = cdiv(cdiv(K, split), BK) * BK
    parts = cdiv(K, k_split)
    if split > 1:
        y = torch.empty(parts, M, N, dtype=torch.float32, device=x.device)
        syp = y.stride(0)
    else:
        y = torch.empty(M, N, dtype=x.dtype, device=x.device)
        syp = 0
    _wide_kernel[(cdiv(N, BN), parts)](x, w, y, M, N, K, k_split, N, x.stride(0), w.stride(0), syp, y.stride(-2),
                                       SWIGLU=swiglu, PARTIAL=split > 1, BN=BN, BT=max(16, next_pow2(M)), BK=BK,
                                       STAGES=STAGES, num_warps=warps)
    return y


def shapes(cfg):  # kind: (rows of w, K)
    d, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"qkv": (q + 2 * kv, d), "wo": (d, q), "w13": (2 * i, d), "w2": (d, i)}


def timed(fns):
    return graph_ms(fns, replays=20, budget_ms=None, warmup=2)["median_ms"] * 1e3  # us per call


def check(M, N, K, sw):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5
    ref = F.linear(x.float(), w.float())
    if sw:
        g, u = ref.chunk(2, -1)
        ref = F.silu(g) * u
    for split in (1, 3):
        got = wide_linear(x, w, swiglu=sw, split=1 if sw else split).float()
        got = got.sum(0) if got.dim() == 3 else got
        err = (got - ref).abs().max().item() / ref.abs().max().item()
        assert err < 2e-2, (M, N, K, sw, split, err)


@torch.inference_mode()
def main(rows_arg: str = "80,40"):
    out = os.environ.get("OUT", ".")
    sms = num_sms(torch.device("cuda"))
    res = {"sms": sms, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": {}}
    for M in (int(r) for r in rows_arg.split(",")):
        cfg = preset("qwen2.5-7b" if M > 32 else "qwen2.5-0.5b")
        res["rows"][M] = {}
        for kind, (N, K) in shapes(cfg).items():
            sw = kind == "w13"
            check(M, N, K, sw)
            copies = max(2, min(16, int(1.2e9 // (N * K * 2))))
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(copies)]
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            mb = N * K * 2 / 1e6

            def cub(w):
                y = F.linear(x, w)
                if sw:
                    swiglu(y)
            row = {"MB": mb, "cublas": timed([lambda w=w: cub(w) for w in ws])}
            if M <= MAX_ROWS:
                row["skinny"] = timed([lambda w=w: skinny_linear(x, w, swiglu=sw) for w in ws])
            grid = []
            splits = (1,) if sw else ((1, 2, 4, 8) if N < 8192 else (1, 2, 4))
            for BN, BK, st, wp, sp in itertools.product((64, 128), (64, 128), (3, 4), (4, 8), splits):
                if BN == 64 and wp == 8:
                    continue
                if (st * (BN * (2 if sw else 1) + max(16, next_pow2(M))) * BK * 2) > 200 * 1024:
                    continue
                try:
                    t = timed([lambda w=w: wide_linear(x, w, swiglu=sw, split=sp, BN=BN, BK=BK, STAGES=st, warps=wp)
                               for w in ws])
                except Exception as e:  # out of resources
                    t = None
                    print("skip", kind, M, BN, BK, st, wp, sp, type(e).__name__, flush=True)
                grid.append({"BN": BN, "BK": BK, "stages": st, "warps": wp, "split": sp, "us": t})
            ok = [g for g in grid if g["us"] is not None]
            best = min(ok, key=lambda g: g["us"])
            row["wide_best"] = best
            row["wide_grid"] = grid
            res["rows"][M][kind] = row
            print(f"M={M} {kind} {mb:.1f} MB: cublas {row['cublas']:.2f} us ({mb / row['cublas'] / 1e-3 / 1e3:.2f} TB/s)"
                  + (f", skinny {row['skinny']:.2f}" if "skinny" in row else "")
                  + f", wide best {best['us']:.2f} ({mb / best['us'] / 1e-3 / 1e3:.2f} TB/s) {best}", flush=True)
            del ws
            torch.cuda.empty_cache()
    with open(os.path.join(out, "probe-wide-gemm.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
