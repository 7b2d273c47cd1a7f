"""Fused layer ops vs their torch references (interpreter on CPU; bf16 on the GPU)."""

import pytest
import torch
from dustin_kernels import KernelArgumentError
from dustin_kernels.checks import TOL
from dustin_kernels.layer_ops import (
    add_rms_norm,
    add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
    rope_qkv_to_cache,
    rope_qkv_to_cache_ref,
    swiglu,
    swiglu_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV == "cuda" else [])


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,d", [(1, 64), (7, 576), (3, 100)])
def test_rms_norm(dtype, rows, d):
    g = torch.Generator(device=DEV).manual_seed(rows * d)
    x = torch.randn(rows, d, device=DEV, generator=g).to(dtype) * 3
    h = torch.randn(rows, d, device=DEV, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(d, device=DEV, generator=g)).to(dtype)
    assert rel(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6)) <= TOL[dtype]
    xo, y = add_rms_norm(x, h, w, 1e-5)
    xr, yr = add_rms_norm_ref(x, h, w, 1e-5)
    assert rel(xo, xr) <= TOL[dtype] and rel(y, yr) <= TOL[dtype]


def test_rows_with_a_stride_and_adjacent_elements_only():
    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(5, 70, device=DEV, generator=g)[:, :64]  # rows 70 apart
    h = torch.randn(5, 64, device=DEV, generator=g)
    w = 1 + 0.1 * torch.randn(64, device=DEV, generator=g)
    assert rel(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6)) <= TOL[torch.float32]
    xo, y = add_rms_norm(x, h, w, 1e-6)
    xr, yr = add_rms_norm_ref(x, h, w, 1e-6)
    assert rel(xo, xr) <= TOL[torch.float32] and rel(y, yr) <= TOL[torch.float32]
    with pytest.raises(KernelArgumentError, match="last dimension must be contiguous"):
        rms_norm(x.t().contiguous().t(), w, 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 2 * 96), (2, 5, 2 * 1536), (3, 2 * 1100)])
def test_swiglu(dtype, shape):
    g = torch.Generator(device=DEV).manual_seed(sum(shape))
    gu = torch.randn(*shape, device=DEV, generator=g).to(dtype)
    out = torch.full((*shape[:-1], shape[-1] // 2), float("nan"), device=DEV, dtype=dtype)  # poisoned
    assert swiglu(gu, out=out) is out
    assert not out.isnan().any(), "swiglu left elements of out unwritten"
    assert rel(out, swiglu_ref(gu)) <= TOL[dtype]
    assert torch.equal(swiglu(gu), out)  # a fresh buffer holds the same


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,G,D,qk_norm", [(2, 1, 8, 2, 64, False), (3, 5, 7, 1, 32, True), (1, 9, 4, 4, 128, False),
                                              (2, 3, 28, 4, 64, True), (1, 2, 14, 7, 16, False)])
def test_rope_qkv_to_cache(dtype, B, T, H, G, D, qk_norm):
    g = torch.Generator(device=DEV).manual_seed(B * T * H)
    N = 40
    qkv = torch.randn(B, T, (H + 2 * G) * D, device=DEV, generator=g).to(dtype)
    ang = torch.rand(N, D // 2, device=DEV, generator=g) * 6.28
    rope = torch.stack([torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)]).contiguous()
    start = torch.randint(0, N - T, (B,), device=DEV, generator=g)
    pos = start.view(B, 1) + torch.arange(T, device=DEV)
    qn = kn = None
    if qk_norm:
        qn = (1 + 0.1 * torch.randn(D, device=DEV, generator=g)).to(dtype)
        kn = (1 + 0.1 * torch.randn(D, device=DEV, generator=g)).to(dtype)
    kc = torch.full((B, G, N, D), float("nan"), device=DEV).to(dtype)  # poisoned
    vc, kr, vr = kc.clone(), kc.clone(), kc.clone()
    q = rope_qkv_to_cache(qkv, rope, pos, kc, vc, H, qn, kn, 1e-6)
    qr = rope_qkv_to_cache_ref(qkv, rope, pos, kr, vr, H, qn, kn, 1e-6)
    assert rel(q, qr) <= TOL[dtype]
    written = ~kr.isnan()
    assert torch.equal(written, ~kc.isnan()) and torch.equal(~vr.isnan(), ~vc.isnan())  # same rows written
    assert rel(kc[written], kr[written]) <= TOL[dtype] and rel(vc[written], vr[written]) <= TOL[dtype]
