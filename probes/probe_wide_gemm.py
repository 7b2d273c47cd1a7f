"""Probe: a swap-AB Triton GEMM for the target's verification linears (33-128 rows: batch x (gamma + 1)
tokens), against cuBLAS (F.linear, + the SwiGLU kernel after gate|up) and `skinny_linear`.

Swap-AB: each program owns BN output columns (= BN weight rows) and computes W_tile [BN, BK] @ x^T
[BK, BT] on the tensor cores, with the rows of x padded to BT (a power of two >= 16), so the wide
dimension of the MMA is the weights' and the narrow one the tokens'. Optional split-K (fp32 partial
sums, as `skinny_linear` leaves them for the next norm) and a SwiGLU epilogue for gate|up.

Shapes: Qwen2.5-7B's qkv / wo / w13 / w2 at 40 and 80 rows (batch 8 and 16, gamma 4), and the 0.5B
draft's at 16 and 32. CUDA graphs over distinct weight copies (no L2 reuse between calls).
`python probes/probe_wide_gemm.py [rows,...] [kinds,...]` -> $OUT/probe-wide-gemm.json."""

from __future__ import annotations

import itertools
import json
import os
import sys
from functools import partial

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
def _part(acc, w, X, rk, kmask, t0, M, sxm, BT: tl.constexpr):
    """acc [BN, BT] += w [BN, BK] @ x[t0:t0 + BT, rk]^T."""
    rt = t0 + tl.arange(0, BT)
    xt = tl.load(X + rt[None, :] * sxm + rk[:, None], mask=kmask[:, None] & (rt < M)[None, :], other=0.0)
    return tl.dot(w, xt, acc)


@triton.jit
def _store(Y, acc, acc2, pid_k, syp, sym, rn, nmask, t0, M, BT: tl.constexpr, SWIGLU: tl.constexpr,
           PARTIAL: tl.constexpr):
    dt = Y.dtype.element_ty
    rt = t0 + tl.arange(0, BT)
    omask = nmask[:, None] & (rt < M)[None, :]
    yp = Y + pid_k * syp + rt[None, :] * sym + rn[:, None]
    if SWIGLU:
        g = acc.to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(yp, (s * acc2.to(dt).to(tl.float32)).to(dt), mask=omask)
    elif PARTIAL:
        tl.store(yp, acc, mask=omask)
    else:
        tl.store(yp, acc.to(dt), mask=omask)


