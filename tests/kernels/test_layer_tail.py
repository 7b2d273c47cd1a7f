"""`layer_tail` (a decoder layer after its attention as one persistent kernel: wo + residual, the MLP
norm, gate|up + SwiGLU, w2 + residual, the next norm and qkv projection or the final norm) vs its
torch reference on awkward sizes (interpreter on CPU: a launch per phase; bf16 and the one-launch
grid barriers on the GPU)."""

import pytest
import torch
from dustin_kernels import KernelArgumentError
from dustin_kernels._util import ticket_counters
from dustin_kernels.layer_tail import layer_tail, layer_tail_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV == "cuda" else [])
# fp32: sums of <= 600 products in another order (far below 1e-5). fp16 / bf16: each intermediate
# (x1, the normed rows, gate / up, the SwiGLU output, x2) is rounded to the activation dtype where the
# reference rounds it, but from fp32 sums taken in another order, so a few elements land one unit of
# the last place away (2^-11 / 2^-8 relative) and carry it through; a relative norm error of that size
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def _weights(M, d, q, inter, n, dtype, seed, bias=False):
    g = torch.Generator(device=DEV).manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, device=DEV, generator=g) * scale).to(dtype)

    w = {
        "o": r(M, q), "x": r(M, d, scale=2.0), "wo": r(d, q, scale=q**-0.5), "ffn_norm": (1 + r(d, scale=0.2)),
        "w13": r(2 * inter, d, scale=d**-0.5), "w2": r(d, inter, scale=inter**-0.5), "next_norm": (1 + r(d, scale=0.2)),
        "next_w": r(n, d, scale=d**-0.5) if n else None,
    }
    kw = {"bo": r(d) if bias else None, "next_b": r(n) if bias and n else None}
    return w, kw


def _run(fn, w, kw):
    return fn(w["o"], w["x"], w["wo"], w["ffn_norm"], w["w13"], w["w2"], w["next_norm"], w["next_w"], eps=1e-6, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,d,q,inter,n,bias", [
    (1, 64, 64, 48, 80, False),  # one row
    (5, 96, 64, 80, 112, True),  # wo and qkv biases
    (16, 200, 72, 300, 0, False),  # the final norm (no next linear); d, q, inter off the block sizes
    (13, 136, 128, 272, 200, True),
    (32, 64, 64, 48, 40, False),  # the most rows it takes
])
def test_matches_reference(dtype, M, d, q, inter, n, bias):
    w, kw = _weights(M, d, q, inter, n, dtype, M * d + inter, bias)
    x2, out = _run(layer_tail, w, kw)
    rx2, rout = _run(layer_tail_ref, w, kw)
    assert x2.shape == (M, d) and out.shape == (M, n or d) and out.dtype == dtype
    assert rel(x2, rx2) <= TOL[dtype] and rel(out, rout) <= TOL[dtype]


def test_leading_shape_and_strided_rows():
    """[B, T, ...] inputs keep their leading shape; rows of o and x may sit in wider buffers."""
    w, kw = _weights(6, 96, 64, 80, 112, torch.float32, 7)
    o_buf, x_buf = torch.zeros(6, 100, device=DEV), torch.zeros(6, 130, device=DEV)
    o_buf[:, 3:67], x_buf[:, 1:97] = w["o"], w["x"]
    ref = _run(layer_tail_ref, w, kw)
    w2 = dict(w, o=o_buf[:, 3:67].view(3, 2, 64), x=x_buf[:, 1:97].view(3, 2, 96))
    x2, out = _run(layer_tail, w2, kw)
    assert x2.shape == (3, 2, 96) and out.shape == (3, 2, 112)
    assert rel(x2.view(6, 96), ref[0]) <= 1e-5 and rel(out.view(6, 112), ref[1]) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 32, 7])
def test_one_launch_with_barriers_equals_a_launch_per_phase(M):
    """At the Qwen2.5-0.5B draft's shapes in bf16: the one-launch grid (barriers between phases) gives
    bit for bit what separate launches give, for every grid size (tiles land on other programs, the
    sums do not change), and the barrier counter is back at zero after each launch."""
    w, kw = _weights(M, 896, 896, 4864, 1152, torch.bfloat16, M, bias=False)
    kw["next_b"] = torch.randn(1152, device=DEV).to(torch.bfloat16)
    ref = _run(lambda *a, **k: layer_tail(*a, **k, phases_per_launch=1), w, kw)
    ref_t = _run(layer_tail_ref, w, kw)
    assert rel(ref[0], ref_t[0]) <= TOL[torch.bfloat16] and rel(ref[1], ref_t[1]) <= TOL[torch.bfloat16]
    cnt = ticket_counters(torch.device(DEV), 1, name="layer-tail")
    for programs in (None, 64, 5, 1):
        for per in (4, 2):
            for _ in range(2):
                got = _run(lambda *a, P=programs, per=per, **k: layer_tail(*a, **k, programs=P, phases_per_launch=per), w, kw)
                torch.cuda.synchronize()
                assert int(cnt[0]) == 0
                assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), (programs, per)


@pytest.mark.gpu
def test_in_a_cuda_graph():
    w, kw = _weights(16, 896, 896, 4864, 0, torch.bfloat16, 3)
    eager = _run(layer_tail, w, kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _run(layer_tail, w, kw)  # warm-up: compile, counters
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _run(layer_tail, w, kw)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])


def test_bad_arguments():
    w, kw = _weights(4, 64, 64, 48, 80, torch.float32, 1)
    with pytest.raises(KernelArgumentError, match="rows"):
        _run(layer_tail, dict(w, o=torch.zeros(33, 64, device=DEV), x=torch.zeros(33, 64, device=DEV)), kw)
    with pytest.raises(KernelArgumentError, match="w2 must have shape"):
        _run(layer_tail, dict(w, w2=w["w2"][:, :40].contiguous()), kw)
    with pytest.raises(KernelArgumentError, match="wo must be contiguous"):
        _run(layer_tail, dict(w, wo=w["wo"].t().contiguous().t()), kw)
    with pytest.raises(KernelArgumentError, match="leading shape"):
        _run(layer_tail, dict(w, o=w["o"][:3]), kw)
    with pytest.raises(KernelArgumentError, match="next_b"):
        _run(layer_tail, dict(w, next_w=None), {"next_b": torch.zeros(80, device=DEV)})
    if DEV == "cpu":
        with pytest.raises(KernelArgumentError, match="interpreter"):
            layer_tail(w["o"], w["x"], w["wo"], w["ffn_norm"], w["w13"], w["w2"], w["next_norm"], eps=1e-6,
                       phases_per_launch=4)
