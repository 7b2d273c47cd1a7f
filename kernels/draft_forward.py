"""The draft's decode forward over its verification set as one persistent CUDA kernel
(`draft_forward.cu`, compiled at run time by NVRTC: `cuda_jit`), and its pure-torch reference.

    resid, h, q = draft_forward(x, layers, k_cache, v_cache, indices, cache_lens, rope, num_heads=H, eps=eps)
    final       = layer_ops.add_rms_norm(resid, h[None], norm_w, eps, partials=True)[1]

x [B, T, d]: the embeddings of the T new tokens of each sequence (B * T <= 32); `layers`: per layer
(wqkv, bqkv | None, wo, bo | None, w13, w2, attn_norm_w, ffn_norm_w) as the model holds them;
k_cache / v_cache: per layer [B, G, N_max, D]; indices [B, NI] int32 context rows (-1 none);
new token t of sequence b sits at row / position cache_lens[b] + t, attends the indexed rows and the
new tokens 0..t, and its key and value are written to that row. Returns the residual stream after
the last layer's attention and MLP *before* the MLP's output is added (resid [B * T, d]), that
output h [B * T, d] fp32, and the RoPE'd queries of every layer q [L, B, H, T, D]. Same math and
roundings as the Triton path (`skinny_linear`, `add_rms_norm`, `sparse_verify_attention_rope`);
the kernel's partial sums run in another order, so results agree to rounding, not bit for bit.

Status: correct (GPU tests against the twin; on the runtime's path at b3ecc3d the decoding loop's
tokens equal the layer-by-layer path's) but slower than the Triton path it would replace (0.884 vs
0.736 ms for the Qwen2.5-0.5B draft's 24 layers at batch 16, one token, at 3e1e567; kernels/NOTES.md has the
per-phase profile), so the runtime does not route to it; `probes/probe_draft_megakernel.py` measures it.

Where it runs (`supported`): compute capability 9.0 (Hopper: bulk copies, mbarriers), bf16,
head_dim 64, no q / k norm, B * T <= 32, (H / G) * T <= 16 query rows per KV head, shapes that
are multiples of 16, and a hidden size whose weight slots fit shared memory (Qwen2.5-0.5B's 896 and
SmolLM2's 576 do; Llama-3.2-1B's 2048 does not: its rows would need K chunks in every phase).
Each launch uses every SM but `reserve` (left to a side stream), one CTA per SM joined by grid
barriers: nothing else may hold those SMs for long while it runs (a wait past ~10 s traps).
"""

from __future__ import annotations

import ctypes
import math
import os

import torch
from dustin_kernels._util import KernelArgumentError, num_sms, require, ticket_counters
from dustin_kernels.cuda_jit import kernel

_SOURCE = os.path.join(os.path.dirname(__file__), "draft_forward.cu")
NSLOT = 4  # weight ring slots (~28 KB each at hidden 896)
MAX_ROWS = 32
SMEM_LIMIT = 227 * 1024  # shared memory one block may hold on Hopper (sm_90)
LOG2E = 1.4426950408889634
_TABLES: dict = {}
_COMPILED: dict = {}


class _Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("ptrs", "r0", "r1", "hsum", "qall", "attn", "act", "pacc", "pml", "tickets", "bar", "idx",
                 "lens", "rope")] + [("nmax", ctypes.c_int64)] + [
                (n, ctypes.c_int32) for n in ("ni", "nr", "B", "T", "rows", "nlayers", "spl")] + [
                ("eps", ctypes.c_float), ("qk_scale", ctypes.c_float), ("prof", ctypes.c_uint64)]