@triton.jit
def _wide_kernel(X, W, Y, M, N, K, K_SPLIT, INTER, sxm, swn, syp, sym,
                 SWIGLU: tl.constexpr, PARTIAL: tl.constexpr, TMA: tl.constexpr,
                 BN: tl.constexpr, BT: tl.constexpr, BT2: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """Rows [0, BT) of x in one MMA and [BT, BT + BT2) in a second (BT2 = 0: none), so 80 rows
    are 64 + 16 instead of 128; W through a TMA descriptor with TMA."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    a = tl.zeros([BN, BT], dtype=tl.float32)
    au = tl.zeros([BN, BT], dtype=tl.float32)
    b = tl.zeros([BN, BT2 if BT2 > 0 else 16], dtype=tl.float32)
    bu = tl.zeros([BN, BT2 if BT2 > 0 else 16], dtype=tl.float32)
    k_lo = pid_k * K_SPLIT
    for k0 in tl.range(k_lo, k_lo + K_SPLIT, BK, num_stages=STAGES):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        if TMA:
            w = W.load([pid_n * BN, k0])
        else:
            w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        a = _part(a, w, X, rk, kmask, 0, M, sxm, BT)
        if BT2 > 0:
            b = _part(b, w, X, rk, kmask, BT, M, sxm, BT2)
        if SWIGLU:
            if TMA:
                wu = W.load([INTER + pid_n * BN, k0])
            else:
                wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=nmask[:, None] & kmask[None, :],
                             other=0.0)
            au = _part(au, wu, X, rk, kmask, 0, M, sxm, BT)
            if BT2 > 0:
                bu = _part(bu, wu, X, rk, kmask, BT, M, sxm, BT2)
    _store(Y, a, au, pid_k, syp, sym, rn, nmask, 0, M, BT, SWIGLU, PARTIAL)
    if BT2 > 0:
        _store(Y, b, bu, pid_k, syp, sym, rn, nmask, BT, M, BT2, SWIGLU, PARTIAL)


def row_blocks(M, two):
    if not two:
        return max(16, next_pow2(M)), 0
    bt = max(16, 1 << (M.bit_length() - 1))  # largest power of two <= M (>= 16)
    rest = M - bt
    return (bt, 0) if rest <= 0 else (bt, max(16, next_pow2(rest)))


def wide_linear(x, w, *, swiglu=False, split=1, BN=128, BK=64, STAGES=4, warps=4, two=False, tma=False):
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
    bt, bt2 = row_blocks(M, two)
    wd = w
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        wd = TensorDescriptor.from_tensor(w, [BN, BK])
    _wide_kernel[(cdiv(N, BN), parts)](x, wd, y, M, N, K, k_split, N, x.stride(0), w.stride(0), syp, y.stride(-2),
                                       SWIGLU=swiglu, PARTIAL=split > 1, TMA=tma, BN=BN, BT=bt, BT2=bt2, BK=BK,
                                       STAGES=STAGES, num_warps=warps)
    return y


def shapes(cfg):  # kind: (rows of w, K)
    d, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"qkv": (q + 2 * kv, d), "wo": (d, q), "w13": (2 * i, d), "w2": (d, i)}


def timed(fns):
    return graph_ms(fns, replays=20, budget_ms=None, warmup=2)["median_ms"] * 1e3  # us per call


def check(M, N, K, sw, **kw):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5
    ref = F.linear(x.float(), w.float())
    if sw:
        g, u = ref.chunk(2, -1)
        ref = F.silu(g) * u
    for split in (1, 3):
        got = wide_linear(x, w, swiglu=sw, split=1 if sw else split, **kw).float()
        got = got.sum(0) if got.dim() == 3 else got
        err = (got - ref).abs().max().item() / ref.abs().max().item()
        assert err < 2e-2, (M, N, K, sw, split, err)


@torch.inference_mode()
def main(rows_arg: str = "80,40", kinds: str = "qkv,wo,w13,w2"):
    out = os.environ.get("OUT", ".")
    sms = num_sms(torch.device("cuda"))
    res = {"sms": sms, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "rows": {}}
    for M in (int(r) for r in rows_arg.split(",")):
        cfg = preset("qwen2.5-7b" if M > 32 else "qwen2.5-0.5b")
        res["rows"][M] = {}
        for kind, (N, K) in shapes(cfg).items():
            if kind not in kinds.split(","):
                continue
            sw = kind == "w13"
            for two, tma in ((False, False), (True, False), (True, True)):
                check(M, N, K, sw, two=two, tma=tma)
            copies = max(2, min(16, int(1.2e9 // (N * K * 2))))
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(copies)]
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            mb = N * K * 2 / 1e6

            def cub(w, x=x, sw=sw):
                y = F.linear(x, w)
                if sw:
                    swiglu(y)
            row = {"MB": mb, "cublas": timed([partial(cub, w) for w in ws])}
            if M <= MAX_ROWS:
                row["skinny"] = timed([partial(skinny_linear, x, w, swiglu=sw) for w in ws])
            grid = []
            splits = (1,) if sw else ((2, 4, 8) if N < 8192 else (1, 2, 4))
            for two, tma, BN, BK, st, wp, sp in itertools.product((False, True), (False, True), (64, 128), (64, 128),
                                                                  (3, 4), (4, 8), splits):
                if (BN == 64 and wp == 8) or (tma and not two):
                    continue
                if (st * (BN * (2 if sw else 1) + max(16, next_pow2(M))) * BK * 2) > 220 * 1024:
                    continue
                try:
                    t = timed([partial(wide_linear, x, w, swiglu=sw, split=sp, BN=BN, BK=BK, STAGES=st, warps=wp,
                                       two=two, tma=tma) for w in ws])
                except Exception as e:  # out of resources
                    t = None
                    print("skip", kind, M, BN, BK, st, wp, sp, type(e).__name__, flush=True)
                grid.append({"two": two, "tma": tma, "BN": BN, "BK": BK, "stages": st, "warps": wp, "split": sp, "us": t})
            ok = [g for g in grid if g["us"] is not None]
            best = min(ok, key=lambda g: g["us"])
            for two, tma in ((False, False), (True, False), (True, True)):
                sub = [g for g in ok if g["two"] == two and g["tma"] == tma]
                if sub:
                    bb = min(sub, key=lambda g: g["us"])
                    print(f"   M={M} {kind} two={two} tma={tma}: {bb['us']:.2f} {bb}", flush=True)
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
