"""Skinny linear layers of a decode forward (a few rows: the draft's batch, one token each): split-K
with the partial sums left for the next norm to add, and SwiGLU fused after the gate|up projection,
so a decoder layer is 7 kernels instead of 10 (cuBLAS's split-K reduce and the SwiGLU kernel go), all
of them Triton kernels launched as programmatic dependent launches on Hopper:

    x, y    = add_rms_norm(x, pending, attn_norm, partials=True)   # (dustin_kernels.layer_ops)
    qkv     = skinny_linear(y, wqkv, bias=bqkv)
    (rope + cache write, attention)
    h       = skinny_linear(o, wo, parts=s)              # fp32 partial sums [<= s, M, d]
    x, y    = add_rms_norm(x, h, ffn_norm, partials=True)
    a       = skinny_linear(y, w13, swiglu=True)          # silu(gate) * up, [M, I]
    pending = skinny_linear(a, w2, parts=s)

At M <= 64 rows a GEMM is a read of its weights; cuBLAS runs the Qwen2.5-0.5B draft's shapes at 16
rows in 4-7 us each on an H200, latency-bound. Here one program owns BLOCK_N output columns and a K
slice and streams their weights once (probes/probe_skinny.py measured each shape against the cuBLAS
path; a norm fused in front of the GEMM was slower there: every program re-reads the rows and the
partial sums, so the norm stays one small kernel).

On Hopper each launch is a programmatic dependent launch: a program fetches its first weight tile
while the previous kernel finishes, then waits for it (`gdc_wait`) before reading activations.

Rounding follows the model's reference path: SwiGLU rounds gate and up to the activation dtype
before it, as the unfused path's bf16 projection does. `skinny_linear_ref` is the torch twin."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dustin_kernels._util import cdiv, next_pow2, num_sms, pdl_supported, require

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
    M, N, K, K_SPLIT, INTER,
    sxm, swn, syp, sym,
    HAS_BIAS: tl.constexpr, SWIGLU: tl.constexpr, PARTIAL: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, PREC: tl.constexpr,
    GDC: tl.constexpr = False,
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
    if GDC:  # launched while the previous kernel finishes: fetch the first weight tile (constant), then wait
        rk = k_lo + tl.arange(0, BK)
        kmask = rk < K
        wmask = nmask[:, None] & kmask[None, :]
        w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        if SWIGLU:
            wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        gdc_wait()  # everything below may depend on the previous kernel
        gdc_launch_dependents()
        x = tl.load(X + rm[:, None] * sxm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        xd = x.to(tl.float32).to(dt)
        acc = tl.dot(xd, tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
        if SWIGLU:
            acc2 = tl.dot(xd, tl.trans(wu.to(tl.float32).to(dt)), acc2, input_precision=PREC)
        k_first = k_lo + BK
    for k0 in tl.range(k_first, k_lo + K_SPLIT, BK, num_stages=STAGES):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        wmask = nmask[:, None] & kmask[None, :]
        w = tl.load(W + rn[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        if SWIGLU:
            wu = tl.load(W + (rn + INTER)[:, None] * swn + rk[None, :], mask=wmask, other=0.0)
        x = tl.load(X + rm[:, None] * sxm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        xd = x.to(tl.float32).to(dt)  # (the interpreter's bf16 needs the round trip; it folds on the GPU)
        acc = tl.dot(xd, tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
        if SWIGLU:
            acc2 = tl.dot(xd, tl.trans(wu.to(tl.float32).to(dt)), acc2, input_precision=PREC)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    omask = mmask[:, None] & nmask[None, :]
    yp = Y + pid_k * syp + rm[:, None] * sym + rn[None, :]
    if SWIGLU:
        g = acc.to(dt).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(yp, (s * acc2.to(dt).to(tl.float32)).to(Y.dtype.element_ty), mask=omask)
    elif PARTIAL:
        tl.store(yp, acc, mask=omask)
    else:
        tl.store(yp, acc.to(Y.dtype.element_ty), mask=omask)


def _rows2(t: torch.Tensor) -> torch.Tensor:
    require(t.stride(-1) == 1, "the last dimension must be contiguous")
    return t.reshape(-1, t.shape[-1])


def skinny_split(w: torch.Tensor, device: torch.device) -> int:
    """Split-K slices for a linear whose output is left as partial sums: about one program per SM
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


