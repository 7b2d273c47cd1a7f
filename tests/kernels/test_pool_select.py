"""pool_select against the fp64 reference: exact where no near-tie sits at the S-th row, else the
chosen rows' masses must dominate the rest within rounding."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import KernelArgumentError, pool_select, pool_select_ref

# (B, H, G, M, D, N_max, P, S, sinks, window)
CASES = [
    (2, 4, 4, 1, 16, 45, 30, 13, 1, 3),  # GQA 1, one query, pool shorter than some contexts
    (3, 28, 4, 5, 32, 301, 100, 37, 4, 16),  # GQA 7, budget off the block
    (2, 8, 1, 3, 24, 200, 130, 70, 2, 5),  # GQA 8, odd head dim
    (1, 16, 4, 5, 64, 700, 300, 21, 0, 0),  # GQA 4, no sinks or window
    (2, 7, 1, 2, 16, 90, 77, 77, 4, 8),  # S = P: the pool itself
    (2, 8, 2, 4, 16, 150, 64, 24, 2, 4),  # GQA 4 with 4 queries: rows not a product of coprime sizes
]


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_pool(lens: torch.Tensor, P: int, sinks: int, window: int, gen: torch.Generator) -> torch.Tensor:
    """[B, P] int32: per row, sinks + window + random middle rows of [0, L), ascending, -1 padded
    (all of [0, L) when L <= P; some rows end early to test the padding)."""
    B = lens.numel()
    pool = torch.full((B, P), -1, dtype=torch.int32)
    for b in range(B):
        L = int(lens[b])
        if L <= P:
            rows = torch.arange(L)
        else:
            fixed = torch.cat([torch.arange(min(sinks, L)), torch.arange(max(L - window, sinks), L)])
            middle = torch.arange(sinks, L - window)
            n = P - fixed.numel() - (b % 2) * 3  # odd rows leave three slots empty
            rows = torch.cat([fixed, middle[torch.randperm(middle.numel(), generator=gen)[:n]]])
        rows = torch.sort(rows).values
        pool[b, : rows.numel()] = rows.int()
    return pool


def _inputs(case, dtype, dev, seed, contiguous=True):
    B, H, G, M, D, N, P, S, sinks, window = case
    gen = torch.Generator().manual_seed(seed)
    if contiguous:
        q = torch.randn(B, H, M, D, generator=gen)
        k = torch.randn(B, G, N, D, generator=gen)
    else:  # q as the model has it ([B, M, H, D] transposed), k a slice of a wider cache (sliced on the device:
        q = torch.randn(B, M, H, D, generator=gen).transpose(1, 2)  # a copy there would make it contiguous)
        k = torch.randn(B, G, N + 9, D + 8, generator=gen)
    q, k = (2 * q).to(dev, dtype), k.to(dev, dtype)  # sharper softmax: the choice matters
    if not contiguous:
        k = k[:, :, 3 : N + 3, 4 : D + 4]
    lens = torch.randint(1, N + 1, (B,), generator=gen)
    lens[0] = N
    pool = make_pool(lens, P, sinks, window, gen).to(dev)
    return q, k, pool, lens.to(torch.int32).to(dev)


def check_choice(out, q, k, pool, lens, S, sinks, window, tol):
    """The kernel's sets are the reference's, or differ only at a near-tie of the S-th mass."""
    ref = pool_select_ref(q, k, pool, lens, budget=S, sinks=sinks, window=window)
    out, ref = out.cpu(), ref.cpu()
    B, H, M, D = q.shape
    G = k.shape[1]
    for b in range(B):
        rows = pool[b][pool[b] >= 0].long().cpu()
        for g in range(G):
            got = out[b, g]
            if rows.numel() <= S:
                assert torch.equal(got, ref[b, g]), (b, g)
                continue
            assert (got >= 0).all() and (torch.diff(got) > 0).all(), (b, g, got)
            assert torch.isin(got.long(), rows).all()
            if torch.equal(got, ref[b, g]):
                continue
            L = int(lens[b])
            fixed = (rows < sinks) | (rows >= L - window)
            assert torch.isin(rows[fixed], got.long()).all(), "a sink or window row was dropped"
            qg = q[b, g * (H // G) : (g + 1) * (H // G)].double().cpu().reshape(-1, D)
            mass = torch.softmax(qg @ k[b, g, rows.to(k.device)].double().cpu().T / D**0.5, dim=-1).sum(0)
            picked = torch.isin(rows, got.long())
            lo = mass[picked & ~fixed].min()
            hi = mass[~picked & ~fixed].max()
            assert lo >= hi - tol, f"(b {b}, g {g}): chose mass {lo:.3g} over {hi:.3g}"


TOLS = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-4}  # per unit of mass: fp32 math on the same inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_matches_reference(dtype, case, num_splits):
    B, H, G, M, D, N, P, S, sinks, window = case
    dev = _device()
    q, k, pool, lens = _inputs(case, dtype, dev, seed=CASES.index(case))
    out = torch.full((B, G, S), 12345, dtype=torch.int32, device=dev)  # poisoned: every slot must be written
    scratch = torch.full((B * G * 1024,), float("nan"), device=dev)  # masses must all be written before the select
    pool_select(q, k, pool, lens, budget=S, sinks=sinks, window=window, out=out, block_n=16, num_splits=num_splits,
                scratch=scratch)
    check_choice(out, q, k, pool, lens, S, sinks, window, TOLS[dtype] * H // G * M)
    assert (out != 12345).all()


def test_exact_on_a_clear_margin():
    """Distinct masses far apart: the kernel's sets equal the reference's exactly (any wrong head,
    query or row mapping moves them)."""
    case = CASES[1]
    dev = _device()
    q, k, pool, lens = _inputs(case, torch.float32, dev, seed=11)
    B, H, G, M, D, N, P, S, sinks, window = case
    out = pool_select(q, k, pool, lens, budget=S, sinks=sinks, window=window, block_n=32)
    again = pool_select(q, k, pool, lens, budget=S, sinks=sinks, window=window, block_n=32)  # counters were reset
    assert torch.equal(out, again)
    ref = pool_select_ref(q, k, pool, lens, budget=S, sinks=sinks, window=window)
    assert (out.cpu() == ref.cpu()).float().mean() > 0.99


def test_non_contiguous_inputs():
    case = CASES[2]
    B, H, G, M, D, N, P, S, sinks, window = case
    dev = _device()
    q, k, pool, lens = _inputs(case, torch.float32, dev, seed=5, contiguous=False)
    assert not q.is_contiguous() and not k.is_contiguous()
    out = pool_select(q, k, pool, lens, budget=S, sinks=sinks, window=window)
    check_choice(out, q, k, pool, lens, S, sinks, window, TOLS[torch.float32] * H // G * M)


def test_sinks_and_window_always_kept():
    """Sink and window keys made to draw no attention still make every set."""
    B, H, G, M, D, N, P, S, sinks, window = 2, 8, 2, 3, 16, 120, 60, 20, 3, 6
    dev = _device()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, M, D, generator=gen)
    k = torch.randn(B, G, N, D, generator=gen)
    lens = torch.tensor([N, 97], dtype=torch.int32)
    for b in range(B):  # the fixed rows' keys point away from every query
        L = int(lens[b])
        for r in list(range(sinks)) + list(range(L - window, L)):
            k[b, :, r] = -5 * q[b].mean(dim=(0, 1))
    pool = make_pool(lens, P, sinks, window, gen)
    out = pool_select(q.to(dev), k.to(dev), pool.to(dev), lens.to(dev), budget=S, sinks=sinks, window=window)
    for b in range(B):
        L = int(lens[b])
        fixed = torch.tensor(list(range(sinks)) + list(range(L - window, L)), dtype=torch.int32)
        for g in range(G):
            assert torch.isin(fixed, out[b, g].cpu()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_bf16(case):
    B, H, G, M, D, N, P, S, sinks, window = case
    q, k, pool, lens = _inputs(case, torch.bfloat16, "cuda", seed=CASES.index(case))
    out = pool_select(q, k, pool, lens, budget=S, sinks=sinks, window=window)
    check_choice(out, q, k, pool, lens, S, sinks, window, TOLS[torch.bfloat16] * H // G * M)


@pytest.mark.gpu
def test_gpu_runtime_shape():
    """The 7B verification's shape: 28 query heads on 4 KV heads, 5 queries, D 128, pool 1024 -> 512."""
    case = (4, 28, 4, 5, 128, 4096, 1024, 512, 4, 64)
    q, k, pool, lens = _inputs(case, torch.bfloat16, "cuda", seed=3)
    out = pool_select(q, k, pool, lens, budget=512, sinks=4, window=64)
    check_choice(out, q, k, pool, lens, 512, 4, 64, TOLS[torch.bfloat16] * 7 * 5)


def test_bad_arguments():
    dev = _device()
    q = torch.randn(1, 4, 2, 16, device=dev)
    k = torch.randn(1, 2, 30, 16, device=dev)
    pool = torch.arange(20, dtype=torch.int32, device=dev).view(1, 20)
    lens = torch.tensor([30], dtype=torch.int32, device=dev)
    with pytest.raises(KernelArgumentError, match="sinks \\+ window"):
        pool_select(q, k, pool, lens, budget=8, sinks=4, window=5)
    with pytest.raises(KernelArgumentError, match="pool must be int32"):
        pool_select(q, k, pool.long(), lens, budget=8, sinks=1, window=1)
    with pytest.raises(KernelArgumentError, match="G \\| 4"):
        pool_select(q, torch.randn(1, 3, 30, 16, device=dev), pool, lens, budget=8, sinks=1, window=1)
    with pytest.raises(KernelArgumentError, match="out must have shape"):
        pool_select(q, k, pool, lens, budget=8, sinks=1, window=1, out=torch.empty(1, 2, 9, dtype=torch.int32))
