"""`skinny_linear` (a linear of a few rows: bias, SwiGLU fused after gate|up, RMSNorm of its input
rows in its prologue) and `skinny_residual` (split-K slices added up by the last program of a column
block, the residual add, the rows' sums of squares) vs their torch references and cuBLAS, on awkward
sizes (interpreter on CPU; bf16 on the GPU)."""

import pytest
import torch
from dustin_kernels import KernelArgumentError
from dustin_kernels.layer_ops import add_rms_norm_ref, rms_norm_ref
from dustin_kernels.skinny import (
    RowNorm,
    skinny_config,
    skinny_linear,
    skinny_linear_ref,
    skinny_residual,
    skinny_residual_ref,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV == "cuda" else [])
# fp32: sums over K <= 1100 products in another order (fp32 eps 6e-8 x sqrt-growth, far below 1e-5);
# fp16 / bf16: the output rounded once more or less than the reference (2^-11 / 2^-8 relative)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def _case(M, K, N, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(M, K, device=DEV, generator=g) * 2).to(dtype)
    w = (torch.randn(N, K, device=DEV, generator=g) / K**0.5).to(dtype)
    return g, x, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 64, 16), (5, 100, 37), (16, 896, 1152), (13, 300, 200), (33, 64, 48),
                                   (64, 272, 80)])
def test_plain_and_bias(dtype, M, K, N):
    g, x, w = _case(M, K, N, dtype, M * K + N)
    b = torch.randn(N, device=DEV, generator=g).to(dtype)
    for bias in (None, b):
        y = skinny_linear(x, w, bias=bias)
        assert y.shape == (M, N) and y.dtype == dtype
        assert rel(y, skinny_linear_ref(x, w, bias=bias)) <= TOL[dtype]
        if DEV == "cuda":  # what the model's cuBLAS path computes
            assert rel(y, torch.nn.functional.linear(x, w, bias)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(3, 70, 40), (16, 256, 96), (7, 513, 33), (64, 130, 20)])
def test_swiglu(dtype, M, K, N):
    _, x, w = _case(M, K, 2 * N, dtype, M + K + N)
    y = skinny_linear(x.view(M, 1, K), w, swiglu=True)  # leading dims kept
    assert y.shape == (M, 1, N)
    assert rel(y.view(M, N), skinny_linear_ref(x, w, swiglu=True)) <= TOL[dtype]


def _resid_case(M, K, N, dtype, seed):
    g, x, w = _case(M, K, N, dtype, seed)
    r = (torch.randn(M, N, device=DEV, generator=g) * 3).to(dtype)
    b = torch.randn(N, device=DEV, generator=g).to(dtype)
    return g, x, w, r, b


CFG16 = {"BN": 16, "BK": 64, "STAGES": 2, "num_warps": 2}  # 16-column blocks: several per awkward N


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("M,K,N", [(16, 1000, 24), (2, 70, 90), (7, 300, 33)])
def test_residual_adds_the_product_and_sums_squares(dtype, parts, M, K, N):
    _, x, w, r, b = _resid_case(M, K, N, dtype, parts * K + N)
    for bias in (None, b):
        xo, ss = skinny_residual(x, w, r, bias=bias, parts=parts, config=CFG16)
        xr, _ = skinny_residual_ref(x, w, r, bias=bias)
        assert xo.shape == r.shape and xo.dtype == dtype and ss.dtype == torch.float32
        assert ss.shape == (-(-N // 16), M)  # one row of sums per 16-column block
        assert rel(xo, xr) <= TOL[dtype]
        # the sums of squares are those of the values written (fp32, only the order differs)
        assert rel(ss.sum(0), xo.double().pow(2).sum(-1)) <= 1e-6
        again, ss2 = skinny_residual(x, w, r, bias=bias, parts=parts, config=CFG16)  # tickets were reset
        assert torch.equal(again, xo) and torch.equal(ss2, ss)  # slices added in a fixed order


def test_residual_takes_the_slices_of_every_program():
    """Split-K really splits (4 programs per column block): zeroing any one K slice of x moves the
    result by that slice's products, and the kernel follows the reference each time."""
    _, x, w, r, _ = _resid_case(3, 512, 40, torch.float32, 7)
    xo, _ = skinny_residual(x, w, r, parts=4, config=CFG16)
    assert rel(xo, skinny_residual_ref(x, w, r)[0]) <= 1e-5
    for k in range(0, 512, 128):
        xz = x.clone()
        xz[:, k:k + 128] = 0
        want = skinny_residual_ref(xz, w, r)[0]
        assert rel(skinny_residual(xz, w, r, parts=4, config=CFG16)[0], want) <= 1e-5
        assert rel(xo, want) > 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 3, 7])
