"""Verification attention over the KV cache: full (split-KV) and sparse (an index set), one kernel.

One program owns one (sequence b, KV head g, split): it loads the queries of all H/G query heads
of group g and all M verification queries as one [HG*M, D] tile, so every K/V row it reads is used
by all of them. The rows of a split are either a contiguous range of the cache (full) or a range of
the index set (sparse). Split 0 also attends to the M new tokens with the causal mask among them.

With more than one split, each program writes an unnormalised partial (m, l, acc) to a scratch
buffer, takes a ticket from a per-(b, g) counter, and the last program to arrive combines the
partials and writes the output (one launch, no second kernel). The counter is reset by that
program, so the counters stay zero between launches (see `_util.ticket_counters`).

RoPE variant (`sparse_verify_attention_rope`, a decode forward of the draft over its set): the
kernel takes the fused q | k | v projection instead of RoPE'd queries; every program rotates its
queries (the column d with its partner d +- D/2, the cos | sin rows of positions cache_lens + j),
split 0 also rotates the new tokens' keys, writes keys and values to the cache rows and the rotated
queries to a q buffer (the draft's lookahead reads them), and attends the new tokens from registers.
The same roundings as `layer_ops.rope_qkv_to_cache` then the plain kernel. Each program of this
variant loads its first block of indexed rows and the lengths *before* the PDL wait (`early`): the
rows it indexes are context rows and this step's earlier drafts, written by kernels that completed
before the one it overlaps (the qkv projection, which lets dependents launch only once its own wait
is over), and the index set and lengths are written before the forward's first kernel; only q, k and
v of the new tokens come from the kernel just before it. Measured on the draft's forward: 0.014-0.03
ms faster (kernels/NOTES.md); the target's verification kernel keeps its loads after the wait (its
index set may be written by the kernel just before it, and round 3 measured no gain there).

Output: [B, H, M, D] as a view of a [B, M, H, D] buffer unless the caller passes `out`, so the model's
`o.transpose(1, 2).reshape(B, M, H * D)` before wo is a view, not a copy kernel (2.8 us per layer of
the 7B verification at batch 16, H200).

Scratch: the partials are allocated with `torch.empty` on each call (allowed under CUDA graph
capture; the graph's pool keeps them). Launchers never read tensor values on the host.

Programmatic dependent launch (sparse kernel, where supported: Hopper and newer, a Triton with
`gdc_wait` and `launch_pdl`): the kernel is launched while the previous kernel on the stream
finishes and waits for it (`gdc_wait`) before it reads q, cache_lens, the new tokens, the indices
and the rows they name, and before any write (the RoPE variant's early rows above excepted); it signals its own dependents
only after that wait. L2 prefetch hints and several programs per (b, g) were measured slower on the
H200 (kernels/NOTES.md) and are not part of the kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dustin_kernels._util import (
    LOG2E,
    cdiv,
    check_lens,
    check_out,
    next_pow2,
    num_sms,
    pdl_supported,
    require,
    ticket_counters,
)

try:  # grid dependency control (programmatic dependent launch); absent in older Triton
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the Triton version
    gdc_launch_dependents = gdc_wait = None

NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity" for running maxima: exp2(NEG_BIG - NEG_BIG) = 1, not NaN


@triton.jit
def _update(q, k, v, allowed, m_i, l_i, acc, qk_scale, DT: tl.constexpr, PREC: tl.constexpr):
    """One online-softmax step: q [BQ, BD], k/v [BN, BD] fp32, allowed [BQ, BN] (or broadcastable)."""
    s = tl.dot(q, tl.trans(k.to(DT)), input_precision=PREC) * qk_scale  # [BQ, BN], log2 units
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DT), v.to(DT), input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _verify_attn_kernel(
    Q, K, V, KN, VN, IDX, LENS, OUT, WACC, WML, LOCKS, ROPE, QO,
    qk_scale, n_cols, chunk, n_splits, n_rope,
    sqb, sqh, sqm, sqd,
    skb, skg, skn, skd,
    svb, svg, svn, svd,
    snb, sng, snm, snd,
    swb, swg, swm, swd,
    sib, sig, sis,
    sob, soh, som, sod,
    sxb, sxm,
    G: tl.constexpr, HG: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_NEW: tl.constexpr,
    SPARSE: tl.constexpr, NEW_IN_CACHE: tl.constexpr, PREC: tl.constexpr, GDC: tl.constexpr = False,
    ROPE_QKV: tl.constexpr = False, EARLY: tl.constexpr = False,
):
    split = tl.program_id(0)
    g = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    g64 = g.to(tl.int64)
    DT: tl.constexpr = K.dtype.element_ty

    rl = tl.arange(0, BLOCK_Q)  # query row = local head * M + query index
    rd = tl.arange(0, BLOCK_D)
    qrow = rl < HG * M
    mq = rl % M
    hq = g * HG + rl // M
    dmask = rd < D
    qmask = qrow[:, None] & dmask[None, :]  # [BQ, BD]

    kb = K + b64 * skb + g64 * skg
    vb = V + b64 * svb + g64 * svg
    lo = split * chunk
    if SPARSE:
        hi = tl.minimum(lo + chunk, n_cols)
        ib = IDX + b64 * sib + g64 * sig
    rn = tl.arange(0, BLOCK_NEW)
    n_new = M - M * tl.minimum(split, 1)  # M for split 0, else 0
    nmask = (rn < n_new)[:, None] & dmask[None, :]
    if EARLY:  # before the wait (module doc): the first block of indexed context rows, the lengths, RoPE's rows
        offs0 = lo + tl.arange(0, BLOCK_N)
        rows0 = tl.load(ib + offs0 * sis, mask=offs0 < hi, other=-1)
        valid0 = rows0 >= 0
        kv0 = valid0[:, None] & dmask[None, :]
        k0 = tl.load(kb + rows0[:, None] * skn + rd[None, :] * skd, mask=kv0, other=0.0).to(tl.float32)
        v0 = tl.load(vb + rows0[:, None] * svn + rd[None, :] * svd, mask=kv0, other=0.0).to(tl.float32)
        L = tl.load(LENS + b)
        if ROPE_QKV:
            qpos = (L + mq).to(tl.int64)[:, None]  # [BQ, 1]: query j of sequence b sits at position L + j
            cq = tl.load(ROPE + qpos * D + rd[None, :], mask=qmask, other=0.0)
            sq = tl.load(ROPE + n_rope * D + qpos * D + rd[None, :], mask=qmask, other=0.0)
            npos = (L + rn).to(tl.int64)[:, None]  # [BNEW, 1]
            ck = tl.load(ROPE + npos * D + rd[None, :], mask=nmask, other=0.0)
            sk = tl.load(ROPE + n_rope * D + npos * D + rd[None, :], mask=nmask, other=0.0)
    if GDC:  # programmatic dependent launch: everything below may depend on the previous kernel
        gdc_wait()
        gdc_launch_dependents()
    if not EARLY:
        L = tl.load(LENS + b)
    if ROPE_QKV:  # Q is the fused projection [B, M, (H + 2G) D]: RoPE here, k / v of the new tokens to the cache
        HALF: tl.constexpr = D // 2
        part = (rd + HALF) % D  # the column each is rotated with
        sgn = tl.where(rd < HALF, -1.0, 1.0)[None, :]
        if not EARLY:
            qpos = (L + mq).to(tl.int64)[:, None]
            cq = tl.load(ROPE + qpos * D + rd[None, :], mask=qmask, other=0.0)
            sq = tl.load(ROPE + n_rope * D + qpos * D + rd[None, :], mask=qmask, other=0.0)
            npos = (L + rn).to(tl.int64)[:, None]
            ck = tl.load(ROPE + npos * D + rd[None, :], mask=nmask, other=0.0)
            sk = tl.load(ROPE + n_rope * D + npos * D + rd[None, :], mask=nmask, other=0.0)
        xq = Q + b64 * sxb + mq[:, None] * sxm
        x = tl.load(xq + hq[:, None] * D + rd[None, :], mask=qmask, other=0.0).to(tl.float32)
        xp = tl.load(xq + hq[:, None] * D + part[None, :], mask=qmask, other=0.0).to(tl.float32)
        q = (x * cq + sgn * xp * sq).to(DT)  # [BQ, BD], rounded as the rope kernel stores it
        if split == 0:
            tl.store(QO + b64 * sqb + hq[:, None] * sqh + mq[:, None] * sqm + rd[None, :] * sqd, q, mask=qmask)
        xn = Q + b64 * sxb + rn[:, None] * sxm
        xk = tl.load(xn + (HG * G + g) * D + rd[None, :], mask=nmask, other=0.0).to(tl.float32)
        xkp = tl.load(xn + (HG * G + g) * D + part[None, :], mask=nmask, other=0.0).to(tl.float32)
        k_new = (xk * ck + sgn * xkp * sk).to(DT)
        v_new = tl.load(xn + (HG * G + G + g) * D + rd[None, :], mask=nmask, other=0.0).to(DT)
        tl.store(kb + npos * skn + rd[None, :] * skd, k_new, mask=nmask)  # split 0 only (n_new = 0 elsewhere)
        tl.store(vb + npos * svn + rd[None, :] * svd, v_new, mask=nmask)
        k_new = k_new.to(tl.float32)
        v_new = v_new.to(tl.float32)
    else:
        qptrs = Q + b64 * sqb + hq[:, None] * sqh + mq[:, None] * sqm + rd[None, :] * sqd
        q = tl.load(qptrs, mask=qmask, other=0.0).to(tl.float32).to(DT)  # [BQ, BD]
        # The M new tokens (split 0 only): loaded first so the loads overlap the main loop, used last.
        if NEW_IN_CACHE:
            kp = kb + (L + rn)[:, None] * skn + rd[None, :] * skd
            vp = vb + (L + rn)[:, None] * svn + rd[None, :] * svd
        else:
            kp = KN + b64 * snb + g64 * sng + rn[:, None] * snm + rd[None, :] * snd
            vp = VN + b64 * swb + g64 * swg + rn[:, None] * swm + rd[None, :] * swd
        k_new = tl.load(kp, mask=nmask, other=0.0).to(tl.float32)
        v_new = tl.load(vp, mask=nmask, other=0.0).to(tl.float32)

    m_i = tl.full([BLOCK_Q], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    if not SPARSE:
        hi = tl.minimum(lo + chunk, L)
    first = lo
    if EARLY:
        m_i, l_i, acc = _update(q, k0, v0, valid0[None, :], m_i, l_i, acc, qk_scale, DT, PREC)
        first = lo + BLOCK_N
    for start in range(first, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        if SPARSE:
            rows = tl.load(ib + offs * sis, mask=offs < hi, other=-1)
            valid = rows >= 0
        else:
            rows = offs
            valid = offs < hi
        kvmask = valid[:, None] & dmask[None, :]
        k = tl.load(kb + rows[:, None] * skn + rd[None, :] * skd, mask=kvmask, other=0.0).to(tl.float32)
        v = tl.load(vb + rows[:, None] * svn + rd[None, :] * svd, mask=kvmask, other=0.0).to(tl.float32)
        m_i, l_i, acc = _update(q, k, v, valid[None, :], m_i, l_i, acc, qk_scale, DT, PREC)

    causal = (rn[None, :] <= mq[:, None]) & (rn < n_new)[None, :]
    m_i, l_i, acc = _update(q, k_new, v_new, causal, m_i, l_i, acc, qk_scale, DT, PREC)

    optrs = OUT + b64 * sob + hq[:, None] * soh + mq[:, None] * som + rd[None, :] * sod
    omask = qrow[:, None] & dmask[None, :]
    if n_splits == 1:  # an int argument equal to 1 is specialised: this branch folds at compile time
        tl.store(optrs, (acc / l_i[:, None]).to(OUT.dtype.element_ty), mask=omask)
    else:
        pair = b * G + g
        slot = (pair * n_splits + split).to(tl.int64)
        wq = rl[:, None] * BLOCK_D + rd[None, :]
        tl.store(WACC + slot * (BLOCK_Q * BLOCK_D) + wq, acc, mask=omask)
        tl.store(WML + slot * (2 * BLOCK_Q) + rl, m_i, mask=qrow)
        tl.store(WML + slot * (2 * BLOCK_Q) + BLOCK_Q + rl, l_i, mask=qrow)
        tl.debug_barrier()  # every thread's partial is written before the ticket (release)
        ticket = tl.atomic_add(LOCKS + pair, 1, sem="acq_rel")
        if ticket == n_splits - 1:  # last to arrive: combine all partials of (b, g)
            m_r = tl.full([BLOCK_Q], NEG_BIG, tl.float32)
            l_r = tl.zeros([BLOCK_Q], tl.float32)
            a_r = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
            for s in tl.range(0, n_splits, num_stages=1):  # serial: a pipelined combine was not faster
                ws = (pair * n_splits + s).to(tl.int64)
                m_s = tl.load(WML + ws * (2 * BLOCK_Q) + rl, mask=qrow, other=NEG_BIG, cache_modifier=".cg")
                l_s = tl.load(WML + ws * (2 * BLOCK_Q) + BLOCK_Q + rl, mask=qrow, other=0.0, cache_modifier=".cg")
                a_s = tl.load(WACC + ws * (BLOCK_Q * BLOCK_D) + wq, mask=omask, other=0.0, cache_modifier=".cg")
                m_n = tl.maximum(m_r, m_s)
                c_r = tl.exp2(m_r - m_n)
                c_s = tl.exp2(m_s - m_n)
                l_r = l_r * c_r + l_s * c_s
                a_r = a_r * c_r[:, None] + a_s * c_s[:, None]
                m_r = m_n
            l_r = tl.where(qrow, l_r, 1.0)
            tl.store(optrs, (a_r / l_r[:, None]).to(OUT.dtype.element_ty), mask=omask)
            tl.atomic_xchg(LOCKS + pair, 0)


def _check(q, k_cache, v_cache, cache_lens, k_new, v_new):
    require(q.dim() == 4, f"q must be [B, H, M, D], got {list(q.shape)}")
    B, H, M, D = q.shape
    require(k_cache.dim() == 4 and k_cache.shape[0] == B and k_cache.shape[3] == D,
            f"k_cache must be [B={B}, G, N_max, D={D}], got {list(k_cache.shape)}")
    require(v_cache.shape == k_cache.shape, "v_cache must have the shape of k_cache")
    G = k_cache.shape[1]
    require(G > 0 and H % G == 0, f"query heads H={H} must be a multiple of KV heads G={G}")
    require(k_cache.dtype == q.dtype and v_cache.dtype == q.dtype, "q, k_cache, v_cache must share a dtype")
    require(q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}")
    require((k_new is None) == (v_new is None), "pass both k_new and v_new, or neither")
    if k_new is not None:
        require(tuple(k_new.shape) == (B, G, M, D) and tuple(v_new.shape) == (B, G, M, D),
                f"k_new/v_new must be [B, G, M, D] = {[B, G, M, D]}")
        require(k_new.dtype == q.dtype and v_new.dtype == q.dtype, "k_new/v_new must have q's dtype")
    check_lens(cache_lens, B, q.device)
    return B, H, M, D, G


def _launch(q, k_cache, v_cache, idx, n_cols, cache_lens, k_new, v_new, scale, out,
            sparse, num_splits, block_n, num_warps, num_stages, qkv=None, rope=None, early=None):
    """With `qkv` and `rope`: q is the buffer the kernel writes the RoPE'd queries into."""
    B, H, M, D, G = _check(q, k_cache, v_cache, cache_lens, k_new, v_new)
    HG = H // G
    if out is None:  # [B, H, M, D] over a [B, M, H, D] buffer: the heads' outputs of a token adjacent, as wo reads them
        out = torch.empty(B, M, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)
    out = check_out(out, (B, H, M, D), q.dtype, q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    BLOCK_Q = max(16, next_pow2(HG * M))
    BLOCK_D = max(16, next_pow2(D))
    BLOCK_NEW = max(16, next_pow2(M))
    span = n_cols if sparse else k_cache.shape[2]  # rows to split (host-known bound)
    sms = num_sms(q.device)
    decode = not sparse and BLOCK_Q <= 16  # few query rows per group (a decode step): long, light programs
    if num_splits is None:  # measured on the H200, see kernels/NOTES.md
        if sparse:  # fill the GPU once, no more: every extra split adds a partial and the combine
            num_splits = max(1, min(sms // (B * G), cdiv(max(span, 1), 32)))
        elif decode:  # at most 2 programs per SM: one wave (a few programs of a second wave cost a whole one)
            num_splits = max(1, min(2 * sms // (B * G), cdiv(max(span, 1), 32)))
        elif B * G * 4 <= sms:  # small batch: ~2 programs per SM, so the serial combine stays short
            num_splits = max(1, min(cdiv(2 * sms, B * G), cdiv(max(span, 1), 32)))
        else:  # ~6 programs per SM for the full cache
            num_splits = max(1, min(round(6 * sms / (B * G)), cdiv(max(span, 1), 32)))
    wide = not sparse and BLOCK_Q >= 256  # exact mode's confirmation pass (K (gamma + 1) rows a head)
    if block_n is None:
        block_n = 32 if not sparse else min(128, max(32, next_pow2(cdiv(max(span, 1), num_splits))))
        if decode and BLOCK_D <= 64:  # short rows: more of them per step keeps enough bytes in flight
            block_n = 128
        if wide:  # H200, 7B at 32k / 16, 20 rows a head: 741 us a layer vs 908 at block_n 32 (probes/results/confirm-attention)
            block_n = 64
    if num_stages is None:
        num_stages = 3 if block_n >= 128 or wide else 4
        smem = lambda bn, ns: (2 * ns * bn + BLOCK_Q) * BLOCK_D * q.element_size() + 9 * 1024  # noqa: E731
        while smem(block_n, num_stages) > 226 * 1024 and (num_stages > 2 or block_n > 16):
            if num_stages > 2:  # stay inside the 227 KB of shared memory a block may use
                num_stages -= 1
            else:
                block_n //= 2
    chunk = cdiv(cdiv(max(span, 1), num_splits), block_n) * block_n
    splits = max(1, cdiv(max(span, 1), chunk))
    if num_warps is None:
        num_warps = 8 if BLOCK_Q >= 128 else 4
    gdc = sparse and pdl_supported(q.device)  # measured: 0.6 us faster per call on the H200
    pairs = B * G
    if splits > 1:
        wacc = torch.empty(pairs * splits * BLOCK_Q * BLOCK_D, dtype=torch.float32, device=q.device)
        wml = torch.empty(pairs * splits * 2 * BLOCK_Q, dtype=torch.float32, device=q.device)
        locks = ticket_counters(q.device, pairs)
    else:
        wacc = wml = locks = out  # unused
    kn, vn = (k_new, v_new) if k_new is not None else (k_cache, v_cache)
    if idx is None:
        idx, isb, isg, iss = cache_lens, 0, 0, 0  # unused
    elif idx.dim() == 2:
        isb, isg, iss = idx.stride(0), 0, idx.stride(1)
    else:
        isb, isg, iss = idx.stride()
    extra = {"launch_pdl": True} if gdc else {}
    fused = qkv is not None
    if early is None:  # the draft's forward over its set: 0.014-0.03 ms faster (H200, kernels/NOTES.md)
        early = fused
    _verify_attn_kernel[(splits, G, B)](
        qkv if fused else q, k_cache, v_cache, kn, vn, idx, cache_lens, out, wacc, wml, locks,
        rope if fused else q, q,
        scale * LOG2E, n_cols, chunk, splits, rope.shape[1] if fused else 0,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *kn.stride(), *vn.stride(),
        isb, isg, iss, *out.stride(),
        qkv.stride(0) if fused else 0, qkv.stride(1) if fused else 0,
        G=G, HG=HG, M=M, D=D, BLOCK_Q=BLOCK_Q, BLOCK_N=block_n, BLOCK_D=BLOCK_D, BLOCK_NEW=BLOCK_NEW,
        SPARSE=sparse, NEW_IN_CACHE=k_new is None,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", GDC=gdc, ROPE_QKV=fused,
        EARLY=bool(early),
        num_warps=num_warps, num_stages=num_stages, **extra,
    )
    return out


def full_verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lens: torch.Tensor,
                          k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None, *,
                          scale: float | None = None, out: torch.Tensor | None = None, num_splits: int | None = None,
                          block_n: int | None = None, num_warps: int | None = None,
                          num_stages: int | None = None) -> torch.Tensor:
    """Split-KV attention of M verification queries over the whole cache: [B, H, M, D].

    q [B, H, M, D]; k_cache/v_cache [B, G, N_max, D] (any strides); cache_lens [B] int32 = context
    rows before the new tokens. Query j of sequence b attends to rows [0, cache_lens[b]) and to new
    tokens 0..j, taken from k_new/v_new [B, G, M, D] or, when those are None, from cache rows
    cache_lens[b] + j. Query head h uses KV head h // (H // G). scale defaults to 1/sqrt(D).
    The tuning keywords (split count, rows per block, warps, pipeline stages) default to heuristics.
    """
    return _launch(q, k_cache, v_cache, None, 0, cache_lens, k_new, v_new, scale, out,
                   False, num_splits, block_n, num_warps, num_stages)


def _check_indices(indices: torch.Tensor, B: int, G: int, device: torch.device) -> None:
    require(indices.dtype == torch.int32, f"indices must be int32, got {indices.dtype}")
    require(indices.dim() in (2, 3) and indices.shape[0] == B and (indices.dim() == 2 or indices.shape[1] == G),
            f"indices must be [B, S] or [B, G, S], got {list(indices.shape)}")
    require(indices.device == device, "indices must be on the same device as q")


def sparse_verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor,
                            cache_lens: torch.Tensor, k_new: torch.Tensor | None = None,
                            v_new: torch.Tensor | None = None, *, scale: float | None = None,
                            out: torch.Tensor | None = None, num_splits: int | None = None,
                            block_n: int | None = None, num_warps: int | None = None,
                            num_stages: int | None = None) -> torch.Tensor:
    """Attention of M verification queries over a selected set of cache rows: [B, H, M, D].

    indices [B, S] (one set for all heads) or [B, G, S] (per KV head), int32 context rows
    < cache_lens[b], -1 padding at the tail. Query j attends to the indexed rows and to new tokens
    0..j (same new-token convention as `full_verify_attention`). Each selected K/V row is loaded
    once for all query heads of its group and all M queries; the set is split across programs
    when B * G alone cannot fill the GPU, and the partials are combined in the same launch.
    Where supported the launch overlaps the previous kernel's tail (module doc). Tuning keywords
    as in `full_verify_attention`.
    """
    _check_indices(indices, q.shape[0], k_cache.shape[1] if k_cache.dim() == 4 else 0, q.device)
    return _launch(q, k_cache, v_cache, indices, indices.shape[-1], cache_lens, k_new, v_new, scale, out,
                   True, num_splits, block_n, num_warps, num_stages)


def sparse_verify_attention_rope(
    qkv: torch.Tensor,  # [B, M, (H + 2G) * D]: the fused q | k | v projection of the M new tokens
    rope: torch.Tensor,  # [2, N_rope, D] float32 cos | sin (positions < N_rope)
    k_cache: torch.Tensor,  # [B, G, N_max, D]
    v_cache: torch.Tensor,
    indices: torch.Tensor,  # [B, S] or [B, G, S] int32, -1 padded
    cache_lens: torch.Tensor,  # [B] int32: new token j of sequence b sits at row / position cache_lens[b] + j
    num_heads: int,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    early: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sparse_verify_attention` with RoPE and the cache write of `layer_ops.rope_qkv_to_cache` inside
    (no q / k norm): the programs rotate their queries from qkv, split 0 rotates the new tokens' keys
    and writes keys and values to the cache rows cache_lens[b] + j and the RoPE'd queries to q.
    One kernel instead of two per layer of a decode forward. Returns (out [B, H, M, D] token-major,
    q [B, H, M, D]). D must be a power of two. Tuning keywords as in `full_verify_attention`."""
    require(qkv.dim() == 3 and qkv.stride(2) == 1, "qkv must be [B, M, (H + 2G) * D] with adjacent elements")
    require(k_cache.dim() == 4, f"k_cache must be [B, G, N_max, D], got {list(k_cache.shape)}")
    B, M, width = qkv.shape
    G, D = k_cache.shape[1], k_cache.shape[3]
    require(D >= 2 and D & (D - 1) == 0, f"head_dim must be a power of two, got {D}")
    require(width == (num_heads + 2 * G) * D, f"qkv's last dim must be (H + 2G) * D = {(num_heads + 2 * G) * D}")
    require(rope.dim() == 3 and rope.shape[0] == 2 and rope.shape[2] == D and rope.is_contiguous()
            and rope.dtype == torch.float32, f"rope must be a contiguous float32 [2, N, {D}] table")
    require(qkv.dtype == k_cache.dtype, "qkv must have the cache's dtype")
    _check_indices(indices, B, G, qkv.device)
    q = torch.empty(B, num_heads, M, D, dtype=qkv.dtype, device=qkv.device)
    out = _launch(q, k_cache, v_cache, indices, indices.shape[-1], cache_lens, None, None, scale, out,
                  True, num_splits, block_n, num_warps, num_stages, qkv=qkv, rope=rope, early=early)
    return out, q
