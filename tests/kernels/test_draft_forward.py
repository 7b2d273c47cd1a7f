"""`draft_forward` (one persistent CUDA kernel for the draft's decode forward over its set) against its
torch twin on awkward shapes (GQA 1/4/7/8, odd set sizes with padding, per-sequence lengths, 1-4
tokens, 6 to 32 rows, with and without biases); the launcher's refusals on the CPU."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import KernelArgumentError
from dustin_kernels.draft_forward import (
    SMEM_LIMIT,
    draft_forward,
    draft_forward_ref,
    smem_bytes,
    supported,
)
from dustin_kernels.layer_ops import add_rms_norm_ref

D = 64


def make(B, T, H, G, hidden, inter, layers, ni, *, bias, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    nmax = ni + 80  # cache rows: room for the set, the lengths above it and the new tokens

    def rnd(*shape, std=0.05):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16).to(device)

    ws = []
    for _ in range(layers):
        ws.append((rnd((H + 2 * G) * D, hidden), rnd((H + 2 * G) * D, std=0.5) if bias else None,
                   rnd(hidden, H * D), rnd(hidden, std=0.5) if bias else None, rnd(2 * inter, hidden),
                   rnd(hidden, inter), (1 + rnd(hidden, std=0.2).float()).to(torch.bfloat16),
                   (1 + rnd(hidden, std=0.2).float()).to(torch.bfloat16)))
    kc = [rnd(B, G, nmax, D, std=1.0) for _ in range(layers)]
    vc = [rnd(B, G, nmax, D, std=1.0) for _ in range(layers)]
    lens = torch.randint(ni, nmax - T, (B,), generator=g).to(torch.int32)
    idx = torch.full((B, ni + 5), -1, dtype=torch.int32)
    for b in range(B):
        idx[b, :ni] = torch.sort(torch.randperm(int(lens[b]), generator=g)[:ni]).values.to(torch.int32)
    pos = torch.arange(nmax + 8, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.cat([pos[:, None] * inv[None], pos[:, None] * inv[None]], dim=1)
    rope = torch.stack([ang.cos(), ang.sin()]).contiguous().to(device)
    x = rnd(B, T, hidden, std=1.0)
    return x, ws, kc, vc, idx.to(device), lens.to(device), rope


def test_supported_is_false_off_hopper_and_for_other_shapes():
    cpu = torch.device("cpu")
    kw = dict(hidden=896, heads=14, kv_heads=2, head_dim=64, inter=4864, qk_norm=False, B=16, T=1)
    assert not supported(cpu, torch.bfloat16, **kw)
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        cuda = torch.device("cuda")
        assert supported(cuda, torch.bfloat16, **kw)
        assert not supported(cuda, torch.float16, **kw)
        assert not supported(cuda, torch.bfloat16, **{**kw, "head_dim": 128})
        assert not supported(cuda, torch.bfloat16, **{**kw, "qk_norm": True})
        assert not supported(cuda, torch.bfloat16, **{**kw, "T": 3})  # 7 x 3 query rows per KV head > 16
        assert not supported(cuda, torch.bfloat16, **{**kw, "B": 17, "T": 2})  # 34 rows


def test_refuses_cpu_tensors_with_one_error():
    x, ws, kc, vc, idx, lens, rope = make(2, 1, 4, 2, 64, 64, 1, 9, bias=False, device="cpu")
    with pytest.raises(KernelArgumentError):
        draft_forward(x, ws, kc, vc, idx, lens, rope, num_heads=4, eps=1e-6)


def test_shared_memory_fits_one_block_per_sm_at_the_draft_presets():
    for d, H, G, inter in ((896, 14, 2, 4864), (576, 9, 3, 1536)):  # Qwen2.5-0.5B, SmolLM2-135M
        for mt in (1, 2):
            assert smem_bytes(d, H, G, D, inter, mt) <= SMEM_LIMIT, (d, mt)
    assert smem_bytes(2048, 32, 8, D, 8192, 1) > SMEM_LIMIT  # Llama-3.2-1B: not taken (module doc)


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,H,G,hidden,inter,layers,ni,bias", [
    (3, 2, 14, 2, 256, 320, 3, 37, True),     # GQA 7, two tokens, odd set with padding
    (5, 1, 4, 4, 128, 96, 2, 16, False),      # GQA 1
    (2, 4, 8, 2, 192, 160, 2, 1, True),       # GQA 4, four tokens (16 query rows), one indexed row
    (16, 2, 8, 1, 128, 64, 2, 67, False),     # GQA 8, 32 rows (two row tiles)
    (16, 1, 14, 2, 896, 4864, 2, 521, True),  # the Qwen2.5-0.5B draft's shapes
])
def test_matches_reference(B, T, H, G, hidden, inter, layers, ni, bias):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a Hopper GPU")
    x, ws, kc, vc, idx, lens, rope = make(B, T, H, G, hidden, inter, layers, ni, bias=bias, device="cuda")
    kr, vr = [k.clone() for k in kc], [v.clone() for v in vc]
    resid, h, q = draft_forward(x, ws, kc, vc, idx, lens, rope, num_heads=H, eps=1e-6)
    rr, hr, qr = draft_forward_ref(x, ws, kr, vr, idx, lens, rope, num_heads=H, eps=1e-6)
    torch.cuda.synchronize()
    nw = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    y = add_rms_norm_ref(resid, h.to(torch.bfloat16), nw, 1e-6)[1].float()
    yr = add_rms_norm_ref(rr, hr.to(torch.bfloat16), nw, 1e-6)[1].float()
    # bf16 roundings of the same math in another summation order, compounded over the layers:
    # a few bf16 ulps (2^-8 relative) per element at most, and the mean far below
    assert (y - yr).abs().max().item() < 0.1 * yr.abs().max().item()
    assert (y - yr).abs().mean().item() < 0.01 * yr.abs().mean().item()
    assert (q.float() - qr.float()).abs().max().item() < 0.05 * qr.float().abs().max().item()
    for got, want in zip(kc + vc, kr + vr, strict=True):  # the new rows written as the reference writes them
        assert (got.float() - want.float()).abs().max().item() < 0.05 * want.float().abs().max().item()
    mask = torch.ones_like(kc[0], dtype=torch.bool)  # rows outside the new tokens: untouched, bit for bit
    for b in range(B):
        mask[b, :, int(lens[b]):int(lens[b]) + T] = False
    k0 = make(B, T, H, G, hidden, inter, layers, ni, bias=bias, device="cuda")[2][0]
    assert torch.equal(kc[0][mask], k0[mask])


def test_cuda_jit_refuses_a_cpu_device():
    from dustin_kernels.cuda_jit import kernel

    with pytest.raises(KernelArgumentError):
        kernel('extern "C" __global__ void k() {}', "k", {}, torch.device("cpu"))


def test_the_cuda_source_ships_with_the_package():
    import dustin_kernels.draft_forward as dfw

    with open(dfw._SOURCE) as f:
        assert 'extern "C" __global__' in f.read()
