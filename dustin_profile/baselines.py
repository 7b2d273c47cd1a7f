"""Baselines at the same budget S, on the same verification passes:
- `streamingllm`: sinks + the most recent S - sinks tokens;
- `draft-only`: every draft KV head, m = S - sinks - window (the draft signal fills the set);
- `target-only`: every target KV head, m = 0;
- `quest`: pages of 16 tokens, per layer and KV head, ranked by the upper bound of q . k from the
  page's min/max keys (max over the KV head's query heads and the verification queries), the top
  S // 16 pages; its ARR uses those per-layer, per-head sets;
- `oracle`: the top S positions of A itself (the best any one shared set can do)."""

from __future__ import annotations

import torch

from dustin_profile.calib_arr import CalibStats, arr_grid

METHODS = ("dustin", "streamingllm", "draft-only", "target-only", "quest", "oracle")


def quest_masses(
    q: torch.Tensor,  # [G, r, M, D] fp32
    k: torch.Tensor,  # [G, L, D] fp32: context keys
    p: torch.Tensor,  # [G, r, M, L]: each query's share of its attention on the context
    budgets: tuple[int, ...],
    page: int = 16,
) -> torch.Tensor:
    """Quest's ARR of one layer at each budget: [len(budgets)], mean over KV heads, their query
    heads and the queries of the share on the chosen pages."""
    G, L, D = k.shape
    n, full = -(-L // page), L // page
    kp = k[:, : full * page].reshape(G, full, page, D)
    kmax, kmin = kp.amax(2), kp.amin(2)  # [G, full, D]
    pm = p[..., : full * page].reshape(*p.shape[:3], full, page).sum(-1)  # [G, r, M, full]
    if n > full:  # the last, partial page
        kmax = torch.cat([kmax, k[:, full * page:].amax(1, keepdim=True)], dim=1)
        kmin = torch.cat([kmin, k[:, full * page:].amin(1, keepdim=True)], dim=1)
        pm = torch.cat([pm, p[..., full * page:].sum(-1, keepdim=True)], dim=-1)
    pm = pm.mean(dim=(1, 2))  # [G, n]
    ub = torch.einsum("grmd,gnd->grmn", q.clamp_min(0), kmax) + torch.einsum("grmd,gnd->grmn", q.clamp_max(0), kmin)
    score = ub.amax(dim=(1, 2))  # [G, n]
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    cum = pm.gather(1, order).cumsum(1)  # [G, n]
    out = []
    for b in budgets:
        pages = min(n, b // page)
        got = cum[:, pages - 1] if pages > 0 else torch.zeros(G, device=k.device)
        out.append(got.double().mean().clamp(0.0, 1.0))
    return torch.stack(out)


def streamingllm(stats: CalibStats, budget: int, sinks: int) -> torch.Tensor:
    """[P] ARR of sinks + the most recent budget - sinks tokens."""
    P, N = stats.attn.shape
    pos = torch.arange(N, device=stats.attn.device)
    L = stats.lengths.view(-1, 1)
    keep = (pos < L) & ((pos < sinks) | (pos >= L - (budget - sinks)))
    return (stats.attn.double() * keep).sum(1).clamp(0.0, 1.0)


def oracle(stats: CalibStats, budget: int) -> torch.Tensor:
    """[P] ARR of the top-`budget` positions of A."""
    k = min(budget, stats.attn.shape[1])
    return stats.attn.topk(k, dim=1).values.double().sum(1).clamp(0.0, 1.0)


def draft_only(stats: CalibStats, budget: int, sinks: int, window: int) -> torch.Tensor:
    free = budget - sinks - window
    return arr_grid(stats, stats.draft.sum(0), None, budget=budget, sinks=sinks, window=window, ms=[free])[0]


def target_only(stats: CalibStats, budget: int, sinks: int, window: int) -> torch.Tensor:
    return arr_grid(stats, None, stats.target.sum(0), budget=budget, sinks=sinks, window=window, ms=[0])[0]


def quest(stats: CalibStats, budget: int) -> torch.Tensor:
    """[P] Quest's ARR (recorded per layer at the budgets given to the recorder)."""
    if stats.quest is None or budget not in stats.quest_budgets:
        raise KeyError(f"Quest was not recorded at budget {budget}")
    return stats.quest[:, :, stats.quest_budgets.index(budget)].mean(1)


def baseline_arrs(stats: CalibStats, budget: int, sinks: int, window: int) -> dict[str, float]:
    """Mean ARR of every baseline at `budget` (weighted by the pass weights where stats has them)."""
    out = {
        "streamingllm": streamingllm(stats, budget, sinks),
        "draft-only": draft_only(stats, budget, sinks, window),
        "target-only": target_only(stats, budget, sinks, window),
        "oracle": oracle(stats, budget),
    }
    if stats.quest is not None and budget in stats.quest_budgets:
        out["quest"] = quest(stats, budget)
    return {k: float(stats.average(v)) for k, v in out.items()}
