"""Skinny linear layers of a decode forward (a few rows: the draft's batch, one token each), with
the layer's RMSNorms and residual adds inside them and SwiGLU fused after the gate|up projection, so
a decoder layer is 5 kernels instead of 10 (the two norm kernels, cuBLAS's split-K reduce and the
SwiGLU kernel go), all of them Triton kernels launched as programmatic dependent launches on Hopper:

    qkv   = skinny_linear(x, wqkv, bias=bqkv, norm=RowNorm(ss, attn_norm, eps))
    (rope + cache write, attention)
    x, ss = skinny_residual(o, wo, x, parts=s)    # x + o @ wo.T, its rows' sums of squares [T, M]
    a     = skinny_linear(x, w13, swiglu=True, norm=RowNorm(ss, ffn_norm, eps))  # silu(gate) * up
    x, ss = skinny_residual(a, w2, x, parts=s)

At M <= 64 rows a GEMM is a read of its weights; cuBLAS runs the Qwen2.5-0.5B draft's shapes at 16
rows in 4-7 us each on an H200, latency-bound. Here one program owns BLOCK_N output columns and a K
slice and streams their weights once (probes/probe_skinny.py measured each shape against the cuBLAS
path).

wo and w2 are too narrow (N = d) to fill the GPU, so `skinny_residual` splits K: every program
writes its fp32 partial sums, takes a ticket from its column block's counter, and the last to arrive
adds the slices up in slice order (deterministic), rounds, adds the residual, and writes the new
residual and the sums of squares of its columns. The next linear's programs add those T sums per
row (a [T, M] load beside the first activation tile), so the norm costs no pass of its own: each
program scales its activation tiles by 1/rms and the norm weight as `rms_norm` rounds them. (An
earlier fused norm re-read the residual and every partial sum in every program of the next linear
and was slower than a norm kernel: probes/results/probe-skinny-69d90a9.json.)

On Hopper each launch is a programmatic dependent launch: a program fetches its first weight tile
while the previous kernel finishes, then waits for it (`gdc_wait`) before reading activations.

Rounding follows the model's reference path: the product rounded to the activation dtype before
the residual add; SwiGLU rounds gate and up to the activation dtype before it, as the unfused path's
bf16 projection does. `skinny_linear_ref` and `skinny_residual_ref` are the torch twins."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from dustin_kernels._util import cdiv, next_pow2, num_sms, pdl_supported, require, ticket_counters

try:  # grid dependency control; absent in older Triton
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the Triton version
    gdc_launch_dependents = gdc_wait = None

MAX_ROWS = 64  # what the kernel takes (shared memory at 64 rows checked)
ROUTE_ROWS = 32  # what a model sends it: at 40 rows cuBLAS is faster (H200, the 7B target's linears 140 vs 171 us
#                  per layer, probes/results/probe-skinny-40rows-d6e47e3.log); at 16 and 32 skinny wins or ties
SMEM = 160 * 1024  # shared memory a configuration may plan for (the H200 allows 227 KB per block)


@triton.jit
def _skinny_kernel(
    X, W, BIAS, Y,
    SS_IN, NW, XR, XO, SS_OUT, LOCKS, eps, n_ss,
    M, N, K, K_SPLIT, INTER,
    sxm, swn, syp, sym, ssi, sxr, sxo,
    HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, PREC: tl.constexpr,
    GDC: tl.constexpr = False, NORM: tl.constexpr = False, TS: tl.constexpr = 1,
    RESID: tl.constexpr = False, P: tl.constexpr = 1,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dt = X.dtype.element_ty
    rm = tl.arange(0, BM)
    mmask = rm < M
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc2 = tl.zeros([BM, BN], dtype=tl.float32)
    k_lo = pid_k * K_SPLIT
    k_first = k_lo
    rstd = tl.zeros([BM], dtype=tl.float32)
    if GDC:  # launched while the previous kernel finishes: fetch the first weight tile (constant), then wait
        rk = k_lo + tl.arange(0, BK)
        kmask = rk < K
        wmask = nmask[:, None] & kmask[None, :]
        w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        if SWIGLU:
            wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        gdc_wait()  # everything below may depend on the previous kernel
        gdc_launch_dependents()
        if NORM:
            rstd = _row_rstd(SS_IN, ssi, n_ss, rm, mmask, K, eps, TS)
        x = _x_tile(X, NW, sxm, rm, mmask, rk, kmask, rstd, NORM)
        acc = tl.dot(x, tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
        if SWIGLU:
            acc2 = tl.dot(x, tl.trans(wu.to(tl.float32).to(dt)), acc2, input_precision=PREC)
        k_first = k_lo + BK
    elif NORM:
        rstd = _row_rstd(SS_IN, ssi, n_ss, rm, mmask, K, eps, TS)
    for k0 in tl.range(k_first, k_lo + K_SPLIT, BK, num_stages=STAGES):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        wmask = nmask[:, None] & kmask[None, :]
        w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        if SWIGLU:
            wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        x = _x_tile(X, NW, sxm, rm, mmask, rk, kmask, rstd, NORM)
        acc = tl.dot(x, tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
        if SWIGLU:
            acc2 = tl.dot(x, tl.trans(wu.to(tl.float32).to(dt)), acc2, input_precision=PREC)
    omask = mmask[:, None] & nmask[None, :]
    yp = Y + pid_k * syp + rm[:, None] * sym + rn[None, :]
    if RESID:  # the residual stream's next value; the last program of a column block adds up the K slices
        if P == 1:
            _add_residual(acc, BIAS, XR, XO, SS_OUT, sxr, sxo, pid_n, M, rm, mmask, rn, nmask, HAS_BIAS)
        else:
            tl.store(yp, acc, mask=omask)
            tl.debug_barrier()  # every thread's slice is written before the ticket (release)
            ticket = tl.atomic_add(LOCKS + pid_n, 1, sem="acq_rel")
            if ticket == P - 1:
                h = tl.zeros([BM, BN], dtype=tl.float32)
                for p in tl.static_range(P):  # in slice order, whichever program arrives last
                    h += tl.load(Y + p * syp + rm[:, None] * sym + rn[None, :], mask=omask, other=0.0,
                                 cache_modifier=".cg")
                _add_residual(h, BIAS, XR, XO, SS_OUT, sxr, sxo, pid_n, M, rm, mmask, rn, nmask, HAS_BIAS)
                tl.atomic_xchg(LOCKS + pid_n, 0)
    else:
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            g = acc.to(dt).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            tl.store(yp, (s * acc2.to(dt).to(tl.float32)).to(Y.dtype.element_ty), mask=omask)
        else:
            tl.store(yp, acc.to(Y.dtype.element_ty), mask=omask)


@triton.jit
def _row_rstd(SS, ssi, n_ss, rm, mmask, K, eps, TS: tl.constexpr):
    """1 / rms of each row from the producer's per-column-block sums of squares [n_ss, M]."""
    rt = tl.arange(0, TS)
    ss = tl.load(SS + rt[:, None] * ssi + rm[None, :], mask=(rt < n_ss)[:, None] & mmask[None, :], other=0.0)
    return tl.rsqrt(tl.sum(ss, 0) / K + eps)  # [BM]