def skinny_linear(
    x: torch.Tensor,  # [..., K] activations (bf16 / fp16 / fp32), rows adjacent in the last dim
    w: torch.Tensor,  # [N, K] (or [2N, K]: gate | up with swiglu), contiguous, x's dtype
    *,
    bias: torch.Tensor | None = None,  # [N]
    swiglu: bool = False,  # out = silu(gate) * up of the [2N] projection
    parts: int | None = None,  # split K into <= this many slices: fp32 partial sums (no swiglu, no bias)
    config: dict | None = None,
) -> torch.Tensor:
    """x @ w.T (+ bias; SwiGLU'd) as [..., N] in x's dtype; with `parts`, fp32 partial sums
    [s, M, N] of x @ w.T (M = the rows of x, 1 <= s <= parts: K sliced for more programs)."""
    x2 = _rows2(x)
    M, K = x2.shape
    require(1 <= M <= MAX_ROWS, f"skinny_linear takes 1..{MAX_ROWS} rows, got {M}")
    require(w.dim() == 2 and w.shape[1] == K and w.is_contiguous(), f"w must be a contiguous [N, {K}] matrix")
    require(w.dtype == x.dtype and w.device == x.device, "w must have x's dtype and device")
    n_w = w.shape[0]
    require(not swiglu or n_w % 2 == 0, "swiglu needs an even number of weight rows (gate | up)")
    N = n_w // 2 if swiglu else n_w
    require(parts is None or parts >= 1, "parts must be >= 1")
    require(parts is None or (not swiglu and bias is None), "partial sums come without swiglu or bias")
    split_k = 1 if parts is None else parts
    if bias is not None:
        require(tuple(bias.shape) == (N,), f"bias must have shape [{N}]")
    cfg = config or skinny_config(M, N, K, split_k, swiglu, num_sms(x.device), x.element_size())
    BK = cfg["BK"]
    k_split = cdiv(cdiv(K, split_k), BK) * BK
    n_parts = cdiv(K, k_split)
    if parts is not None:
        y = torch.empty(n_parts, M, N, dtype=torch.float32, device=x.device)
        syp, sym = y.stride(0), y.stride(1)
    else:
        y = torch.empty(M, N, dtype=x.dtype, device=x.device)
        syp, sym = 0, y.stride(0)
    gdc = pdl_supported(x.device)
    _skinny_kernel[(cdiv(N, cfg["BN"]), n_parts)](
        x2, w, bias if bias is not None else w, y,
        M, N, K, k_split, N,
        x2.stride(0), w.stride(0), syp, sym,
        HAS_BIAS=bias is not None, SWIGLU=swiglu, PARTIAL=parts is not None,
        BM=max(16, next_pow2(M)), BN=cfg["BN"], BK=BK, STAGES=cfg["STAGES"],
        PREC="ieee" if x.dtype == torch.float32 else "tf32", GDC=gdc, num_warps=cfg["num_warps"],
        **({"launch_pdl": True} if gdc else {}),
    )
    return y if parts is not None else y.view(*x.shape[:-1], N)


def skinny_linear_ref(x, w, *, bias=None, swiglu=False, parts=None):
    """The torch twin (fp32 math, the reference path's roundings); partial sums come back as one
    [1, M, N] fp32 part."""
    dt = x.dtype
    lead, K = x.shape[:-1], x.shape[-1]
    y = x.reshape(-1, K).float() @ w.float().t()
    if bias is not None:
        y = y + bias.float()
    if swiglu:
        g, u = y.chunk(2, dim=-1)
        y = (torch.nn.functional.silu(g.to(dt).float()).to(dt).float() * u.to(dt).float()).to(dt)
    elif parts is not None:
        return y.unsqueeze(0)
    else:
        y = y.to(dt)
    return y.view(*lead, -1)
