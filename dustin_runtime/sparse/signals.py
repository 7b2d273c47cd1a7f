"""Online importance signals from the retrieval heads (SRHs), per sequence over the context [0, L).

- Draft lookahead: while the draft produces this step's tokens, its SRH queries at the first gamma
  verification positions (cur, d_1, .., d_(gamma - 1): the positions it is fed) are stashed (one
  copy per draft forward, no host sync); after drafting they score the context once per SRH layer
  (M = gamma queries per call, so the keys are read once per step, not once per draft token). On
  CUDA the scoring runs on a side stream during the step's last draft forward, each layer as soon as
  its last query is stashed (`SignalPolicy._side_stream`).
- Target history: in each verification pass the target's SRH queries (the gamma + 1 verification
  queries) score the pass's context [0, L); the result is the next step's history. The prefill's
  last chunk (its last gamma + 1 prompt queries, `SpecHooks.prefill_tail`) gives the first one. On
  CUDA the pass only stashes its queries and L, and the scoring runs on the side stream while the
  next step drafts (on grids for `HISTORY_SMS`): the draft's small kernels leave most of the GPU's
  bandwidth idle, where the verification's GEMMs hold every SM.

Scores are softmax over [0, L) per query and head, reduced over queries, heads and layers by the
config's aggregation ("sum" or "max"), into caller-owned [B, N_max] fp32 buffers; rows >= L are 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dustin_runtime.ops import SparseOps
from dustin_runtime.sparse.config import Head

# The stashed history's scoring beside the draft forwards runs on grids for this many SMs, leaving the
# rest to the draft's latency-bound kernels (H200, dustin-vs at the 7B / 0.5B shapes, 32k, batch 16:
# 8.94-8.99 ms a step at 8 or 16 against 9.09-9.13 on the whole GPU and 9.09-9.18 beside the pass,
# probes/results/history-in-draft-8f86e1f; kernels/NOTES.md). None: the device's.
HISTORY_SMS: int | None = 16


@dataclass(frozen=True)
class LayerHeads:
    """The retrieval heads of one layer: query heads (grouped by KV head) and the KV head each
    uses; where every KV head has the same number r of them, `groups` [Gs] holds the KV heads once
    so the query heads of a group are scored as one head with r x M queries (keys read once)."""

    query: torch.Tensor  # [Hs] int64 query-head indices, those of one KV head adjacent
    kv: torch.Tensor  # [Hs] int32 KV head of each
    groups: torch.Tensor | None = None  # [Gs] int32 distinct KV heads, when the groups are equal
    span: tuple[int, int] | None = None  # (first, stop) when the query heads are one contiguous range


def layer_heads(heads: tuple[Head, ...], device: torch.device | str) -> dict[int, LayerHeads]:
    """Group head choices by layer (layers ascending), query heads ordered by KV head."""
    by_layer: dict[int, dict[int, list[int]]] = {}
    for layer, kv, qh in heads:
        by_layer.setdefault(layer, {}).setdefault(kv, []).extend(qh)
    out = {}
    for layer, groups in sorted(by_layer.items()):
        pairs = [(h, g) for g in groups for h in groups[g]]
        equal = len({len(v) for v in groups.values()}) == 1
        hs = [h for h, _ in pairs]
        span = (hs[0], hs[-1] + 1) if hs == list(range(hs[0], hs[-1] + 1)) else None
        out[layer] = LayerHeads(
            torch.tensor([h for h, _ in pairs], dtype=torch.long, device=device),
            torch.tensor([g for _, g in pairs], dtype=torch.int32, device=device),
            torch.tensor(list(groups), dtype=torch.int32, device=device) if equal else None, span)
    return out


def score_heads(ops: SparseOps, q: torch.Tensor, lh: LayerHeads, k_cache: torch.Tensor, lens: torch.Tensor,
                out: torch.Tensor, reduce: str, accumulate: bool, counters: str = "srh", sms: int | None = None) -> None:
    """srh_scores for the heads of one layer; q [B, Hs, M, D] in `lh.query` order (`sms`: grids for
    that many SMs)."""
    kw = dict(reduce=reduce, accumulate=accumulate, counters=counters, sms=sms)
    if lh.groups is not None:
        B, Hs, M, D = q.shape
        q = q.reshape(B, lh.groups.numel(), Hs // lh.groups.numel() * M, D)  # [B, Gs, r * M, D]
        ops.srh_scores(q, lh.groups, k_cache, lens, out, **kw)
    else:
        ops.srh_scores(q, lh.kv, k_cache, lens, out, **kw)


def normalise_(scores: torch.Tensor) -> torch.Tensor:
    """Scale each row of [B, N] to sum 1 (all-zero rows stay zero), in place. Rank-preserving: the
    two-stage selection does not depend on it; it puts both signals on one scale for diagnostics."""
    return scores.div_(scores.sum(-1, keepdim=True).clamp_min(1e-30))


class DraftLookahead:
    """The draft's SRH queries of one step ([B, Hs, gamma, D] per layer: those of cur, d_1, ..,
    d_(gamma - 1), one per draft forward; d_gamma is never fed) and their scoring."""

    def __init__(self, heads: tuple[Head, ...], batch: int, gamma: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, reduce: str, ops: SparseOps):
        self.layers = layer_heads(heads, device)
        self.reduce, self.ops = reduce, ops
        self.q = {layer: torch.zeros(batch, lh.query.numel(), gamma, head_dim, dtype=dtype, device=device)
                  for layer, lh in self.layers.items()}

    def stash(self, layer: int, q: torch.Tensor, slot: int) -> None:
        """Keep the SRH queries of one draft forward's last token: q [B, H, T, D] at verification
        slot `slot` (the forward's index in the step: its last token's position - L, the same for
        every sequence). One copy when the layer's query heads are one contiguous range."""
        lh, buf = self.layers[layer], self.q[layer]
        if lh.span is not None:
            buf[:, :, slot].copy_(q[:, lh.span[0]: lh.span[1], -1])
        else:
            buf[:, :, slot].copy_(q[:, lh.query, -1])

    def score_layer(self, layer: int, k_cache: torch.Tensor, lens: torch.Tensor, out: torch.Tensor,
                    side: torch.cuda.Stream) -> bool:
        """`score` one layer at a time on the `side` stream, once the step's queries of that layer are
        stashed: the first layer overwrites out, the last normalises it (returns True then). The
        caller makes the current stream wait for `side` before out is read or lens / the cache rows
        [0, lens) change."""
        side.wait_stream(torch.cuda.current_stream(out.device))
        with torch.cuda.stream(side):
            score_heads(self.ops, self.q[layer], self.layers[layer], k_cache, lens, out, self.reduce,
                        layer != min(self.layers), counters="srh-side")
            if layer == max(self.layers):
                normalise_(out)
                return True
        return False

    def score(self, k_caches: list[torch.Tensor], lens: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out [B, N_max] = the lookahead signal over [0, lens) from the stashed queries."""
        first = True
        for layer, lh in self.layers.items():
            score_heads(self.ops, self.q[layer], lh, k_caches[layer], lens, out, self.reduce, not first)
            first = False
        if first:
            out.zero_()
        return out


class TargetHistory:
    """Scores the context with the target's SRH queries of one pass (verification or prefill tail)."""

    def __init__(self, heads: tuple[Head, ...], device: torch.device | str, reduce: str, ops: SparseOps):
        self.layers = layer_heads(heads, device)
        self.first = min(self.layers) if self.layers else -1
        self.reduce, self.ops = reduce, ops

    def stash(self, layer: int, q: torch.Tensor, qbuf: torch.Tensor, rows: tuple[int, int] | None = None) -> None:
        """Copy the heads' queries of q [b, H, M, D] at SRH layer `layer` into qbuf [B, Hs, M', D]
        (rows [b0, b1) of it where q is a slice of the batch; M < M' queries fill the first slots and
        the rest are zero, a uniform score) for `score_stashed`."""
        lh = self.layers[layer]
        if rows is None and q.shape[2] == qbuf.shape[2]:
            torch.index_select(q, 1, lh.query, out=qbuf)
            return
        qs = q.index_select(1, lh.query)
        dst = qbuf if rows is None else qbuf[rows[0]: rows[1]]
        if qs.shape[2] < dst.shape[2]:
            dst.zero_()
        dst[:, :, : qs.shape[2]].copy_(qs)

    def score_stashed(self, qbufs: dict[int, torch.Tensor], k_caches: list[torch.Tensor], lens: torch.Tensor,
                      out: torch.Tensor, counters: str = "srh-side") -> None:
        """out [B, N_max] = the signal of the stashed queries (`stash`, every SRH layer) over [0, lens)."""
        for layer, lh in self.layers.items():
            score_heads(self.ops, qbufs[layer], lh, k_caches[layer], lens, out, self.reduce, layer != self.first,
                        counters=counters, sms=HISTORY_SMS)

    def score(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, lens: torch.Tensor,
              out: torch.Tensor) -> bool:
        """At an SRH layer: add the heads' softmax mass of q [B, H, M, D] over [0, lens) into out
        [B, N_max] (the pass's first SRH layer overwrites it); False at other layers."""
        lh = self.layers.get(layer)
        if lh is None:
            return False
        score_heads(self.ops, q.index_select(1, lh.query), lh, k_cache, lens, out, self.reduce, layer != self.first)
        return True
