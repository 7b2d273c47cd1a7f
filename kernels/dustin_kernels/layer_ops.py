"""Fused per-layer elementwise ops of the decoder, so a decode step is a few kernels per layer:

- `rms_norm`: y = w * norm(x) (one program per row; the norms are PDL launches on Hopper: they
  start while the previous kernel finishes and wait for it first);
- `add_rms_norm`: x += h, y = w * norm(x) (residual add fused with the next norm; h may be the
  partial sums that `skinny.skinny_linear` leaves under split-K);
- `swiglu`: silu(gate) * up from the fused gate|up projection;
- `rope_qkv_to_cache`: split the fused qkv projection, optional q/k RMSNorm (Qwen3), RoPE on q and
  k, q written as [B, H, T, D], k and v written straight into the KV cache at per-sequence positions.
  On Hopper it lets the next kernel launch at once (programmatic dependent launch): the sparse
  verification kernel, launched with PDL, may then start beside it; it waits for this grid before
  reading q and the new tokens (measured neutral at the 72B shape, kernels/NOTES.md).

Each has a `_ref` pure-torch twin with the model's reference semantics. Math is float32 inside.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dustin_kernels._util import check_out, next_pow2, pdl_supported, require

try:  # grid dependency control; absent in older Triton
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the Triton version
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _rms_norm_kernel(X, H, W, Y, XO, d, eps, sx, sh, sy, sxo, shp,
                     BLOCK: tl.constexpr, HAS_RES: tl.constexpr, P: tl.constexpr = 1, GDC: tl.constexpr = False):
    if GDC:  # launched while the previous kernel finishes; wait for it before reading anything
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        h = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(P):  # partial sums (split-K) add up here; one part otherwise
            h += tl.load(H + p * shp + row * sh + cols, mask=mask, other=0.0).to(tl.float32)
        x = x + h.to(XO.dtype.element_ty).to(tl.float32)
        x = x.to(XO.dtype.element_ty)
        tl.store(XO + row * sxo + cols, x, mask=mask)
        x = x.to(tl.float32)
    var = tl.sum(x * x, 0) / d
    xn = (x * tl.rsqrt(var + eps)).to(Y.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * sy + cols, (w * xn).to(Y.dtype.element_ty), mask=mask)


def _pdl(device: torch.device) -> dict:
    """Launch keywords of a programmatic dependent launch where supported (the kernel waits first)."""
    return {"GDC": True, "launch_pdl": True} if pdl_supported(device) else {}


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] as rows [n, d] (any row stride; elements of a row must be adjacent)."""
    require(x.stride(-1) == 1, "the last dimension must be contiguous")
    return x.reshape(-1, x.shape[-1])


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] -> w * x / rms(x), in x's dtype."""
    x2 = _rows(x)
    y = torch.empty_like(x2)
    _rms_norm_kernel[(x2.shape[0],)](x2, x2, w, y, y, x2.shape[1], eps, x2.stride(0), 0, y.stride(0), 0, 0,
                                      BLOCK=next_pow2(x2.shape[1]), HAS_RES=False, **_pdl(x.device))
    return y.view(x.shape)


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, eps: float,
                 partials: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + h, rms_norm(x + h)) for x, h [..., d], in x's dtype. With `partials`, h is [P, n, d]
    partial sums (split-K's, any float dtype) of the n rows of x, summed and rounded to x's dtype
    before the add (as a linear's output would be)."""
    x2 = _rows(x)
    if partials:
        require(h.dim() == 3 and tuple(h.shape[1:]) == tuple(x2.shape) and h.stride(-1) == 1,
                f"partial sums must be [P, {x2.shape[0]}, {x2.shape[1]}] with adjacent elements")
        h3 = h
    else:
        h3 = _rows(h).unsqueeze(0)
    xo, y = torch.empty_like(x2), torch.empty_like(x2)
    _rms_norm_kernel[(x2.shape[0],)](x2, h3, w, y, xo, x2.shape[1], eps, x2.stride(0), h3.stride(1),
                                      y.stride(0), xo.stride(0), h3.stride(0),
                                      BLOCK=next_pow2(x2.shape[1]), HAS_RES=True, P=h3.shape[0], **_pdl(x.device))
    return xo.view(x.shape), y.view(x.shape)


def rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * xf.to(x.dtype).float()).to(x.dtype)


def add_rms_norm_ref(x, h, w, eps, partials=False):
    if partials:
        h = h.float().sum(0).view(x.shape).to(x.dtype)
    xo = (x.float() + h.float()).to(x.dtype)
    return xo, rms_norm_ref(xo, w, eps)


@triton.jit
def _swiglu_kernel(GU, OUT, inter, sg, so, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    g = tl.load(GU + row * sg + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * sg + inter + cols, mask=mask, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * so + cols, (s * u).to(OUT.dtype.element_ty), mask=mask)


def swiglu(gu: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gu [..., 2I] (gate | up) -> silu(gate) * up [..., I], written into `out` when given
    (contiguous, gu's dtype and device)."""
    g2 = _rows(gu)
    inter = g2.shape[1] // 2
    out = check_out(out, (*gu.shape[:-1], inter), gu.dtype, gu.device)
    require(out.is_contiguous(), "out must be contiguous")
    o2 = out.view(g2.shape[0], inter)
    block = 1024
    _swiglu_kernel[(g2.shape[0], triton.cdiv(inter, block))](g2, o2, inter, g2.stride(0), o2.stride(0), BLOCK=block)
    return out


def swiglu_ref(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return (torch.nn.functional.silu(g.float()).to(gu.dtype).float() * u.float()).to(gu.dtype)


@triton.jit
def _rope_qkv_kernel(
    QKV, ROPE, POS, QO, KC, VC, QNW, KNW, eps,
    T, n_rope,
    sqb, sqt,
    sob, soh, sot,
    skb, skg, skn,
    svb, svg, svn,
    H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr, HB: tl.constexpr,
    TRIGGER: tl.constexpr = False,
):
    if TRIGGER:  # launched with PDL: wait for the previous kernel (it wrote qkv); then the attention
        gdc_wait()  # kernel, also a PDL launch, may start now: it waits for this grid before reading q
        gdc_launch_dependents()
    bt = tl.program_id(0)
    head = tl.program_id(1) * HB + tl.arange(0, HB)  # [HB]: [0, H) query heads, [H, H + G) key/value heads
    b = (bt // T).to(tl.int64)
    t = (bt % T).to(tl.int64)
    HALF: tl.constexpr = D // 2
    r = tl.arange(0, HALF)
    live = (head < H + G)[:, None]  # [HB, 1]
    is_q = (head < H)[:, None]
    is_k = live & (head >= H)[:, None]
    pos = tl.load(POS + b * T + t).to(tl.int64)
    base = QKV + b * sqb + t * sqt
    xp = base + head[:, None] * D + r[None, :]  # [HB, HALF]
    x1 = tl.load(xp, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF, mask=live, other=0.0).to(tl.float32)
    if QK_NORM:
        inv = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]  # [HB, 1]
        w1 = tl.where(is_q, tl.load(QNW + r).to(tl.float32)[None, :], tl.load(KNW + r).to(tl.float32)[None, :])
        w2 = tl.where(is_q, tl.load(QNW + HALF + r).to(tl.float32)[None, :],
                      tl.load(KNW + HALF + r).to(tl.float32)[None, :])
        x1 = (x1 * inv).to(QO.dtype.element_ty).to(tl.float32) * w1
        x2 = (x2 * inv).to(QO.dtype.element_ty).to(tl.float32) * w2
        x1 = x1.to(QO.dtype.element_ty).to(tl.float32)
        x2 = x2.to(QO.dtype.element_ty).to(tl.float32)
    c1 = tl.load(ROPE + pos * D + r)[None, :]
    c2 = tl.load(ROPE + pos * D + HALF + r)[None, :]
    s1 = tl.load(ROPE + n_rope * D + pos * D + r)[None, :]
    s2 = tl.load(ROPE + n_rope * D + pos * D + HALF + r)[None, :]
    o1 = x1 * c1 - x2 * s1
    o2 = x2 * c2 + x1 * s2
    dst = QO + b * sob + head[:, None] * soh + t * sot + r[None, :]
    tl.store(dst, o1.to(QO.dtype.element_ty), mask=is_q)
    tl.store(dst + HALF, o2.to(QO.dtype.element_ty), mask=is_q)
    g = tl.maximum(head - H, 0).to(tl.int64)[:, None]  # [HB, 1]: KV head (0 on query rows, masked)
    kdst = KC + b * skb + g * skg + pos * skn + r[None, :]
    tl.store(kdst, o1.to(KC.dtype.element_ty), mask=is_k)
    tl.store(kdst + HALF, o2.to(KC.dtype.element_ty), mask=is_k)
    vsrc = base + (H + G + g) * D + r[None, :]
    vdst = VC + b * svb + g * svg + pos * svn + r[None, :]
    tl.store(vdst, tl.load(vsrc, mask=is_k), mask=is_k)
    tl.store(vdst + HALF, tl.load(vsrc + HALF, mask=is_k), mask=is_k)


def rope_qkv_to_cache(
    qkv: torch.Tensor,  # [B, T, (H + 2G) * D], the fused projection's output
    rope: torch.Tensor,  # [2, N_rope, D] float32 cos | sin
    positions: torch.Tensor,  # [B, T] int64
    k_cache: torch.Tensor,  # [B, G, N_max, D], last dim contiguous
    v_cache: torch.Tensor,  # [B, G, N_max, D]
    num_heads: int,
    q_norm: torch.Tensor | None = None,  # [D] (Qwen3)
    k_norm: torch.Tensor | None = None,  # [D]
    eps: float = 1e-6,
) -> torch.Tensor:
    """RoPE'd queries [B, H, T, D]; RoPE'd keys and the values go into the cache at `positions`."""
    B, T, _ = qkv.shape
    G, D = k_cache.shape[1], k_cache.shape[3]
    assert D % 2 == 0 and (D // 2) & (D // 2 - 1) == 0, "head_dim must be a power of two"
    assert qkv.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and rope.is_contiguous()
    q = torch.empty(B, num_heads, T, D, dtype=qkv.dtype, device=qkv.device)
    pos = positions.contiguous()
    qk_norm = q_norm is not None
    HB = min(16, next_pow2(num_heads + G))  # heads per program: one rope row load serves them all
    pdl = pdl_supported(qkv.device)  # a PDL launch that waits for the qkv projection, then lets attention start
    _rope_qkv_kernel[(B * T, triton.cdiv(num_heads + G, HB))](
        qkv, rope, pos, q, k_cache, v_cache,
        q_norm if qk_norm else qkv, k_norm if qk_norm else qkv, eps,
        T, rope.shape[1],
        qkv.stride(0), qkv.stride(1),
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        H=num_heads, G=G, D=D, QK_NORM=qk_norm, HB=HB, TRIGGER=pdl, num_warps=4 if HB * D >= 1024 else 2,
        **({"launch_pdl": True} if pdl else {}),
    )
    return q


def rope_qkv_to_cache_ref(qkv, rope, positions, k_cache, v_cache, num_heads, q_norm=None, k_norm=None, eps=1e-6):
    B, T, _ = qkv.shape
    G, D = k_cache.shape[1], k_cache.shape[3]
    H = num_heads
    q, k, v = qkv.split([H * D, G * D, G * D], dim=-1)
    q, k = q.view(B, T, H, D), k.view(B, T, G, D)
    if q_norm is not None:
        q, k = rms_norm_ref(q, q_norm, eps), rms_norm_ref(k, k_norm, eps)
    cos = rope[0][positions].unsqueeze(1)  # [B, 1, T, D]
    sin = rope[1][positions].unsqueeze(1)

    def rot(x):
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)

    q, k = rot(q.transpose(1, 2)), rot(k.transpose(1, 2))
    idx = positions.view(B, 1, T, 1).expand(B, G, T, D)
    k_cache.scatter_(2, idx, k.to(k_cache.dtype))
    v_cache.scatter_(2, idx, v.view(B, T, G, D).transpose(1, 2).to(v_cache.dtype))
    return q
