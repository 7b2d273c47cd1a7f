"""Attention Recovery Rate (ARR, defined in `dustin_runtime.sparse.recovery`) of verification sets on
recorded calibration statistics.

For one verification pass with context L, A [L] is `context_attention` of the target's true
verification attention, averaged over layers, query heads and the gamma + 1 verification queries.
By linearity ARR(I) = sum_{i in I} A[i], so ARR = 1 when I covers the context.

The runtime's set (`select_indices`): sinks [0, sinks) + window [L - window, L) + the top-m of
the draft signal over the middle + the top (F - m) of the target signal over what remains, with
F = S - sinks - window, ties to the lower position; all of [0, L) when L <= S.
`arr_grid` evaluates that set for many m at once from two stable sorts (each ranking needs only
its top F); `arr_exact` goes through `select_indices` itself (the test pins them together)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dustin_runtime.sparse.recovery import recovery


@dataclass
class CalibStats:
    """Recorded statistics of all verification passes (P of them), padded to N positions."""

    lengths: torch.Tensor  # [P] int64: context rows L of each pass
    attn: torch.Tensor  # [P, N] fp32: A (0 past L)
    draft: torch.Tensor  # [Cd, P, N] fp32: draft lookahead signal of each draft KV head
    target: torch.Tensor  # [Ct, P, N] fp32: target history signal of each target KV head
    layer_attn: torch.Tensor | None = None  # [P, Lt, N] fp16: per-layer A
    quest: torch.Tensor | None = None  # [P, Lt, nb]: Quest's per-layer ARR at `quest_budgets`
    quest_budgets: tuple[int, ...] = ()
    weight: torch.Tensor | None = None  # [P] fp32 summing to 1 (None: every pass counts the same)

    def average(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of per-pass values x [..., P] over the passes, with the pass weights if any."""
        return x.mean(-1) if self.weight is None else (x * self.weight.to(x.dtype)).sum(-1)

    def to(self, device) -> CalibStats:
        move = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return CalibStats(**move)


def middle_mask(lengths: torch.Tensor, N: int, sinks: int, window: int) -> torch.Tensor:
    """[P, N] bool: the positions [sinks, L - window) that the signals choose from."""
    pos = torch.arange(N, device=lengths.device)
    return (pos >= sinks) & (pos < (lengths.view(-1, 1) - window))


def ranking(signal: torch.Tensor, middle: torch.Tensor, top: int) -> torch.Tensor:
    """[P, top] positions of the middle by descending signal, ties to the lower position."""
    s = signal.masked_fill(~middle, float("-inf"))
    return torch.sort(s, dim=1, descending=True, stable=True).indices[:, :top]


def _base(stats: CalibStats, sinks: int, window: int) -> torch.Tensor:
    """[P] fp64: the share on sinks + window."""
    P, N = stats.attn.shape
    pos = torch.arange(N, device=stats.attn.device)
    L = stats.lengths.view(-1, 1)
    fixed = (pos < L) & ((pos < sinks) | (pos >= L - window))
    return (stats.attn.double() * fixed).sum(1)


def arr_from_rankings(stats: CalibStats, base: torch.Tensor, first: torch.Tensor, second: torch.Tensor,
                      free: int, ms: list[int], budget: int) -> torch.Tensor:
    """[K, P] ARR (fp64, in [0, 1]) for each m in `ms`, from the draft ranking `first` and target
    ranking `second`."""
    A = stats.attn.double()
    P, F = first.shape
    dev = A.device
    cum1 = torch.cat([torch.zeros(P, 1, device=dev, dtype=A.dtype), A.gather(1, first).cumsum(1)], dim=1)  # [P, F + 1]
    rank1 = torch.full_like(A, F, dtype=torch.long).scatter_(1, first, torch.arange(F, device=dev).expand(P, F))
    r2 = rank1.gather(1, second)  # [P, F]
    a2 = A.gather(1, second)
    mt = torch.tensor(ms, device=dev)
    avail = r2.unsqueeze(0) >= mt.view(-1, 1, 1)  # [K, P, F]: not already taken by the draft
    keep = avail & (avail.cumsum(-1) <= (free - mt).view(-1, 1, 1))
    out = base + cum1[:, mt.clamp_max(F)].T + (a2 * keep).sum(-1)  # [K, P]
    full = stats.lengths <= budget
    return torch.where(full, A.sum(1), out).clamp(0.0, 1.0)


def arr_grid(stats: CalibStats, primary: torch.Tensor | None, secondary: torch.Tensor | None, *,
             budget: int, sinks: int, window: int, ms: list[int]) -> torch.Tensor:
    """[K, P] ARR of the runtime's set for each m in `ms` (primary: draft signal [P, N],
    secondary: target signal; None = all zeros)."""
    P, N = stats.attn.shape
    free = budget - sinks - window
    top = min(free, N)
    middle = middle_mask(stats.lengths, N, sinks, window)
    zeros = torch.zeros_like(stats.attn)
    first = ranking(zeros if primary is None else primary, middle, top)
    second = ranking(zeros if secondary is None else secondary, middle, top)
    return arr_from_rankings(stats, _base(stats, sinks, window), first, second, free, ms, budget)


def select(stats: CalibStats, primary, secondary, *, budget: int, sinks: int, window: int,
           m: int) -> torch.Tensor:
    """The runtime's selection itself: [P, budget] int32 (-1 padded), through `select_indices`
    (the Triton kernel on CUDA, its reference elsewhere)."""
    from dustin_runtime.ops import kernels

    sel = kernels.select_indices if stats.attn.device.type == "cuda" else kernels.select_indices_ref
    zeros = torch.zeros_like(stats.attn)
    prim = (zeros if primary is None else primary).float().contiguous()
    sec = (zeros if secondary is None else secondary).float().contiguous()
    lens = stats.lengths.to(torch.int32)
    return sel(prim, sec, lens, budget=budget, sinks=sinks, window=window, m=m)


def arr_exact(stats: CalibStats, primary, secondary, *, budget: int, sinks: int, window: int,
              m: int) -> torch.Tensor:
    """[P] ARR of the set `select_indices` picks."""
    idx = select(stats, primary, secondary, budget=budget, sinks=sinks, window=window, m=m)
    return recovery(stats.attn, idx)


def layer_arr(stats: CalibStats, idx: torch.Tensor) -> torch.Tensor:
    """[Lt] per-layer ARR of index sets idx [P, S], averaged over passes."""
    return stats.average(recovery(stats.layer_attn.float(), idx).T)  # [Lt]
