"""select_indices against the reference: exact equality (same tie rule: lower position first)."""

from __future__ import annotations

import pytest
import torch
from dustin_kernels import KernelArgumentError, select_indices, select_indices_ref
from dustin_kernels.checks import kernel_device


def _scores(B, N, gen, distinct=True):
    if distinct:  # distinct values, both signs
        return torch.stack([torch.randperm(N, generator=gen).float() - N / 3 for _ in range(B)])
    return torch.randint(-3, 4, (B, N), generator=gen).float()  # many ties


# (N_max, lens, budget, sinks, window, m)
CASES = [
    (300, [300, 64, 10, 65], 64, 4, 8, 20),
    (257, [257, 200], 37, 0, 0, 37),
    (500, [499, 100], 50, 3, 0, 0),
    (130, [130, 129], 40, 1, 7, 16),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_secondary", [True, False])
@pytest.mark.parametrize("distinct", [True, False])
def test_matches_reference(case, with_secondary, distinct):
    N, lens, budget, sinks, window, m = case
    dev = kernel_device()
    gen = torch.Generator().manual_seed(CASES.index(case))
    B = len(lens)
    p = _scores(B, N, gen, distinct).to(dev)
    s = _scores(B, N, gen, distinct).to(dev) if with_secondary else None
    cl = torch.tensor(lens, dtype=torch.int32, device=dev)
    out = torch.full((B, budget), -7, dtype=torch.int32, device=dev)
    select_indices(p, s, cl, budget=budget, sinks=sinks, window=window, m=m, out=out, block=64)
    ref = select_indices_ref(p, s, cl, budget=budget, sinks=sinks, window=window, m=m)
    assert torch.equal(out.cpu(), ref.cpu())


@pytest.mark.parametrize("with_secondary", [True, False])
def test_strided_rows_match_reference(with_secondary):
    """Score and output rows that are slices of wider buffers (the launcher takes any row stride)."""
    N, lens, budget, sinks, window, m = CASES[0]
    dev = kernel_device()
    gen = torch.Generator().manual_seed(7)
    B = len(lens)
    p = _scores(B, N + 13, gen).to(dev)[:, :N]
    s = _scores(B, N + 5, gen).to(dev)[:, 3:N + 3] if with_secondary else None
    cl = torch.tensor(lens, dtype=torch.int32, device=dev)
    out = torch.full((B, budget + 9), -7, dtype=torch.int32, device=dev)[:, :budget]
    assert not p.is_contiguous() and not out.is_contiguous()
    select_indices(p, s, cl, budget=budget, sinks=sinks, window=window, m=m, out=out, block=64)
    ref = select_indices_ref(p.contiguous(), None if s is None else s.contiguous(), cl, budget=budget, sinks=sinks,
                             window=window, m=m)
    assert torch.equal(out.cpu(), ref.cpu())


def test_invariants_sorted_unique_exact():
    dev = kernel_device()
    gen = torch.Generator().manual_seed(1)
    p, s = _scores(3, 1000, gen).to(dev), _scores(3, 1000, gen).to(dev)
    cl = torch.tensor([1000, 513, 700], dtype=torch.int32, device=dev)
    out = select_indices(p, s, cl, budget=96, sinks=4, window=16, m=30, block=256).cpu()
    for b in range(3):
        row = out[b]
        assert (row >= 0).all() and (row[1:] > row[:-1]).all() and row[-1] < int(cl[b])
        assert set(range(4)) <= set(row.tolist()) and set(range(int(cl[b]) - 16, int(cl[b]))) <= set(row.tolist())


def test_bad_inputs_raise_dustin_error():
    p = torch.randn(2, 50)
    cl = torch.tensor([50, 40], dtype=torch.int32)
    with pytest.raises(KernelArgumentError, match="exceeds budget"):
        select_indices(p, None, cl, budget=10, sinks=4, window=4, m=4)
    with pytest.raises(KernelArgumentError, match="float32"):
        select_indices(p.double(), None, cl, budget=10, sinks=1, window=1, m=1)
    with pytest.raises(KernelArgumentError, match="score rows must be contiguous"):
        select_indices(p.t().contiguous().t(), None, cl, budget=10, sinks=1, window=1, m=1)


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,distinct,with_secondary", [(16, 32773, True, True), (3, 9000, False, True),
                                                          (1, 65541, True, False), (40, 5000, False, True)])
