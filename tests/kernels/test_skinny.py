"""`skinny_linear` (a linear of a few rows: split-K partial sums, bias, SwiGLU fused after gate|up)
vs its torch reference and cuBLAS, and `add_rms_norm` adding up partial sums, on awkward sizes
(interpreter on CPU; bf16 on the GPU)."""

import pytest
import torch
from dustin_kernels import KernelArgumentError
from dustin_kernels.checks import TOL
from dustin_kernels.layer_ops import add_rms_norm, add_rms_norm_ref
from dustin_kernels.skinny import skinny_config, skinny_linear, skinny_linear_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV == "cuda" else [])
# fp32: sums over K <= 1100 products in another order (fp32 eps 6e-8 x sqrt-growth, far below 1e-5);
# fp16 / bf16: the output rounded once more or less than the reference (2^-11 / 2^-8 relative)
TOL = {**TOL, torch.bfloat16: 1.6e-2}  # the package tolerances, bf16 wider (above)


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


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("M,K,N", [(16, 1000, 24), (2, 70, 90)])
def test_partial_sums_add_up_to_the_product(parts, M, K, N):
    _, x, w = _case(M, K, N, torch.float16, parts * K)
    y = skinny_linear(x, w, parts=parts, config={"BN": 16, "BK": 64, "STAGES": 2, "num_warps": 2})
    assert y.dtype == torch.float32 and y.dim() == 3 and y.shape[1:] == (M, N) and 1 <= y.shape[0] <= parts
    assert rel(y.sum(0), skinny_linear_ref(x, w, parts=parts).sum(0)) <= 1e-5  # fp32 sums: only the order differs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("P,rows,d", [(1, 1, 64), (3, 7, 576), (5, 16, 100)])
def test_add_rms_norm_of_partial_sums(dtype, P, rows, d):
    g = torch.Generator(device=DEV).manual_seed(P * rows * d)
    x = (torch.randn(rows, 1, d, device=DEV, generator=g) * 3).to(dtype)
    h = torch.randn(P, rows, d, device=DEV, generator=g)
    w = (1 + 0.1 * torch.randn(d, device=DEV, generator=g)).to(dtype)
    xo, y = add_rms_norm(x, h, w, 1e-6, partials=True)
    xr, yr = add_rms_norm_ref(x, h, w, 1e-6, partials=True)
    assert xo.shape == x.shape and rel(xo, xr) <= TOL[dtype] and rel(y, yr) <= TOL[dtype]
    # the rows of the last position of [P, B, T, d] partial sums: a strided view
    hv = torch.randn(P, rows, 3, d, device=DEV, generator=g)[:, :, -1]
    xo, y = add_rms_norm(x, hv, w, 1e-6, partials=True)
    xr, yr = add_rms_norm_ref(x, hv, w, 1e-6, partials=True)
    assert rel(xo, xr) <= TOL[dtype] and rel(y, yr) <= TOL[dtype]


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
    with pytest.raises(KernelArgumentError, match="partial sums"):
        skinny_linear(x, w, bias=torch.zeros(16, device=DEV), parts=2)
    with pytest.raises(KernelArgumentError, match="even"):
        skinny_linear(x, w[:15].contiguous(), swiglu=True)
    with pytest.raises(KernelArgumentError, match="partial sums must be"):
        add_rms_norm(x, torch.zeros(2, 5, 32, device=DEV), torch.ones(32, device=DEV), 1e-6, partials=True)