@pytest.mark.parametrize("M,K,N", [(1, 64, 16), (5, 100, 37), (16, 272, 48)])
def test_norm_in_the_prologue(dtype, T, M, K, N):
    """skinny_linear(x, w, norm=RowNorm(sums of squares in T blocks, weight, eps)) = rms_norm(x) @ w.T."""
    g, x, w = _case(M, K, 2 * N, dtype, T * M + K)
    nw = (1 + 0.2 * torch.randn(K, device=DEV, generator=g)).to(dtype)
    sq = x.double().pow(2)  # [M, K]
    cuts = sorted(set(torch.randint(1, K, (T - 1,), generator=torch.Generator().manual_seed(T)).tolist()))
    ss = torch.stack([c.sum(-1) for c in torch.tensor_split(sq, cuts, dim=1)]).float()  # [<= T, M]
    norm = RowNorm(ss, nw, 1e-6)
    want = rms_norm_ref(x, nw, 1e-6)
    for swiglu in (False, True):
        wv = w if swiglu else w[:N].contiguous()
        y = skinny_linear(x, wv, swiglu=swiglu, norm=norm)
        assert rel(y, skinny_linear_ref(x, wv, swiglu=swiglu, norm=norm)) <= TOL[dtype]
        assert rel(y, skinny_linear_ref(want, wv, swiglu=swiglu)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_chain_matches_norm_kernels(dtype):
    """wo -> (norm inside) w13 -> w2 -> (norm inside) qkv equals the unfused chain of add_rms_norm_ref
    and plain linears."""
    M, d, inter = 5, 96, 160
    g, o, wo = _case(M, d, d, dtype, 11)
    w13 = (torch.randn(2 * inter, d, device=DEV, generator=g) / d**0.5).to(dtype)
    w2 = (torch.randn(d, inter, device=DEV, generator=g) / inter**0.5).to(dtype)
    wq = (torch.randn(40, d, device=DEV, generator=g) / d**0.5).to(dtype)
    n1, n2 = ((1 + 0.1 * torch.randn(d, device=DEV, generator=g)).to(dtype) for _ in range(2))
    x0 = (torch.randn(M, d, device=DEV, generator=g) * 2).to(dtype)
    x1, ss = skinny_residual(o, wo, x0, parts=3, config=CFG16)
    a = skinny_linear(x1, w13, swiglu=True, norm=RowNorm(ss, n1, 1e-6))
    x2, ss = skinny_residual(a, w2, x1, parts=2, config=CFG16)
    q = skinny_linear(x2, wq, norm=RowNorm(ss, n2, 1e-6))
    r1, y1 = add_rms_norm_ref(x0, skinny_linear_ref(o, wo), n1, 1e-6)
    r2, y2 = add_rms_norm_ref(r1, skinny_linear_ref(skinny_linear_ref(y1, w13, swiglu=True), w2), n2, 1e-6)
    assert rel(x2, r2) <= 2 * TOL[dtype] and rel(q, skinny_linear_ref(y2, wq)) <= 3 * TOL[dtype]


def test_non_contiguous_rows():
    g, _, w = _case(6, 64, 32, torch.float32, 1)
    xs = torch.randn(6, 80, device=DEV, generator=g)[:, :64]  # rows 80 apart
    assert rel(skinny_linear(xs, w), skinny_linear_ref(xs, w)) <= 1e-5


def test_config_fits_shared_memory_at_64_rows():
    c = skinny_config(64, 4864, 896, 1, True, 132)
    assert c["STAGES"] * (64 + 2 * c["BN"]) * c["BK"] * 2 <= 160 * 1024


def test_bad_arguments():
    _, x, w = _case(4, 32, 16, torch.float32, 2)
    with pytest.raises(KernelArgumentError, match="rows"):
        skinny_linear(torch.zeros(65, 32, device=DEV), w)
    with pytest.raises(KernelArgumentError, match="contiguous"):
        skinny_linear(x, w.t().contiguous().t())
    with pytest.raises(KernelArgumentError, match="even"):
        skinny_linear(x, w[:15].contiguous(), swiglu=True)
    with pytest.raises(KernelArgumentError, match="sumsq"):
        skinny_linear(x, w, norm=RowNorm(torch.zeros(2, 5, device=DEV), torch.ones(32, device=DEV), 1e-6))
    with pytest.raises(KernelArgumentError, match="norm.weight"):
        skinny_linear(x, w, norm=RowNorm(torch.zeros(2, 4, device=DEV), torch.ones(31, device=DEV), 1e-6))
    with pytest.raises(KernelArgumentError, match="residual must hold"):
        skinny_residual(x, w, torch.zeros(4, 15, device=DEV))
    with pytest.raises(KernelArgumentError, match="parts"):
        skinny_residual(x, w, torch.zeros(4, 16, device=DEV), parts=0)