def test_gpu_programs_per_row(B, N, distinct, with_secondary):
    """Rows split over several programs that meet at barriers (P > 1 runs only on the GPU)."""
    gen = torch.Generator().manual_seed(B)
    p = _scores(B, N, gen, distinct).cuda()
    s = _scores(B, N, gen, distinct).cuda() if with_secondary else None
    cl = torch.randint(N // 2, N + 1, (B,), generator=gen).to(torch.int32)
    cl[0] = 400
    cl = cl.cuda()
    kw = dict(budget=512, sinks=16, window=64, m=216)
    ref = select_indices_ref(p, s, cl, **kw)
    for _ in range(3):  # counters and histograms must be back to zero after each launch
        out = torch.full((B, 512), -7, dtype=torch.int32, device="cuda")
        select_indices(p, s, cl, out=out, **kw)
        assert torch.equal(out, ref)


# ---- both launchers (candidates + ticket, radix + barriers) against the reference ----

# (N_max, lens, budget, sinks, window, m, programs_per_row)
PATH_CASES = [
    (300, [300, 64, 10, 65], 64, 4, 8, 20, 3),  # P not a power of two
    (330, [330, 300], 40, 2, 5, 30, 8),  # slices shorter than m: every valid score is a candidate
    (257, [257, 200], 37, 0, 0, 0, 2),  # m = 0: the second score picks everything
    (500, [499, 300], 50, 3, 4, 43, 4),  # m covers the whole remainder: nothing left for the second
    (90, [90, 60], 20, 1, 1, 5, 1),
]


@pytest.mark.parametrize("case", PATH_CASES)
@pytest.mark.parametrize("distinct", [True, False])
@pytest.mark.parametrize("launcher", ["ticket", "barrier"])
def test_launchers_match_reference(case, distinct, launcher):
    from dustin_kernels.select import _select_barrier, _select_ticket, _ticket_plan

    N, lens, budget, sinks, window, m, P = case
    dev = kernel_device()
    gen = torch.Generator().manual_seed(100 + PATH_CASES.index(case))
    B = len(lens)
    for with_secondary in (True, False):
        p = _scores(B, N, gen, distinct).to(dev)
        s = _scores(B, N, gen, distinct).to(dev) if with_secondary else None
        cl = torch.tensor(lens, dtype=torch.int32, device=dev)
        m1 = m if with_secondary else budget - sinks - window
        m2 = budget - sinks - window - m1
        out = torch.full((B, budget), -7, dtype=torch.int32, device=dev)
        if launcher == "ticket":
            plan = _ticket_plan(B, N, budget, sinks, window, m1, m2, torch.device(dev), programs_per_row=P)
            _select_ticket(p, s, cl, out, budget, sinks, window, m1, m2, plan)
        else:
            _select_barrier(p, s, cl, out, budget, sinks, window, m1, m2, block=64)
        ref = select_indices_ref(p, s, cl, budget=budget, sinks=sinks, window=window, m=m)
        assert torch.equal(out.cpu(), ref.cpu()), (with_secondary, out, ref)


def test_ticket_counters_return_to_zero():
    from dustin_kernels._util import ticket_counters

    dev = kernel_device()
    gen = torch.Generator().manual_seed(3)
    p, s = _scores(2, 400, gen).to(dev), _scores(2, 400, gen).to(dev)
    cl = torch.tensor([400, 390], dtype=torch.int32, device=dev)
    select_indices(p, s, cl, budget=64, sinks=4, window=8, m=20, programs_per_row=3)
    assert int(ticket_counters(torch.device(dev), 2, name="select_ticket")[:2].abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,distinct,with_secondary", [(16, 32773, True, True), (3, 9000, False, True),
                                                          (1, 65541, True, False)])
def test_gpu_barrier_launcher(B, N, distinct, with_secondary):
    """The radix launcher with several programs per row (spin barriers) still matches."""
    from dustin_kernels.select import _select_barrier

    gen = torch.Generator().manual_seed(B + 1)
    p = _scores(B, N, gen, distinct).cuda()
    s = _scores(B, N, gen, distinct).cuda() if with_secondary else None
    cl = torch.randint(N // 2, N + 1, (B,), generator=gen).to(torch.int32).cuda()
    m1 = 216 if with_secondary else 512 - 80
    ref = select_indices_ref(p, s, cl, budget=512, sinks=16, window=64, m=216)
    out = torch.full((B, 512), -7, dtype=torch.int32, device="cuda")
    _select_barrier(p, s, cl, out, 512, 16, 64, m1, 512 - 80 - m1)
    assert torch.equal(out, ref)