def supported(device: torch.device, dtype: torch.dtype, *, hidden: int, heads: int, kv_heads: int, head_dim: int,
              inter: int, qk_norm: bool, B: int, T: int) -> bool:
    """Whether `draft_forward` takes this model and batch (module doc)."""
    if device.type != "cuda" or dtype != torch.bfloat16 or qk_norm or head_dim != 64:
        return False
    if torch.cuda.get_device_capability(device) != (9, 0):
        return False
    if heads % kv_heads or (heads // kv_heads) * T > 16 or B * T > MAX_ROWS:
        return False
    if hidden % 16 or (heads * head_dim) % 16 or inter % 32:
        return False
    return smem_bytes(hidden, heads, kv_heads, head_dim, inter, 1 if B * T <= 16 else 2) <= SMEM_LIMIT


def _table(layers, k_cache, v_cache, device) -> torch.Tensor:
    """[L, 10] int64 pointer table (cached by the pointers: built once, outside graph capture)."""
    ptrs = []
    for (wqkv, bqkv, wo, bo, w13, w2, n1, n2), k, v in zip(layers, k_cache, v_cache, strict=True):
        ptrs.append([t.data_ptr() if t is not None else 0 for t in (wqkv, bqkv, wo, bo, w13, w2, n1, n2, k, v)])
    key = (device.index, tuple(map(tuple, ptrs)))
    t = _TABLES.get(key)
    if t is None:
        if torch.cuda.is_current_stream_capturing():
            raise KernelArgumentError("dustin_kernels: run draft_forward once before CUDA graph capture (warm-up)")
        t = _TABLES[key] = torch.tensor(ptrs, dtype=torch.int64, device=device)
    return t


def draft_forward(
    x: torch.Tensor,  # [B, T, d] bf16
    layers: list,  # per layer (wqkv, bqkv, wo, bo, w13, w2, attn_norm_w, ffn_norm_w)
    k_cache: list,  # per layer [B, G, N_max, D]
    v_cache: list,
    indices: torch.Tensor,  # [B, NI] int32
    cache_lens: torch.Tensor,  # [B] int32
    rope: torch.Tensor,  # [2, N_rope, D] float32
    *,
    num_heads: int,
    eps: float,
    reserve: int = 0,
    splits: int | None = None,
    prof: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (resid [B T, d] bf16, h [B T, d] fp32, q [L, B, H, T, D]); module doc. `prof` (probes): an
    int64 [grid, L, 16] buffer for a build that stamps clock64 at every barrier (draft_forward.cu)."""
    require(x.dim() == 3 and x.is_contiguous() and x.dtype == torch.bfloat16, "x must be a contiguous bf16 [B, T, d]")
    B, T, d = x.shape
    L = len(layers)
    require(L >= 1 and len(k_cache) == L and len(v_cache) == L, "one weight tuple and one cache per layer")
    wqkv, bqkv, wo, bo, w13, w2, n1, n2 = layers[0]
    G, nmax, D = k_cache[0].shape[1], k_cache[0].shape[2], k_cache[0].shape[3]
    inter = w2.shape[1]
    H = num_heads
    require(supported(x.device, x.dtype, hidden=d, heads=H, kv_heads=G, head_dim=D, inter=inter, qk_norm=False,
                      B=B, T=T), "draft_forward does not take this model, batch or device (see `supported`)")
    for lw, k, v in zip(layers, k_cache, v_cache, strict=True):
        require(tuple(lw[0].shape) == ((H + 2 * G) * D, d) and tuple(lw[2].shape) == (d, H * D)
                and tuple(lw[4].shape) == (2 * inter, d) and tuple(lw[5].shape) == (d, inter),
                "layer weights must be wqkv [(H + 2G) D, d], wo [d, H D], w13 [2 I, d], w2 [d, I]")
        require(all(t is None or (t.is_contiguous() and t.dtype == torch.bfloat16 and t.device == x.device)
                    for t in lw), "weights must be contiguous bf16 on x's device")
        require((lw[1] is None) == (bqkv is None) and (lw[3] is None) == (bo is None), "biases: all layers or none")
        require(tuple(k.shape) == (B, G, nmax, D) and k.is_contiguous() and v.shape == k.shape and v.is_contiguous()
                and k.dtype == torch.bfloat16 and v.dtype == torch.bfloat16, "caches must be contiguous bf16 [B, G, N, D]")
    require(indices.dim() == 2 and indices.shape[0] == B and indices.dtype == torch.int32 and indices.is_contiguous(),
            "indices must be a contiguous int32 [B, NI]")
    require(cache_lens.shape == (B,) and cache_lens.dtype == torch.int32, "cache_lens must be int32 [B]")
    require(rope.dim() == 3 and rope.shape[0] == 2 and rope.shape[2] == D and rope.dtype == torch.float32
            and rope.is_contiguous(), "rope must be a contiguous float32 [2, N, D] table")
    dev = x.device
    rows = B * T
    mt = 1 if rows <= 16 else 2
    k = _kernel(dev, HID=d, NQ=H, NKV=G, HD=D, INTER=inter, MT=mt, NSLOT=NSLOT, HAS_QKV_BIAS=bqkv is not None,
                HAS_O_BIAS=bo is not None, PROF=prof is not None)
    grid = max(1, num_sms(dev) - reserve)
    spl = min(8, splits or max(1, grid // (B * G)))  # the kernel combines at most 8 splits
    f32 = dict(dtype=torch.float32, device=dev)
    r1 = torch.empty(rows, d, dtype=x.dtype, device=dev)
    hsum = torch.empty(rows, d, **f32)
    q = torch.empty(L, B, H, T, D, dtype=x.dtype, device=dev)
    attn = torch.empty(rows, H * D, dtype=x.dtype, device=dev)
    act = torch.empty(rows, inter, dtype=x.dtype, device=dev)
    pacc = torch.empty(B * G * spl, 16, D, **f32)
    pml = torch.empty(B * G * spl, 2, 16, **f32)
    tickets = ticket_counters(dev, B * G, name="draft_forward_tickets")
    bar = ticket_counters(dev, 2, name="draft_forward_barrier")
    r0 = x.reshape(rows, d).clone()  # the kernel overwrites its residual buffers
    table = _table(layers, k_cache, v_cache, dev)
    p = _Params(table.data_ptr(), r0.data_ptr(), r1.data_ptr(), hsum.data_ptr(), q.data_ptr(), attn.data_ptr(),
                act.data_ptr(), pacc.data_ptr(), pml.data_ptr(), tickets.data_ptr(), bar.data_ptr(),
                indices.data_ptr(), cache_lens.data_ptr(), rope.data_ptr(), nmax,
                indices.shape[1], rope.shape[1], B, T, rows, L, spl, eps, LOG2E / math.sqrt(D),
                0 if prof is None else prof.data_ptr())
    k.launch(grid, 256, smem_bytes(d, H, G, D, inter, mt), p)
    resid = r0 if L % 2 == 0 else r1
    return resid, hsum, q


def _kernel(device: torch.device, **defines):
    """The kernel compiled for these shapes (NVRTC, once per process and device)."""
    key = (device.index, tuple(sorted(defines.items())))
    k = _COMPILED.get(key)
    if k is None:
        with open(_SOURCE) as f:
            k = _COMPILED[key] = kernel(f.read(), "draft_forward_kernel", defines, device)
    return k


def smem_bytes(d: int, H: int, G: int, D: int, inter: int, mt: int) -> int:
    """The kernel's dynamic shared memory (its layout, draft_forward.cu; 7 compute warps)."""
    warps = 7
    xk = max(d, H * D)
    kh = inter // 2
    ech = -(-kh // xk)
    chk = (-(-kh // ech) + 15) // 16 * 16
    rp = 16 * mt
    slot = 16 * (xk + 8)
    epitch = chk + 8
    cpp = max(1, min(ech, 40960 // (rp * epitch)))
    kvp = D + 8
    xregion = max((rp + 1) * (xk + 8), rp * epitch * cpp, warps * 2 * 2 * 16 * kvp, warps * 16 * (D + 2) * 2)
    return (NSLOT * slot * 2 + xregion * 2 + warps * rp * 16 * 4 + rp * 4 + 16 + 2 * NSLOT * 8 + 1024 * 4
            + rp * 2 * D * 4 + rp * 4)


def draft_forward_ref(x, layers, k_cache, v_cache, indices, cache_lens, rope, *, num_heads, eps):
    """The torch twin of `draft_forward` (fp32 math, the Triton path's roundings); writes the caches the same way."""
    from dustin_kernels.layer_ops import add_rms_norm_ref, rms_norm_ref
    from dustin_kernels.reference import sparse_verify_attention_rope_ref

    B, T, d = x.shape
    dt = x.dtype
    resid, h, qs = x.reshape(B * T, d), None, []
    for (wqkv, bqkv, wo, bo, w13, w2, n1, n2), kc, vc in zip(layers, k_cache, v_cache, strict=True):
        if h is None:
            y = rms_norm_ref(resid, n1, eps)
        else:  # the last MLP's output, rounded, joins the residual
            resid, y = add_rms_norm_ref(resid, h.to(dt), n1, eps)
        qkv = y.float() @ wqkv.float().t()
        if bqkv is not None:
            qkv = qkv + bqkv.float()
        o, q = sparse_verify_attention_rope_ref(qkv.to(dt).view(B, T, -1), rope, kc, vc, indices, cache_lens,
                                                num_heads)  # [B, H, T, D]
        qs.append(q)
        a = o.to(dt).transpose(1, 2).reshape(B * T, -1).float() @ wo.float().t()
        if bo is not None:
            a = a + bo.float()
        resid, y = add_rms_norm_ref(resid, a.to(dt), n2, eps)
        g, u = (y.float() @ w13.float().t()).to(dt).float().chunk(2, dim=-1)
        act = (torch.nn.functional.silu(g).to(dt).float() * u).to(dt)
        h = act.float() @ w2.float().t()  # [B T, d] fp32
    return resid, h, torch.stack(qs)
