"""The rest of a decoder layer after its attention, for a decode forward of a few rows (a draft's
batch), as one persistent kernel instead of five:

    phase 0   x1  = x + o @ wo.T (+ bo)                      tiles of d columns
    phase 1   a   = silu(n1 @ wg.T) * (n1 @ wu.T)            tiles of I columns; n1 = ffn_norm(x1)
    phase 2   h2 += a @ w2.T                                 tiles of d columns x K halves (fp32 adds)
    phase 3   x2  = x1 + h2;  out = n2 @ wn.T (+ bn)         the next layer's qkv, n2 = its attn_norm(x2);
              (or out = n2 alone: the final norm before the LM head)

The skinny path (`skinny.py`) runs the same as wo, add_rms_norm, gate|up + SwiGLU, w2, add_rms_norm
and the next qkv: six launches of ~2.5-8 us each at the Qwen2.5-0.5B draft's shapes, whose weights
(29 MB a layer) take ~7 us to read. Here the programs (at most one per SM, so all are resident)
meet at a grid barrier between phases (one counter they spin on) and each phase's tiles are
spread over every program; every program computes the rows' norm statistics itself (a [M, d] row
block from L2), so no norm kernel is left. A layer is then its attention kernel plus this one.

Rounding follows the reference path (`layer_tail_ref`): a linear's output is rounded to the
activation dtype before the residual add, the norm rounds x / rms before the weight, SwiGLU rounds
gate and up. w2's two K halves add into a zeroed fp32 buffer: 0 + a + b is the same in either order,
so the result does not depend on which program finishes first.

In the interpreter, programs run one after another and cannot wait for each other: the launcher
then runs each phase as its own launch (`phases_per_launch=1`), which is also a test of the phase
code apart from the barriers."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from dustin_kernels._util import cdiv, next_pow2, num_sms, pdl_supported, require, ticket_counters

try:  # grid dependency control; absent in older Triton
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the Triton version
    gdc_launch_dependents = gdc_wait = None

MAX_ROWS = 32  # rows (batch x tokens) a launch takes; registers hold [rows, BK] tiles


@triton.jit
def _barrier(CNT, target):
    """Wait until the counter reaches `target` (every program adds 1 per barrier)."""
    tl.debug_barrier()  # this program's stores and atomics come first
    seen = tl.atomic_add(CNT, 1, sem="acq_rel") + 1
    while seen < target:  # a scalar atomic: one thread per program polls
        seen = tl.atomic_add(CNT, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _row_rstd(A, B, rm, mmask, M, d, eps, BM: tl.constexpr, BK: tl.constexpr, ADD: tl.constexpr,
              STORE: tl.constexpr, XO, pid, nprog):
    """1 / rms over d of rows x = A (ADD: x = A + B rounded, B fp32 [M, d]); with STORE, the chunks
    pid, pid + nprog, ... of x are written to XO."""
    dt = A.dtype.element_ty
    ss = tl.zeros([BM], dtype=tl.float32)
    n_chunks = tl.cdiv(d, BK)
    for c in range(0, n_chunks):
        rk = c * BK + tl.arange(0, BK)
        msk = mmask[:, None] & (rk < d)[None, :]
        x = tl.load(A + rm[:, None] * d + rk[None, :], mask=msk, other=0.0, cache_modifier=".cg").to(tl.float32)
        if ADD:
            h = tl.load(B + rm[:, None] * d + rk[None, :], mask=msk, other=0.0, cache_modifier=".cg")
            x = (x + h.to(dt).to(tl.float32)).to(dt).to(tl.float32)
            if STORE:
                if c % nprog == pid:
                    tl.store(XO + rm[:, None] * d + rk[None, :], x.to(dt), mask=msk)
        ss += tl.sum(x * x, 1)
    return tl.rsqrt(ss / d + eps)


@triton.jit
def _tail_kernel(
    OA, X, WO, BO, NW1, W13, W2, NW2, WN, BNX, X1, ACT, H2, X2, OUT, CNT,
    M, d, q, inter, n_out, eps, so, sx,
    HAS_BO: tl.constexpr, HAS_NEXT: tl.constexpr, HAS_BN: tl.constexpr,
    FIRST: tl.constexpr, LAST: tl.constexpr, P2: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, PREC: tl.constexpr,
    GDC: tl.constexpr = False,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    dt = X.dtype.element_ty
    rm = tl.arange(0, BM)
    mmask = rm < M
    if GDC:  # launched while the attention kernel finishes: wait for it before reading anything
        gdc_wait()
    # -- phase 0: x1 = x + o @ wo.T (+ bo); and zero h2 for phase 2 --------------------------------
    if FIRST == 0:
        for t in range(pid, tl.cdiv(d, BN), nprog):
            rn = t * BN + tl.arange(0, BN)
            nmask = rn < d
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for k0 in tl.range(0, q, BK, num_stages=STAGES):
                rk = k0 + tl.arange(0, BK)
                kmask = rk < q
                w = tl.load(WO + rn[:, None] * q + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
                a = tl.load(OA + rm[:, None] * so + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
                acc = tl.dot(a.to(tl.float32).to(dt), tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
            if HAS_BO:
                acc += tl.load(BO + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
            omask = mmask[:, None] & nmask[None, :]
            x = tl.load(X + rm[:, None] * sx + rn[None, :], mask=omask, other=0.0).to(tl.float32)
            x1 = (x + acc.to(dt).to(tl.float32)).to(dt)
            tl.store(X1 + rm[:, None] * d + rn[None, :], x1, mask=omask)
            tl.store(H2 + rm[:, None] * d + rn[None, :], tl.zeros([BM, BN], dtype=tl.float32), mask=omask)
    if FIRST <= 0 and LAST >= 1:
        _barrier(CNT, (1 - FIRST) * nprog)
    # -- phase 1: a = silu(n1 @ wg.T) * (n1 @ wu.T), n1 = ffn_norm(x1) -----------------------------
    if FIRST <= 1 and LAST >= 1:
        rstd = _row_rstd(X1, H2, rm, mmask, M, d, eps, BM, BK, False, False, X2, pid, nprog)
        for t in range(pid, tl.cdiv(inter, BN), nprog):
            rn = t * BN + tl.arange(0, BN)
            nmask = rn < inter
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc2 = tl.zeros([BM, BN], dtype=tl.float32)
            for k0 in tl.range(0, d, BK, num_stages=STAGES):
                rk = k0 + tl.arange(0, BK)
                kmask = rk < d
                wmask = nmask[:, None] & kmask[None, :]
                wg = tl.load(W13 + rn[:, None] * d + rk[None, :], mask=wmask, other=0.0)
                wu = tl.load(W13 + (rn + inter)[:, None] * d + rk[None, :], mask=wmask, other=0.0)
                x = tl.load(X1 + rm[:, None] * d + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0,
                            cache_modifier=".cg").to(tl.float32)
                nw = tl.load(NW1 + rk, mask=kmask, other=0.0).to(tl.float32)
                y = (nw[None, :] * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
                acc = tl.dot(y, tl.trans(wg.to(tl.float32).to(dt)), acc, input_precision=PREC)
                acc2 = tl.dot(y, tl.trans(wu.to(tl.float32).to(dt)), acc2, input_precision=PREC)
            g = acc.to(dt).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            tl.store(ACT + rm[:, None] * inter + rn[None, :], (s * acc2.to(dt).to(tl.float32)).to(dt),
                     mask=mmask[:, None] & nmask[None, :])
    if FIRST <= 1 and LAST >= 2:
        _barrier(CNT, (2 - FIRST) * nprog)
    # -- phase 2: h2 += a @ w2.T over K halves -----------------------------------------------------
    if FIRST <= 2 and LAST >= 2:
        kh = tl.cdiv(tl.cdiv(inter, P2), BK) * BK
        for t in range(pid, tl.cdiv(d, BN) * P2, nprog):
            rn = (t // P2) * BN + tl.arange(0, BN)
            nmask = rn < d
            k_lo = (t % P2) * kh
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for k0 in tl.range(k_lo, tl.minimum(k_lo + kh, inter), BK, num_stages=STAGES):
                rk = k0 + tl.arange(0, BK)
                kmask = rk < inter
                w = tl.load(W2 + rn[:, None] * inter + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
                a = tl.load(ACT + rm[:, None] * inter + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0,
                            cache_modifier=".cg")
                acc = tl.dot(a.to(tl.float32).to(dt), tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
            tl.atomic_add(H2 + rm[:, None] * d + rn[None, :], acc, mask=mmask[:, None] & nmask[None, :], sem="relaxed")
    if FIRST <= 2 and LAST >= 3:
        _barrier(CNT, (3 - FIRST) * nprog)
    # -- phase 3: x2 = x1 + h2; out = norm(x2) @ wn.T (+ bn), or norm(x2) ---------------------------
    if LAST == 3:
        if GDC:
            gdc_launch_dependents()  # every program is resident by now: the next kernel may start waiting
        rstd = _row_rstd(X1, H2, rm, mmask, M, d, eps, BM, BK, True, True, X2, pid, nprog)
        if HAS_NEXT:
            for t in range(pid, tl.cdiv(n_out, BN), nprog):
                rn = t * BN + tl.arange(0, BN)
                nmask = rn < n_out
                acc = tl.zeros([BM, BN], dtype=tl.float32)
                for k0 in tl.range(0, d, BK, num_stages=STAGES):
                    rk = k0 + tl.arange(0, BK)
                    kmask = rk < d
                    xm = mmask[:, None] & kmask[None, :]
                    w = tl.load(WN + rn[:, None] * d + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
                    x = tl.load(X1 + rm[:, None] * d + rk[None, :], mask=xm, other=0.0, cache_modifier=".cg")
                    h = tl.load(H2 + rm[:, None] * d + rk[None, :], mask=xm, other=0.0, cache_modifier=".cg")
                    x = (x.to(tl.float32) + h.to(dt).to(tl.float32)).to(dt).to(tl.float32)
                    nw = tl.load(NW2 + rk, mask=kmask, other=0.0).to(tl.float32)
                    y = (nw[None, :] * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
                    acc = tl.dot(y, tl.trans(w.to(tl.float32).to(dt)), acc, input_precision=PREC)
                if HAS_BN:
                    acc += tl.load(BNX + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
                tl.store(OUT + rm[:, None] * n_out + rn[None, :], acc.to(dt), mask=mmask[:, None] & nmask[None, :])
        else:
            for c in range(pid, tl.cdiv(d, BK), nprog):
                rk = c * BK + tl.arange(0, BK)
                kmask = rk < d
                xm = mmask[:, None] & kmask[None, :]
                x = tl.load(X1 + rm[:, None] * d + rk[None, :], mask=xm, other=0.0, cache_modifier=".cg")
                h = tl.load(H2 + rm[:, None] * d + rk[None, :], mask=xm, other=0.0, cache_modifier=".cg")
                x = (x.to(tl.float32) + h.to(dt).to(tl.float32)).to(dt).to(tl.float32)
                nw = tl.load(NW2 + rk, mask=kmask, other=0.0).to(tl.float32)
                y = (nw[None, :] * (x * rstd[:, None]).to(dt).to(tl.float32)).to(dt)
                tl.store(OUT + rm[:, None] * n_out + rk[None, :], y, mask=xm)
    if LAST > FIRST:  # the last program to leave resets the counter for the next launch
        tl.debug_barrier()
        if tl.atomic_add(CNT, 1, sem="acq_rel") == (LAST - FIRST + 1) * nprog - 1:
            tl.atomic_xchg(CNT, 0)


def tail_config(M: int) -> dict:
    """Block sizes: 16 output columns per tile (the phases' tiles spread over every program: 56-304
    at the 0.5B draft's shapes), 128-wide K steps, 3 stages, 4 warps."""
    return {"BN": 16, "BK": 128, "STAGES": 3, "num_warps": 4}


def layer_tail(
    o: torch.Tensor,  # [..., q] attention output (heads concatenated), rows adjacent in the last dim
    x: torch.Tensor,  # [..., d] residual stream, the same leading shape; x's dtype is the activation dtype
    wo: torch.Tensor,  # [d, q]
    ffn_norm: torch.Tensor,  # [d]
    w13: torch.Tensor,  # [2I, d] gate | up
    w2: torch.Tensor,  # [d, inter]
    next_norm: torch.Tensor,  # [d]: the next layer's attention norm, or the final norm
    next_w: torch.Tensor | None = None,  # [n, d]: the next layer's qkv projection; None: out = the normed x2
    *,
    eps: float,
    bo: torch.Tensor | None = None,  # [d]
    next_b: torch.Tensor | None = None,  # [n]
    programs: int | None = None,  # grid size (default: one per SM)
    phases_per_launch: int | None = None,  # 4 = one launch with grid barriers; 1 = a launch per phase
    config: dict | None = None,  # block sizes (tail_config's keys), for probes
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x2, out): the residual after the layer, [..., d], and the next layer's qkv [..., n] (or the
    final normed x2 [..., d] when `next_w` is None), both in x's dtype."""
    lead, d = x.shape[:-1], x.shape[-1]
    q = o.shape[-1]
    require(o.shape[:-1] == lead, f"o {list(o.shape)} and x {list(x.shape)} must share the leading shape")
    require(o.stride(-1) == 1 and x.stride(-1) == 1, "o and x need adjacent elements in the last dimension")
    o2, x2 = o.reshape(-1, q), x.reshape(-1, d)
    M = x2.shape[0]
    require(1 <= M <= MAX_ROWS, f"layer_tail takes 1..{MAX_ROWS} rows, got {M}")
    dt, dev = x.dtype, x.device
    two_i = w13.shape[0]
    inter = two_i // 2
    for name, t, shape in (("wo", wo, (d, q)), ("w13", w13, (2 * inter, d)), ("w2", w2, (d, inter)),
                           ("ffn_norm", ffn_norm, (d,)), ("next_norm", next_norm, (d,))):
        require(tuple(t.shape) == shape, f"{name} must have shape {list(shape)}, got {list(t.shape)}")
        require(t.is_contiguous() and t.dtype == dt and t.device == dev, f"{name} must be contiguous, {dt}, on {dev}")
    require(two_i % 2 == 0 and inter >= 1, "w13 must hold gate | up: an even number of rows")
    require(o.dtype == dt and o.device == dev, "o must have x's dtype and device")
    n_out = d
    if next_w is not None:
        n_out = next_w.shape[0]
        require(next_w.dim() == 2 and next_w.shape[1] == d and next_w.is_contiguous() and next_w.dtype == dt,
                f"next_w must be a contiguous [n, {d}] matrix of {dt}")
    for name, b, n in (("bo", bo, d), ("next_b", next_b, n_out)):
        if b is not None:
            require(tuple(b.shape) == (n,) and b.dtype == dt, f"{name} must be [{n}] of {dt}")
    require(next_b is None or next_w is not None, "next_b needs next_w")
    interp = os.environ.get("TRITON_INTERPRET") == "1" or dev.type != "cuda"
    per = phases_per_launch or (1 if interp else 4)
    require(per in (1, 2, 4), "phases_per_launch must be 1, 2 or 4")
    require(not interp or per == 1, "the interpreter runs programs one after another: one phase per launch")
    cfg = config or tail_config(M)
    P = programs or num_sms(dev)
    x1 = torch.empty(M, d, dtype=dt, device=dev)
    act = torch.empty(M, inter, dtype=dt, device=dev)
    h2 = torch.empty(M, d, dtype=torch.float32, device=dev)
    xo = torch.empty(M, d, dtype=dt, device=dev)
    out = torch.empty(M, n_out, dtype=dt, device=dev)
    cnt = ticket_counters(dev, 1, name="layer-tail")
    gdc = pdl_supported(dev)
    for first in range(0, 4, per):
        _tail_kernel[(P,)](
            o2, x2, wo, bo if bo is not None else wo, ffn_norm, w13, w2, next_norm,
            next_w if next_w is not None else wo, next_b if next_b is not None else wo,
            x1, act, h2, xo, out, cnt,
            M, d, q, inter, n_out, eps, o2.stride(0), x2.stride(0),
            HAS_BO=bo is not None, HAS_NEXT=next_w is not None, HAS_BN=next_b is not None,
            FIRST=first, LAST=first + per - 1, P2=2 if cdiv(d, cfg["BN"]) * 2 <= P else 1,
            BM=max(16, next_pow2(M)), BN=cfg["BN"], BK=cfg["BK"], STAGES=cfg["STAGES"],
            PREC="ieee" if dt == torch.float32 else "tf32", GDC=gdc, num_warps=cfg["num_warps"],
            **({"launch_pdl": True} if gdc else {}),
        )
    return xo.view(*lead, d), out.view(*lead, n_out)


def layer_tail_ref(o, x, wo, ffn_norm, w13, w2, next_norm, next_w=None, *, eps, bo=None, next_b=None):
    """The torch twin: the reference path's roundings, fp32 math."""
    dt = x.dtype

    def norm(v, w):
        vf = v.float()
        vf = vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + eps)
        return (w.float() * vf.to(dt).float()).to(dt)

    h = o.float() @ wo.float().t()
    if bo is not None:
        h = h + bo.float()
    x1 = (x.float() + h.to(dt).float()).to(dt)
    gu = norm(x1, ffn_norm).float() @ w13.float().t()
    g, u = gu.chunk(2, dim=-1)
    a = (torch.nn.functional.silu(g.to(dt).float()).to(dt).float() * u.to(dt).float()).to(dt)
    x2 = (x1.float() + (a.float() @ w2.float().t()).to(dt).float()).to(dt)
    n2 = norm(x2, next_norm)
    if next_w is None:
        return x2, n2
    out = n2.float() @ next_w.float().t()
    if next_b is not None:
        out = out + next_b.float()
    return x2, out.to(dt)
