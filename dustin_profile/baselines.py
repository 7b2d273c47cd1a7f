"""Baselines at the same budget S, on the same verification passes:
- `streamingllm`: sinks + the most recent S - sinks tokens;
- `draft-only`: every draft KV head, m = S - sinks - window (the draft signal fills the set);
- `target-only`: every target KV head, m = 0;
- `quest`: the runtime's Quest policy (`dustin_runtime.sparse.selection`), per layer and KV head: sinks +
  window + whole pages of 16 rows in decreasing upper bound of q . k (from the page's min/max
  keys, maxed over the KV head's query heads and the verification queries), the last page cut to
  exactly S rows; its ARR uses those per-layer, per-head sets;
- `oracle`: the top S positions of A itself (the best any one shared set can do);
- `layer-oracle`: each layer keeps the top S positions of its own A (the best any per-layer sets
  can do)."""

from __future__ import annotations

import torch

from dustin_profile.calib_arr import CalibStats, arr_grid
from dustin_runtime.ops import default_ops
from dustin_runtime.sparse.config import QUEST_PAGE
from dustin_runtime.sparse.recovery import recovery
from dustin_runtime.sparse.selection import QuestPages, quest_indices


def quest_bounds(q: torch.Tensor, k: torch.Tensor, page: int = QUEST_PAGE) -> torch.Tensor:
    """Quest's page bounds [G, ceil(L / page)] of one layer as the runtime computes them
    (`QuestPages`), for queries q [G, r, M, D] (r query heads per KV head) over keys k [G, L, D]."""
    G, r, M, D = q.shape
    L = k.shape[1]
    pages = QuestPages(1, 1, G, L, D, page, page, k.dtype, k.device)
    pages.refresh(0, k.unsqueeze(0), torch.tensor([L], dtype=torch.int32, device=k.device), full=True)
    return pages.bounds(0, q.reshape(1, G * r, M, D))[0]


def quest_sets(bounds: torch.Tensor, L: int, budget: int, page: int = QUEST_PAGE, *, sinks: int = 0,
               window: int = 0) -> torch.Tensor:
    """The runtime Quest policy's set of each KV head for page bounds [G, P] of a context of L rows:
    [G, budget] int32 (`selection.quest_indices`: sorted, exactly `budget` rows when L > budget,
    else [0, L) then -1)."""
    G = bounds.shape[0]
    lens = torch.tensor([L], dtype=torch.int32, device=bounds.device)
    out = torch.full((G, budget), -1, dtype=torch.int32, device=bounds.device)
    return quest_indices(bounds.unsqueeze(0), lens, page, L, sinks, window, default_ops(bounds.device), out)[0]


def quest_masses(
    q: torch.Tensor,  # [G, r, M, D] fp32
    k: torch.Tensor,  # [G, L, D] fp32: context keys
    p: torch.Tensor,  # [G, r, M, L]: each query's share of its attention on the context
    budgets: tuple[int, ...],
    page: int = QUEST_PAGE,
    *,
    sinks: int = 0,
    window: int = 0,
) -> torch.Tensor:
    """Quest's ARR of one layer at each budget: [len(budgets)] fp64, the mean over KV heads, their
    query heads and the queries of the share kept by the runtime Quest set (`quest_sets`;
    `dustin_runtime.sparse.recovery`). Give the profile's sinks and window (each budget at least their sum)."""
    G, r, M, _ = q.shape
    L = k.shape[1]
    bounds = quest_bounds(q, k, page)
    attn = p.mean(dim=(1, 2))  # [G, L]: A of each KV head's queries
    out = []
    for budget in budgets:
        idx = quest_sets(bounds, L, budget, page, sinks=sinks, window=window)  # [G, S]
        out.append(recovery(attn, idx).mean())
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


def oracle_by_layer(stats: CalibStats, budget: int) -> torch.Tensor:
    """[P, Lt] each layer's ARR when it keeps the top-S rows of its own A."""
    la = stats.layer_attn.float()  # [P, Lt, N]
    k = min(budget, la.shape[-1])
    return la.topk(k, dim=-1).values.double().sum(-1).clamp(0.0, 1.0)


def layer_oracle(stats: CalibStats, budget: int) -> torch.Tensor:
    """[P] the per-layer oracle: `oracle_by_layer` averaged over layers."""
    return oracle_by_layer(stats, budget).mean(1)


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
    if stats.layer_attn is not None:
        out["layer-oracle"] = layer_oracle(stats, budget)
    if stats.quest is not None and budget in stats.quest_budgets:
        out["quest"] = quest(stats, budget)
    return {k: float(stats.average(v)) for k, v in out.items()}
