"""full_verify_attention / sparse_verify_attention against the fp32 references."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import (
    KernelArgumentError,
    full_verify_attention,
    full_verify_attention_ref,
    sparse_verify_attention,
    sparse_verify_attention_ref,
    sparse_verify_attention_rope,
    sparse_verify_attention_rope_ref,
)
from dustin_kernels._util import ticket_counters
from dustin_kernels.checks import TOL, kernel_device, poisoned, ragged_lens, rel_err

# (B, H, G, M, D, N_ctx, num_splits): GQA ratios 1/4/7/8, M 1..9, odd lengths, D not a power of 2
CASES = [
    (2, 2, 2, 1, 16, 37, None),
    (2, 4, 1, 5, 32, 53, 3),
    (1, 7, 1, 9, 16, 40, 1),
    (3, 16, 2, 2, 24, 29, 2),
    (2, 8, 8, 3, 32, 70, None),
]


def _inputs(B, H, G, M, D, N_ctx, dtype, device, new_in_cache, seed):
    gen = torch.Generator().manual_seed(seed)
    n_max = N_ctx + M + 3  # spare rows past the new tokens
    q = torch.randn(B, H, M, D, generator=gen).to(device, dtype)
    k = torch.randn(B, G, n_max, D, generator=gen).to(device, dtype)
    v = torch.randn(B, G, n_max, D, generator=gen).to(device, dtype)
    lens = ragged_lens(B, max(1, N_ctx // 3), N_ctx, gen).to(device)
    kn = vn = None
    if not new_in_cache:
        kn = torch.randn(B, G, M, D, generator=gen).to(device, dtype)
        vn = torch.randn(B, G, M, D, generator=gen).to(device, dtype)
    return q, k, v, lens, kn, vn, gen


def _indices(lens, S, G, per_head, gen, device):
    """Sorted random row sets per sequence (and per KV head), -1 padded where S > L."""
    B = lens.numel()
    idx = torch.full((B, G, S) if per_head else (B, S), -1, dtype=torch.int32)
    for b in range(B):
        L = int(lens[b])
        for g in range(G if per_head else 1):
            rows = torch.sort(torch.randperm(L, generator=gen)[:S]).values.to(torch.int32)
            (idx[b, g] if per_head else idx[b])[: rows.numel()] = rows
    return idx.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("new_in_cache", [True, False])
def test_full_matches_reference(dtype, case, new_in_cache):
    B, H, G, M, D, N_ctx, splits = case
    dev = kernel_device()
    q, k, v, lens, kn, vn, _ = _inputs(B, H, G, M, D, N_ctx, dtype, dev, new_in_cache, seed=CASES.index(case))
    out = poisoned((B, H, M, D), dtype, dev)
    full_verify_attention(q, k, v, lens, kn, vn, out=out, num_splits=splits, block_n=16)
    ref = full_verify_attention_ref(q, k, v, lens, kn, vn)
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("per_head", [False, True])
def test_sparse_matches_reference(dtype, case, per_head):
    B, H, G, M, D, N_ctx, splits = case
    dev = kernel_device()
    q, k, v, lens, kn, vn, gen = _inputs(B, H, G, M, D, N_ctx, dtype, dev, per_head, seed=7 + CASES.index(case))
    S = 21  # not a multiple of the block; larger than some of the ragged lengths (S >= L: padding)
    idx = _indices(lens.cpu(), S, G, per_head, gen, dev)
    out = poisoned((B, H, M, D), dtype, dev)
    sparse_verify_attention(q, k, v, idx, lens, kn, vn, out=out, num_splits=splits, block_n=16)
    ref = sparse_verify_attention_ref(q, k, v, idx, lens, kn, vn)
    assert rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("splits", [None, 1])
def test_wide_tile_defaults_match_reference(splits):
    """More than 128 query rows a group (exact mode's confirmation pass: K (gamma + 1) rows a head) take
    the wide tile's own defaults (block_n 64, 3 stages): the reference's output on ragged lengths."""
    B, H, G, M, D, N_ctx = 2, 9, 1, 17, 16, 150  # 153 rows a group: a 256-row tile
    dev = kernel_device()
    q, k, v, lens, _, _, _ = _inputs(B, H, G, M, D, N_ctx, torch.float32, dev, True, seed=70)
    out = full_verify_attention(q, k, v, lens, num_splits=splits)
    assert rel_err(out, full_verify_attention_ref(q, k, v, lens)) <= TOL[torch.float32]


def strided(t: torch.Tensor, perm: tuple[int, ...], pad: int = 3) -> torch.Tensor:
    """A copy of t as a non-contiguous view: stored with dims permuted by `perm` and the last
    stored dim padded by `pad` unused elements."""
    store = torch.full([t.shape[p] for p in perm[:-1]] + [t.shape[perm[-1]] + pad], float("nan") if
                       t.is_floating_point() else -9, dtype=t.dtype, device=t.device)
    inv = [perm.index(i) for i in range(t.dim())]
    view = store[..., : t.shape[perm[-1]]].permute(*inv)
    view.copy_(t)
    assert not view.is_contiguous()
    return view


@pytest.mark.parametrize("sparse,per_head", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("splits", [1, 3])
def test_any_strides_match_reference(sparse, per_head, splits):
    """q, k_cache, v_cache, k_new, v_new, indices and out as permuted, padded views: the launchers
    promise any strides."""
    B, H, G, M, D, N_ctx = 2, 6, 2, 3, 16, 45
    dev = kernel_device()
    q, k, v, lens, kn, vn, gen = _inputs(B, H, G, M, D, N_ctx, torch.float32, dev, False, seed=50 + splits)
    idx = _indices(lens.cpu(), 21, G, per_head, gen, dev)
    qs, ks, vs = strided(q, (0, 2, 1, 3)), strided(k, (2, 0, 1, 3)), strided(v, (0, 2, 1, 3), pad=5)
    kns, vns = strided(kn, (0, 2, 1, 3)), strided(vn, (2, 1, 0, 3))
    idxs = strided(idx, (1, 0) if not per_head else (2, 0, 1))
    out = strided(poisoned((B, H, M, D), torch.float32, dev), (0, 2, 1, 3))
    if sparse:
        sparse_verify_attention(qs, ks, vs, idxs, lens, kns, vns, out=out, num_splits=splits, block_n=16)
        ref = sparse_verify_attention_ref(q, k, v, idx, lens, kn, vn)
    else:
        full_verify_attention(qs, ks, vs, lens, kns, vns, out=out, num_splits=splits, block_n=16)
        ref = full_verify_attention_ref(q, k, v, lens, kn, vn)
    assert rel_err(out, ref) <= TOL[torch.float32]
    # the new tokens read from the cache rows (no k_new / v_new), through strided caches
    if sparse:
        got = sparse_verify_attention(qs, ks, vs, idxs, lens, num_splits=splits, block_n=16)
        want = sparse_verify_attention_ref(q, k, v, idx, lens)
    else:
        got = full_verify_attention(qs, ks, vs, lens, num_splits=splits, block_n=16)
        want = full_verify_attention_ref(q, k, v, lens)
    assert rel_err(got, want) <= TOL[torch.float32]


def test_sparse_with_every_row_equals_full():
    B, H, G, M, D, N_ctx = 2, 4, 2, 3, 16, 33
    dev = kernel_device()
    q, k, v, lens, _, _, _ = _inputs(B, H, G, M, D, N_ctx, torch.float32, dev, True, seed=3)
    idx = torch.full((B, 48), -1, dtype=torch.int32)
    for b in range(B):
        idx[b, : int(lens[b])] = torch.arange(int(lens[b]), dtype=torch.int32)
    sparse = sparse_verify_attention(q, k, v, idx.to(dev), lens, num_splits=2, block_n=16)
    full = full_verify_attention(q, k, v, lens, num_splits=3, block_n=16)
    assert rel_err(sparse, full.float()) <= 1e-5


@pytest.mark.parametrize("sparse", [False, True])
def test_default_output_is_token_major(sparse):
    """Without `out` the result is [B, H, M, D] over a [B, M, H, D] buffer, so the model's
    transpose(1, 2).reshape(B, M, H * D) before wo is a view of it (no copy), with the same values."""
    B, H, G, M, D, N_ctx = 2, 7, 1, 5, 16, 31
    dev = kernel_device()
    q, k, v, lens, _, _, gen = _inputs(B, H, G, M, D, N_ctx, torch.float32, dev, True, seed=61)
    if sparse:
        idx = _indices(lens.cpu(), 13, G, False, gen, dev)
        out = sparse_verify_attention(q, k, v, idx, lens, num_splits=2, block_n=16)
        ref = sparse_verify_attention_ref(q, k, v, idx, lens)
    else:
        out = full_verify_attention(q, k, v, lens, num_splits=2, block_n=16)
        ref = full_verify_attention_ref(q, k, v, lens)
    assert tuple(out.shape) == (B, H, M, D) and out.transpose(1, 2).is_contiguous()
    flat = out.transpose(1, 2).reshape(B, M, H * D)
    assert flat.data_ptr() == out.data_ptr()  # a view
    assert rel_err(flat, ref.transpose(1, 2).reshape(B, M, H * D)) <= TOL[torch.float32]


def _rope_table(n: int, D: int, device, base: float = 500.0) -> torch.Tensor:
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return torch.stack([ang.cos(), ang.sin()]).float().to(device)  # [2, n, D]


# (B, H, G, M, D, N_ctx, splits): GQA 1/4/7/8, one and two tokens and the verification's five, odd lengths
ROPE_CASES = [(2, 4, 1, 1, 16, 37, None), (3, 7, 1, 2, 32, 53, 3), (2, 8, 1, 5, 16, 29, 2), (1, 8, 8, 3, 64, 70, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope_variant_matches_reference(dtype, case):
    """RoPE and the cache write inside the sparse kernel = the rope kernel's reference + the sparse
    reference: the output, the RoPE'd queries, the rows written (keys rotated, values as given) and
    nothing else of the cache; qkv a non-contiguous view (a wider buffer's columns)."""
    B, H, G, M, D, N_ctx, splits = case
    dev = kernel_device()
    gen = torch.Generator().manual_seed(70 + ROPE_CASES.index(case))
    n_max = N_ctx + M + 3
    width = (H + 2 * G) * D
    qkv = torch.randn(B, M, width + 5, generator=gen).to(dev, dtype)[..., 3: 3 + width]
    assert not qkv.is_contiguous()
    k = torch.randn(B, G, n_max, D, generator=gen).to(dev, dtype)
    v = torch.randn(B, G, n_max, D, generator=gen).to(dev, dtype)
    lens = ragged_lens(B, max(1, N_ctx // 3), N_ctx, gen).to(dev)
    idx = _indices(lens.cpu(), 19, G, False, gen, dev)
    rope = _rope_table(n_max + 5, D, dev)
    k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
    out, q = sparse_verify_attention_rope(qkv, rope, k1, v1, idx, lens, H, num_splits=splits, block_n=16)
    ref, q_ref = sparse_verify_attention_rope_ref(qkv, rope, k2, v2, idx, lens, H)
    assert rel_err(out, ref) <= TOL[dtype]
    assert rel_err(q, q_ref) <= TOL[dtype]
    assert rel_err(k1, k2) <= TOL[dtype] and torch.equal(v1, v2)  # new rows written, the rest untouched
    for b in range(B):  # the rows written are exactly lens[b] .. lens[b] + M - 1
        L = int(lens[b])
        changed = (k1[b] != k[b]).any(-1).any(0).nonzero().flatten().tolist()
        assert set(changed) <= set(range(L, L + M)) and changed


@pytest.mark.parametrize("early,splits", [(True, 3), (False, 3), (True, 1), (False, 1), (True, 5)])
def test_rope_variant_early_rows(early, splits):
    """The first block of indexed rows loaded before the wait (`early`, the default of this kernel) or
    after it, with one split and with several (a split's first block may hold a single row or none):
    the same output as the reference, the counters back at 0."""
    B, H, G, M, D, N_ctx = 3, 7, 1, 2, 32, 61
    dev = kernel_device()
    gen = torch.Generator().manual_seed(91)
    n_max = N_ctx + M + 3
    qkv = torch.randn(B, M, (H + 2 * G) * D, generator=gen).to(dev)
    k = torch.randn(B, G, n_max, D, generator=gen).to(dev)
    v = torch.randn(B, G, n_max, D, generator=gen).to(dev)
    lens = ragged_lens(B, 20, N_ctx, gen).to(dev)
    idx = _indices(lens.cpu(), 40, G, False, gen, dev)
    rope = _rope_table(n_max + 5, D, dev)
    out, q = sparse_verify_attention_rope(qkv, rope, k.clone(), v.clone(), idx, lens, H, num_splits=splits,
                                          block_n=16, early=early)
    ref, q_ref = sparse_verify_attention_rope_ref(qkv, rope, k.clone(), v.clone(), idx, lens, H)
    assert rel_err(out, ref) <= TOL[torch.float32] and rel_err(q, q_ref) <= TOL[torch.float32]
    assert int(ticket_counters(torch.device(dev), B * G)[: B * G].abs().sum()) == 0


def test_rope_variant_refuses_bad_inputs():
    dev = kernel_device()
    qkv = torch.zeros(1, 2, (4 + 2) * 16, device=dev)
    k = torch.zeros(1, 1, 40, 16, device=dev)
    idx = torch.zeros(1, 8, dtype=torch.int32, device=dev)
    lens = torch.full((1,), 20, dtype=torch.int32, device=dev)
    rope = _rope_table(64, 16, dev)
    with pytest.raises(KernelArgumentError, match="last dim"):
        sparse_verify_attention_rope(qkv, rope, k, k.clone(), idx, lens, 5)
    with pytest.raises(KernelArgumentError, match="rope"):
        sparse_verify_attention_rope(qkv, rope.double(), k, k.clone(), idx, lens, 4)
    with pytest.raises(KernelArgumentError, match="indices"):
        sparse_verify_attention_rope(qkv, rope, k, k.clone(), idx.long(), lens, 4)
    with pytest.raises(TypeError, match="blok_n"):
        sparse_verify_attention_rope(qkv, rope, k, k.clone(), idx, lens, 4, blok_n=16)


def test_ticket_counters_return_to_zero():
    dev = kernel_device()
    q, k, v, lens, _, _, _ = _inputs(3, 4, 2, 2, 16, 40, torch.float32, dev, True, seed=5)
    full_verify_attention(q, k, v, lens, num_splits=4, block_n=16)
    assert int(ticket_counters(torch.device(dev), 6)[:6].abs().sum()) == 0


def test_default_scale_and_explicit_scale():
    dev = kernel_device()
    q, k, v, lens, _, _, _ = _inputs(1, 2, 1, 2, 16, 20, torch.float32, dev, True, seed=9)
    out = full_verify_attention(q, k, v, lens, scale=0.3, block_n=16)
    ref = full_verify_attention_ref(q, k, v, lens, scale=0.3)
    assert rel_err(out, ref) <= 1e-5


def test_bad_inputs_raise_dustin_error():
    q = torch.randn(1, 3, 2, 16)
    k = torch.randn(1, 2, 10, 16)
    lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(KernelArgumentError, match="multiple of KV heads"):
        full_verify_attention(q, k, k, lens)
    with pytest.raises(KernelArgumentError, match="int32"):
        full_verify_attention(q[:, :2], k, k, lens.long())
    with pytest.raises(KernelArgumentError, match="indices"):
        sparse_verify_attention(q[:, :2], k, k, torch.zeros(1, 2, 2, 4, dtype=torch.int32), lens)
    with pytest.raises(KernelArgumentError, match="cache_lens must be contiguous"):
        q2, k2 = torch.randn(2, 2, 2, 16), torch.randn(2, 2, 10, 16)
        full_verify_attention(q2, k2, k2, torch.tensor([5, 0, 5, 0], dtype=torch.int32)[::2])


# ---- GPU (bf16), run through the device tool ----

GPU_CASES = [  # (B, H, G, M, D, N_ctx)
    (3, 64, 8, 5, 128, 4099),
    (2, 64, 8, 9, 128, 2500),
    (2, 28, 4, 9, 128, 3001),
    (4, 14, 2, 1, 64, 2048),
    (2, 9, 3, 4, 64, 777),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
@pytest.mark.parametrize("new_in_cache", [True, False])
def test_gpu_bf16_full_and_sparse(case, new_in_cache):
    B, H, G, M, D, N_ctx = case
    dtype = torch.bfloat16
    q, k, v, lens, kn, vn, gen = _inputs(B, H, G, M, D, N_ctx, dtype, "cuda", new_in_cache, seed=11)
    out = poisoned((B, H, M, D), dtype, "cuda")
    full_verify_attention(q, k, v, lens, kn, vn, out=out)
    assert rel_err(out, full_verify_attention_ref(q, k, v, lens, kn, vn)) <= TOL[dtype]
    for per_head in (False, True):
        idx = _indices(lens.cpu(), 515, G, per_head, gen, "cuda")
        out = poisoned((B, H, M, D), dtype, "cuda")
        sparse_verify_attention(q, k, v, idx, lens, kn, vn, out=out)
        assert rel_err(out, sparse_verify_attention_ref(q, k, v, idx, lens, kn, vn)) <= TOL[dtype]


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    B, H, G, M, D, N_ctx = 4, 64, 8, 5, 128, 3000
    q, k, v, lens, _, _, gen = _inputs(B, H, G, M, D, N_ctx, torch.bfloat16, "cuda", True, seed=13)
    idx = _indices(lens.cpu(), 512, G, False, gen, "cuda")
    o_full = torch.empty_like(q)
    o_sparse = torch.empty_like(q)
    full_verify_attention(q, k, v, lens, out=o_full)  # warm-up: compile, counters
    sparse_verify_attention(q, k, v, idx, lens, out=o_sparse)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        full_verify_attention(q, k, v, lens, out=o_full)
        sparse_verify_attention(q, k, v, idx, lens, out=o_sparse)
    for _ in range(3):
        q.normal_()
        o_full.fill_(float("nan"))
        o_sparse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(o_full, full_verify_attention_ref(q, k, v, lens)) <= 1e-2
        assert rel_err(o_sparse, sparse_verify_attention_ref(q, k, v, idx, lens)) <= 1e-2


@pytest.mark.gpu
def test_gpu_sparse_reads_what_the_previous_kernel_wrote():
    """With programmatic dependent launch the kernel starts early; q and the index set written by
    the kernels just before it (inside a graph, as in a decode step) must still be the new ones."""
    B, H, G, M, D, N_ctx = 8, 64, 8, 5, 128, 6000
    q, k, v, lens, _, _, gen = _inputs(B, H, G, M, D, N_ctx, torch.bfloat16, "cuda", True, seed=19)
    idx_sets = [_indices(lens.cpu(), 512, G, False, gen, "cuda") for _ in range(3)]
    q_src, idx_src = q.clone(), idx_sets[0].clone()
    out = torch.empty_like(q)
    sparse_verify_attention(q, k, v, idx_src, lens, out=out)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.add(idx_src, 0, out=idx_sets[0])  # kernels that write the inputs right before it
        torch.mul(q_src, 1.0, out=q)
        sparse_verify_attention(q, k, v, idx_sets[0], lens, out=out)
    for i in range(3):
        q_src.normal_()
        idx_src.copy_(idx_sets[i])
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, sparse_verify_attention_ref(q_src, k, v, idx_sets[i], lens)) <= 1e-2