@triton.jit
def _x_tile(X, NW, sxm, rm, mmask, rk, kmask, rstd, NORM: tl.constexpr):
    """A [BM, BK] tile of the activations; with NORM, RMSNorm'd as `rms_norm` rounds it."""
    dt = X.dtype.element_ty
    x = tl.load(X + rm[:, None] * sxm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
    x = x.to(tl.float32)  # (the interpreter's bf16 needs the round trip; it folds on the GPU)
    if NORM:
        nw = tl.load(NW + rk, mask=kmask, other=0.0).to(tl.float32)
        x = (x * rstd[:, None]).to(dt).to(tl.float32) * nw[None, :]
    return x.to(dt)


@triton.jit
def _add_residual(h, BIAS, XR, XO, SS_OUT, sxr, sxo, pid_n, M, rm, mmask, rn, nmask, HAS_BIAS: tl.constexpr):
    """x' = x + round(h (+ bias)) for one column block, stored, and its rows' sums of squares."""
    dt = XO.dtype.element_ty
    if HAS_BIAS:
        h += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    omask = mmask[:, None] & nmask[None, :]
    xr = tl.load(XR + rm[:, None] * sxr + rn[None, :], mask=omask, other=0.0).to(tl.float32)
    xo = (xr + h.to(dt).to(tl.float32)).to(dt)
    tl.store(XO + rm[:, None] * sxo + rn[None, :], xo, mask=omask)
    xf = xo.to(tl.float32)
    tl.store(SS_OUT + pid_n * M + rm, tl.sum(xf * xf, 1), mask=mmask)


def _rows2(t: torch.Tensor) -> torch.Tensor:
    require(t.stride(-1) == 1, "the last dimension must be contiguous")
    return t.reshape(-1, t.shape[-1])


def skinny_split(w: torch.Tensor, device: torch.device) -> int:
    """Split-K slices for `skinny_residual` (whose N is too narrow to fill the GPU): about one program per SM
    at 64 columns each, slices of >= 128 of the K dimension (probes/probe_skinny.py)."""
    N, K = w.shape
    return max(1, min(cdiv(num_sms(device), cdiv(N, 64)), K // 128))


def skinny_config(M: int, N: int, K: int, split_k: int, swiglu: bool, sms: int, itemsize: int = 2) -> dict:
    """Block sizes (probes/probe_skinny.py): 64 columns and 128-wide K steps per program, fewer
    columns when that leaves programs for less than a wave; stages cut to fit the shared memory.
    SwiGLU (two accumulators): up to 32 padded rows, at most 512 accumulator cells per program and
    2 warps (gate|up of Qwen2.5-0.5B at 32 rows, H200: 9.8 us with 32 columns and 4 warps, 7.6
    with 16 and 2; 16 rows: 7.7 / 7.5); at 64 padded rows 4 warps and no cap (with the cap, the
    7B target's verification at batch 8, 40 rows, was 0.26 ms slower)."""
    bm = max(16, next_pow2(M))
    small = swiglu and bm <= 32
    bn = 64
    while bn > 16 and (cdiv(N, bn) * split_k < sms or (small and bm * bn > 512)):
        bn //= 2
    bk = 128 if K >= 128 else max(16, next_pow2(K))
    stages = 4
    while stages > 2 and stages * (bm + bn * (2 if swiglu else 1)) * bk * itemsize > SMEM:
        stages -= 1
    return {"BN": bn, "BK": bk, "STAGES": stages, "num_warps": 4 if swiglu and not small else 2}


class RowNorm(NamedTuple):
    """An RMSNorm applied to a skinny linear's input rows inside the kernel: `sumsq` [T, M] are the
    rows' sums of squares in T column blocks (what `skinny_residual` writes beside the residual)."""

    sumsq: torch.Tensor  # [T, M] float32
    weight: torch.Tensor  # [K]
    eps: float


def skinny_linear(
    x: torch.Tensor,  # [..., K] activations (bf16 / fp16 / fp32), rows adjacent in the last dim
    w: torch.Tensor,  # [N, K] (or [2N, K]: gate | up with swiglu), contiguous, x's dtype
    *,
    bias: torch.Tensor | None = None,  # [N]
    swiglu: bool = False,  # out = silu(gate) * up of the [2N] projection
    norm: RowNorm | None = None,  # x is the residual stream: the product is of rms_norm(x, weight)
    config: dict | None = None,
) -> torch.Tensor:
    """(rms_norm(x) or x) @ w.T (+ bias; SwiGLU'd) as [..., N] in x's dtype."""
    x2, M, K, N = _check(x, w, bias, swiglu)
    cfg = config or skinny_config(M, N, K, 1, swiglu, num_sms(x.device), x.element_size())
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if norm is not None:
        ss, nw = norm.sumsq, norm.weight
        require(ss.dim() == 2 and ss.shape[1] == M and ss.dtype == torch.float32 and ss.stride(1) == 1,
                f"norm.sumsq must be float32 [T, {M}] with adjacent rows")
        require(tuple(nw.shape) == (K,) and nw.is_contiguous(), f"norm.weight must be a contiguous [{K}]")
        extra = dict(SS_IN=ss, NW=nw, eps=float(norm.eps), n_ss=ss.shape[0], ssi=ss.stride(0), NORM=True,
                     TS=next_pow2(ss.shape[0]))
    else:
        extra = {}
    _launch(x2, w, bias, y, M, N, K, cfg, 1, swiglu, 0, y.stride(0), extra)
    return y.view(*x.shape[:-1], N)


def skinny_residual(
    x: torch.Tensor,  # [..., K] activations
    w: torch.Tensor,  # [N, K], contiguous, x's dtype
    residual: torch.Tensor,  # [..., N] the residual stream (x's rows), last dim contiguous
    *,
    bias: torch.Tensor | None = None,  # [N]
    parts: int = 1,  # split K into <= this many slices
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + x @ w.T (+ bias), rounded as the unfused path rounds: the product to x's dtype,
    then the sum), and its rows' sums of squares [T, M] float32 by column block, for the next
    `skinny_linear(..., norm=RowNorm(sumsq, ...))`. Under split-K the last program of a column
    block to finish (a ticket) adds up the slices' fp32 partial sums in slice order."""
    x2, M, K, N = _check(x, w, bias, False)
    r2 = _rows2(residual)
    require(tuple(r2.shape) == (M, N), f"residual must hold {M} rows of {N}, got {list(residual.shape)}")
    require(r2.dtype == x.dtype and r2.device == x.device, "residual must have x's dtype and device")
    require(parts >= 1, "parts must be >= 1")
    cfg = config or skinny_config(M, N, K, parts, False, num_sms(x.device), x.element_size())
    k_split = cdiv(cdiv(K, parts), cfg["BK"]) * cfg["BK"]
    n_parts, n_blocks = cdiv(K, k_split), cdiv(N, cfg["BN"])
    y = torch.empty(n_parts if n_parts > 1 else 0, M, N, dtype=torch.float32, device=x.device)
    xo = torch.empty(M, N, dtype=x.dtype, device=x.device)
    ss = torch.empty(n_blocks, M, dtype=torch.float32, device=x.device)
    locks = ticket_counters(x.device, n_blocks, "skinny") if n_parts > 1 else ss
    extra = dict(XR=r2, XO=xo, SS_OUT=ss, LOCKS=locks, sxr=r2.stride(0), sxo=xo.stride(0), RESID=True, P=n_parts)
    _launch(x2, w, bias, y, M, N, K, cfg, parts, False, M * N, N, extra)
    return xo.view(*residual.shape), ss


def _check(x, w, bias, swiglu):
    x2 = _rows2(x)
    M, K = x2.shape
    require(1 <= M <= MAX_ROWS, f"skinny_linear takes 1..{MAX_ROWS} rows, got {M}")
    require(w.dim() == 2 and w.shape[1] == K and w.is_contiguous(), f"w must be a contiguous [N, {K}] matrix")
    require(w.dtype == x.dtype and w.device == x.device, "w must have x's dtype and device")
    require(not swiglu or w.shape[0] % 2 == 0, "swiglu needs an even number of weight rows (gate | up)")
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    if bias is not None:
        require(tuple(bias.shape) == (N,), f"bias must have shape [{N}]")
    return x2, M, K, N


def _launch(x2, w, bias, y, M, N, K, cfg, parts, swiglu, syp, sym, extra):
    BK = cfg["BK"]
    k_split = cdiv(cdiv(K, parts), BK) * BK
    gdc = pdl_supported(x2.device)
    args = dict(SS_IN=w, NW=w, XR=w, XO=w, SS_OUT=w, LOCKS=w, eps=0.0, n_ss=0, ssi=0, sxr=0, sxo=0)
    args.update(extra)
    _skinny_kernel[(cdiv(N, cfg["BN"]), cdiv(K, k_split))](
        x2, w, bias if bias is not None else w, y,
        args.pop("SS_IN"), args.pop("NW"), args.pop("XR"), args.pop("XO"), args.pop("SS_OUT"),
        args.pop("LOCKS"), args.pop("eps"), args.pop("n_ss"),
        M, N, K, k_split, N,
        x2.stride(0), w.stride(0), syp, sym, args.pop("ssi"), args.pop("sxr"), args.pop("sxo"),
        HAS_BIAS=bias is not None, SWIGLU=swiglu,
        BM=max(16, next_pow2(M)), BN=cfg["BN"], BK=BK, STAGES=cfg["STAGES"],
        PREC="ieee" if x2.dtype == torch.float32 else "tf32", GDC=gdc, num_warps=cfg["num_warps"],
        **args, **({"launch_pdl": True} if gdc else {}),
    )


def skinny_linear_ref(x, w, *, bias=None, swiglu=False, norm=None):
    """The torch twin of `skinny_linear` (fp32 math, the reference path's roundings)."""
    dt = x.dtype
    lead, K = x.shape[:-1], x.shape[-1]
    if norm is not None:
        x = rms_norm_rows_ref(x.reshape(-1, K), norm.sumsq, norm.weight, norm.eps)
    y = x.reshape(-1, K).float() @ w.float().t()
    if bias is not None:
        y = y + bias.float()
    if swiglu:
        g, u = y.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(g.to(dt).float()).to(dt).float() * u.to(dt).float()).to(dt)
    else:
        y = y.to(dt)
    return y.view(*lead, -1)


def rms_norm_rows_ref(x, sumsq, weight, eps):
    """rms_norm of rows x [M, K] given their sums of squares [T, M] (as `layer_ops.rms_norm_ref` rounds)."""
    rstd = torch.rsqrt(sumsq.double().sum(0) / x.shape[-1] + eps).float()  # [M]
    return (weight.float() * (x.float() * rstd[:, None]).to(x.dtype).float()).to(x.dtype)


def skinny_residual_ref(x, w, residual, *, bias=None):
    """The torch twin of `skinny_residual`: (residual + round(x @ w.T (+ bias)), sums of squares [1, M])."""
    xo = (residual.float() + skinny_linear_ref(x, w, bias=bias).float()).to(residual.dtype)
    return xo, xo.float().reshape(-1, xo.shape[-1]).pow(2).sum(-1).unsqueeze(0)
