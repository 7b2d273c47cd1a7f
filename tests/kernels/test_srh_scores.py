"""srh_scores against the fp32 reference."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import KernelArgumentError, srh_scores, srh_scores_ref
from dustin_kernels.checks import TOL, kernel_device, poisoned, ragged_lens, rel_err

# (B, Hs, M, D, G, N_max, kv_heads, num_splits)
CASES = [
    (2, 1, 1, 16, 1, 45, [0], None),
    (3, 3, 5, 32, 4, 101, [0, 2, 2], 3),
    (1, 2, 9, 24, 8, 70, [7, 1], 1),
]


def _inputs(B, Hs, M, D, G, N, kv_heads, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hs, M, D, generator=gen).to(device, dtype)
    k = torch.randn(B, G, N, D, generator=gen).to(device, dtype)
    lens = ragged_lens(B, 1, N, gen).to(device)
    return q, torch.tensor(kv_heads, dtype=torch.int32, device=device), k, lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reduce", ["sum", "max"])
@pytest.mark.parametrize("store_probs,queries_as_m", [(None, None), (True, True), (True, False), (False, True),
                                                      (False, False)])
def test_matches_reference(dtype, case, reduce, store_probs, queries_as_m):
    B, Hs, M, D, G, N, kvh, splits = case
    dev = kernel_device()
    q, kv_heads, k, lens = _inputs(B, Hs, M, D, G, N, kvh, dtype, dev, seed=CASES.index(case))
    out = poisoned((B, N), torch.float32, dev)
    srh_scores(q, kv_heads, k, lens, reduce=reduce, out=out, num_splits=splits, block_n=16,
               store_probs=store_probs, queries_as_m=queries_as_m)
    ref = srh_scores_ref(q, kv_heads, k, lens, reduce=reduce)
    assert rel_err(out, ref) <= TOL[dtype]
    for b in range(B):
        assert (out[b, int(lens[b]):] == 0).all()


@pytest.mark.parametrize("store_probs", [True, False])
@pytest.mark.parametrize("accumulate", [False, True])
def test_any_strides_match_reference(store_probs, accumulate):
    """q, k_cache and out as permuted or padded views (the launcher passes every stride)."""
    B, Hs, M, D, G, N, kvh, splits = CASES[1]
    dev = kernel_device()
    q, kv_heads, k, lens = _inputs(B, Hs, M, D, G, N, kvh, torch.float32, dev, seed=11)
    qs = torch.full((B, M, Hs, D + 3), float("nan"), device=dev)[..., :D].transpose(1, 2)
    qs.copy_(q)
    ks = torch.full((G, B, N + 2, D + 5), float("nan"), device=dev)[:, :, :N, :D].transpose(0, 1)
    ks.copy_(k)
    base = torch.rand(B, N, device=dev)
    out = torch.full((B, N + 7), float("nan"), device=dev)[:, :N]
    if accumulate:
        out.copy_(base)
    assert not (qs.is_contiguous() or ks.is_contiguous() or out.is_contiguous())
    srh_scores(qs, kv_heads, ks, lens, out=out, num_splits=splits, block_n=16, store_probs=store_probs,
               accumulate=accumulate)
    ref = srh_scores_ref(q, kv_heads, k, lens, out=base, accumulate=accumulate)
    assert rel_err(out, ref) <= TOL[torch.float32]


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_accumulate_over_layers(reduce):
    dev = kernel_device()
    q, kv_heads, k, lens = _inputs(2, 2, 3, 16, 2, 40, [1, 0], torch.float32, dev, seed=4)
    q2 = torch.randn_like(q)
    out = srh_scores(q, kv_heads, k, lens, reduce=reduce, block_n=16)
    srh_scores(q2, kv_heads, k, lens, reduce=reduce, out=out, accumulate=True, block_n=16)
    ref = srh_scores_ref(q, kv_heads, k, lens, reduce=reduce)
    ref = srh_scores_ref(q2, kv_heads, k, lens, reduce=reduce, out=ref, accumulate=True)
    assert rel_err(out, ref) <= 1e-5


def test_sum_of_probabilities_is_heads_times_queries():
    dev = kernel_device()
    q, kv_heads, k, lens = _inputs(2, 3, 4, 16, 2, 33, [0, 1, 1], torch.float32, dev, seed=8)
    out = srh_scores(q, kv_heads, k, lens, block_n=16)
    torch.testing.assert_close(out.sum(1).cpu(), torch.full((2,), 12.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sms", [1, 3, 64])
def test_grids_for_other_sm_counts_match_reference(sms):
    """`sms` sizes the grids (1 split per sequence and head up to many, pass 2 likewise): the scores
    stay the reference's."""
    dev = kernel_device()
    q, kv_heads, k, lens = _inputs(2, 3, 5, 16, 2, 301, [0, 1, 1], torch.float32, dev, seed=9)
    for reduce in ("sum", "max"):
        out = srh_scores(q, kv_heads, k, lens, reduce=reduce, block_n=16, sms=sms)
        assert rel_err(out, srh_scores_ref(q, kv_heads, k, lens, reduce=reduce)) <= 1e-5


