"""Verification sets: streamingllm indices, Quest page bounds and page selection. The hybrid
(dustin) selection and the oracle (top rows of `arr.TrueAttention`) are one
`SparseOps.select_indices` call each.

Every set is [B, S] (or [B, G, S] for Quest) int32 context rows < L, sorted ascending, unique,
exactly S entries when L > S; [0, L) then -1 when L <= S (the whole context)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dustin_runtime.ops import SparseOps


def streaming_indices(lens: torch.Tensor, sinks: int, out: torch.Tensor) -> torch.Tensor:
    """StreamingLLM at budget S = out.shape[1]: [0, sinks) + the last S - sinks rows (no host sync)."""
    B, S = out.shape
    j = torch.arange(S, device=out.device, dtype=torch.int32).view(1, S)
    L = lens.view(B, 1).to(torch.int32)
    short = torch.where(j < L, j, -1)
    long = torch.where(j < sinks, j, L - S + j)
    return out.copy_(torch.where(L <= S, short, long))


class QuestPages:
    """Per layer and KV head, the elementwise min and max key of each page of `page` rows, kept in
    step with the cache: after prefill every page is computed (`full`), then each verification pass
    recomputes only the pages that can hold rows committed since (the last ceil((gamma + 1) / page)
    + 1 pages before L), always over rows < L, so rolled-back rows never leak in."""

    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, page: int,
                 span: int, dtype: torch.dtype, device: torch.device | str):
        self.page, self.span = page, span
        self.P = -(-max_len // page)
        shape = (batch, kv_heads, self.P, head_dim)
        self.kmin = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.kmax = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def _reduce(self, kk: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """kk [B, G, n, page, D], valid [B, 1, n, page, 1] -> min, max [B, G, n, D] (0 for empty pages)."""
        lo = kk.masked_fill(~valid, float("inf")).amin(3)
        hi = kk.masked_fill(~valid, float("-inf")).amax(3)
        some = valid.any(3)
        return torch.where(some, lo, 0), torch.where(some, hi, 0)

    def refresh(self, layer: int, k: torch.Tensor, lens: torch.Tensor, full: bool = False) -> None:
        """Bring the pages of k [B, G, N, D] up to date for context lengths lens [B]: every page
        with `full`, else those rows committed since the last call can touch."""
        B, G, N, D = k.shape
        p, dev = self.page, k.device
        if full:
            kk = F.pad(k, (0, 0, 0, self.P * p - N)).view(B, G, self.P, p, D)
            rows = torch.arange(self.P * p, device=dev).view(1, self.P, p)
            valid = (rows < lens.view(B, 1, 1)).view(B, 1, self.P, p, 1)
            lo, hi = self._reduce(kk, valid)
            self.kmin[layer].copy_(lo)
            self.kmax[layer].copy_(hi)
            return
        n = -(-self.span // p) + 1
        pid = ((lens.long() - self.span).clamp_min(0) // p).view(B, 1) + torch.arange(n, device=dev)
        pid = pid.clamp_max(self.P - 1)  # [B, n]
        rows = pid.view(B, n, 1) * p + torch.arange(p, device=dev)  # [B, n, p]
        valid = (rows < lens.view(B, 1, 1)).view(B, 1, n, p, 1)
        gather = rows.clamp_max(N - 1).view(B, 1, n * p, 1).expand(B, G, n * p, D)
        lo, hi = self._reduce(k.gather(2, gather).view(B, G, n, p, D), valid)
        where = pid.view(B, 1, n, 1).expand(B, G, n, D)
        self.kmin[layer].scatter_(2, where, lo)
        self.kmax[layer].scatter_(2, where, hi)

    def bounds(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Quest's criticality per page, [B, G, P] fp32: the upper bound of q . k over the page,
        sum_d max(q_d min_d, q_d max_d), maxed over the group's query heads and the M queries."""
        B, H, M, D = q.shape
        G = self.kmin[layer].shape[1]
        qg = q.float().reshape(B, G, (H // G) * M, D)
        hi, lo = self.kmax[layer].float(), self.kmin[layer].float()
        ub = qg.clamp_min(0) @ hi.transpose(-1, -2) + qg.clamp_max(0) @ lo.transpose(-1, -2)  # [B, G, R, P]
        return ub.amax(2)


def quest_indices(
    bounds: torch.Tensor,  # [B, G, P]
    lens: torch.Tensor,  # [B] int32
    page: int,
    max_len: int,
    sinks: int,
    window: int,
    ops: SparseOps,
    out: torch.Tensor,  # [B * G, S] int32
) -> torch.Tensor:
    """Per KV head: sinks + window + the rest of the budget by whole pages in decreasing bound
    (each row scores its page's bound; equal scores go to the lower row, so pages are taken whole
    in rank order and the last one partly). Returns [B, G, S]."""
    B, G, P = bounds.shape
    S = out.shape[1]
    tok = bounds.repeat_interleave(page, dim=-1)[..., :max_len].reshape(B * G, max_len).contiguous()
    rows_lens = lens.repeat_interleave(G)
    ops.select_indices(tok, None, rows_lens, out, sinks=sinks, window=window, m=S - sinks - window)
    return out.view(B, G, S)