def test_bad_inputs_raise_dustin_error():
    q = torch.randn(1, 2, 3, 16)
    k = torch.randn(1, 2, 10, 16)
    lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(KernelArgumentError, match="kv_heads"):
        srh_scores(q, torch.tensor([0, 1]), k, lens)
    with pytest.raises(KernelArgumentError, match="reduce"):
        srh_scores(q, torch.tensor([0, 1], dtype=torch.int32), k, lens, reduce="mean")
    with pytest.raises(KernelArgumentError, match="accumulate"):
        srh_scores(q, torch.tensor([0, 1], dtype=torch.int32), k, lens, accumulate=True)
    with pytest.raises(KernelArgumentError, match="kv_heads must be contiguous"):
        srh_scores(q, torch.tensor([0, 9, 1, 9], dtype=torch.int32)[::2], k, lens)


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_gpu_bf16(reduce):
    B, Hs, M, D, G, N = 4, 3, 5, 128, 8, 9001
    q, kv_heads, k, lens = _inputs(B, Hs, M, D, G, N, [0, 5, 5], torch.bfloat16, "cuda", seed=21)
    out = poisoned((B, N), torch.float32, "cuda")
    srh_scores(q, kv_heads, k, lens, reduce=reduce, out=out)
    assert rel_err(out, srh_scores_ref(q, kv_heads, k, lens, reduce=reduce)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_two_pass_fallback_matches(reduce, monkeypatch):
    """Without scratch for the probabilities, pass 2 recomputes them from the keys: same result."""
    import importlib

    mod = importlib.import_module("dustin_kernels.srh_scores")  # the package's `srh_scores` is the function

    dev = kernel_device()
    q, kv_heads, k, lens = _inputs(2, 2, 3, 16, 2, 50, [1, 0], torch.float32, dev, seed=6)
    out = srh_scores(q, kv_heads, k, lens, reduce=reduce, block_n=16)
    monkeypatch.setattr(mod, "PROBS_MAX_BYTES", 0)
    out2 = poisoned((2, 50), torch.float32, dev)
    srh_scores(q, kv_heads, k, lens, reduce=reduce, out=out2, block_n=16)
    assert rel_err(out2, out) <= 1e-5
    assert rel_err(out2, srh_scores_ref(q, kv_heads, k, lens, reduce=reduce)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("store_probs", [True, False])
def test_gpu_bf16_stacked_queries(store_probs):
    """The runtime's shape: every query head of a KV head stacked (40 rows), queries as the M side."""
    B, Hs, M, D, G, N = 3, 2, 40, 128, 8, 20011
    q, kv_heads, k, lens = _inputs(B, Hs, M, D, G, N, [1, 6], torch.bfloat16, "cuda", seed=23)
    out = poisoned((B, N), torch.float32, "cuda")
    srh_scores(q, kv_heads, k, lens, out=out, store_probs=store_probs)
    assert rel_err(out, srh_scores_ref(q, kv_heads, k, lens)) <= TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_bf16_two_pass_fallback(monkeypatch):
    import importlib

    mod = importlib.import_module("dustin_kernels.srh_scores")
    monkeypatch.setattr(mod, "PROBS_MAX_BYTES", 0)
    B, Hs, M, D, G, N = 4, 3, 5, 128, 8, 9001
    q, kv_heads, k, lens = _inputs(B, Hs, M, D, G, N, [0, 5, 5], torch.bfloat16, "cuda", seed=22)
    out = poisoned((B, N), torch.float32, "cuda")
    srh_scores(q, kv_heads, k, lens, out=out)
    assert rel_err(out, srh_scores_ref(q, kv_heads, k, lens)) <= TOL[torch.bfloat16]
