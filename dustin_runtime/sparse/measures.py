"""Side measurements of sparse verification (analysis only; nothing runs when they are off).

One side pass per step: before the sparse pass, the target runs full verification of the step's
tokens through `TrueAttention`, which keeps the exact attention of the gamma + 1 verification
queries. It serves
- ARR (`--measure-arr`, defined in `recovery`): the share of the true (full-verification)
  attention on the context that the verification set keeps, mean over target layers, query heads
  and verification queries; for one shared set, by linearity, sum_{i in I} A[i]; for per-layer,
  per-KV-head sets (Quest) layer by layer;
- the oracle's ranking (A itself);
- paired acceptance: what full verification accepts on the same context and drafts;
- paired drafting (sparse drafting only): a second side pass, of full verification over the drafts a
  full-KV draft makes of the same context in the same step (`SpecHooks.shadow_backend`).
The side pass writes the new tokens' K/V rows; the sparse pass rewrites them."""

from __future__ import annotations

import math

import torch

from dustin_runtime.attention import AttentionBackend
from dustin_runtime.sparse.recovery import context_attention, recovery

PER_SEQUENCE = "_per_sequence"  # suffix of the summary statistics that hold one value per sequence ([B] lists)


def attention_probs(
    q: torch.Tensor,  # [B, H, M, D]
    k: torch.Tensor,  # [B, G, N, D]; the M new tokens at rows start[b] + j
    start: torch.Tensor,  # [B] int32 context rows before the new tokens
) -> torch.Tensor:
    """Exact causal attention probabilities [B, G, HG * M, N] fp32 (head-major within a group):
    query j of sequence b sees rows n <= start[b] + j."""
    B, H, M, D = q.shape
    G, N = k.shape[1], k.shape[2]
    qg = q.float().reshape(B, G, (H // G) * M, D)
    s = torch.matmul(qg, k.float().transpose(-1, -2)) / math.sqrt(D)  # [B, G, HG * M, N]
    j = torch.arange(M, device=q.device).repeat(H // G)  # query slot of each row
    limit = start.view(B, 1, 1, 1).long() + j.view(1, 1, -1, 1)
    visible = torch.arange(N, device=q.device).view(1, 1, 1, N) <= limit
    return torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)


class TrueAttention(AttentionBackend):
    """Full verification with explicit probabilities (`probs @ v`). Per pass it keeps, in
    caller-owned buffers, A of `recovery.context_attention` averaged over layers, heads and queries,
    `ctx` [B, N_max]; with `per_layer`, also each layer's, averaged over every KV head's query heads
    and the queries, `layer_ctx[l]` [B, G, N_max]."""

    def __init__(self, batch: int, max_len: int, num_layers: int, kv_heads: int, device, per_layer: bool = False):
        self.num_layers = num_layers
        self.ctx = torch.zeros(batch, max_len, dtype=torch.float32, device=device)
        self.layer_ctx = None
        if per_layer:
            self.layer_ctx = torch.zeros(num_layers, batch, kv_heads, max_len, dtype=torch.float32, device=device)

    def begin(self, ctx):
        self.ctx.zero_()

    def attend(self, layer, q, cache, ctx):
        B, H, M, D = q.shape
        k, v = cache.k[layer], cache.v[layer]
        probs = attention_probs(q, k, ctx.start)  # [B, G, HG * M, N]
        on_ctx = context_attention(probs, ctx.start)  # [B, G, N]
        self.ctx += on_ctx.mean(1) / self.num_layers
        if self.layer_ctx is not None:
            self.layer_ctx[layer].copy_(on_ctx)
        return (probs @ v.float()).view(B, H, M, D).to(q.dtype)


class ArrMeter:
    """ARR per sequence, accumulated over verification passes (only live sequences count). Under
    tensor parallelism (`tp`) each rank measures over its own heads' attention with the sets its
    KV heads attend, and a pass's ARR is the mean over ranks (equal head counts)."""

    def __init__(self, batch: int, num_layers: int, device: torch.device | str, tp=None):
        self.num_layers, self.tp = num_layers, tp
        self.step = torch.zeros(batch, dtype=torch.float64, device=device)
        self.total = torch.zeros(batch, dtype=torch.float64, device=device)
        self.count = torch.zeros(batch, dtype=torch.float64, device=device)

    def reset(self) -> None:
        for t in (self.step, self.total, self.count):
            t.zero_()

    def shared(self, true: TrueAttention, indices: torch.Tensor) -> None:
        """This pass's ARR of one set per sequence, indices [B, S]."""
        self.step.copy_(recovery(true.ctx, indices))

    def begin_layers(self) -> None:
        self.step.zero_()

    def layer(self, true: TrueAttention, layer: int, indices: torch.Tensor) -> None:
        """One layer's share of ARR for per-KV-head sets indices [B, G, S]."""
        self.step += recovery(true.layer_ctx[layer], indices).mean(1) / self.num_layers  # [B]

    def commit(self, live: torch.Tensor) -> None:
        """End of a step: count this pass for the live sequences [B] bool."""
        if self.tp is not None:
            self.tp.all_reduce_(self.step).div_(self.tp.world)
        self.total += self.step * live
        self.count += live.double()

    def summary(self) -> dict:
        """{"arr": mean over steps and sequences, "arr_per_sequence": [...], "arr_steps_per_sequence":
        [...]} (one host sync; arr is the steps-weighted mean of the sequences')."""
        total, count = self.total.cpu(), self.count.cpu()
        per = (total / count.clamp_min(1)).tolist()
        arr = float((total.sum() / count.sum().clamp_min(1)).clamp(0.0, 1.0))
        return {"arr": arr, "arr" + PER_SEQUENCE: [min(max(a, 0.0), 1.0) for a in per],
                "arr_steps" + PER_SEQUENCE: count.long().tolist()}


class PairedAcceptance:
    """What full verification would accept on the same contexts and drafts, step by step (greedy
    matching against the target's argmax over the full cache), next to what the policy accepted:
    free-running acceptance follows each policy's own trajectory, this pairs them. With a shadow
    drafting (`measure_shadow`), also what full verification accepts of the shadow's drafts of the
    same context: the policy's draft mode against the other on the same steps."""

    def __init__(self, batch: int, device: torch.device | str):
        self.full = torch.zeros(batch, dtype=torch.long, device=device)  # this step's n under full verification
        self.shadow = torch.zeros(batch, dtype=torch.long, device=device)  # ... of the shadow's drafts
        self.sum_full = torch.zeros(batch, dtype=torch.float64, device=device)
        self.sum_policy = torch.zeros(batch, dtype=torch.float64, device=device)
        self.sum_shadow = torch.zeros(batch, dtype=torch.float64, device=device)
        self.same = torch.zeros(batch, dtype=torch.float64, device=device)
        self.count = torch.zeros(batch, dtype=torch.float64, device=device)
        self.shadowed = False

    def reset(self) -> None:
        for t in (self.full, self.shadow, self.sum_full, self.sum_policy, self.sum_shadow, self.same, self.count):
            t.zero_()
        self.shadowed = False

    @staticmethod
    def _accepted(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        t = logits.argmax(-1)  # [B, gamma + 1]
        return (t[:, :-1] == tokens[:, 1:]).long().cumprod(1).sum(1)

    def measure(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """logits [B, gamma + 1, V] of a full pass over tokens [B, gamma + 1] (cur, d_1..d_gamma)."""
        self.full.copy_(self._accepted(logits, tokens))

    def measure_shadow(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """The same for the shadow drafting's tokens [B, gamma + 1] (cur, e_1..e_gamma) of this step."""
        self.shadow.copy_(self._accepted(logits, tokens))
        self.shadowed = True

    def commit(self, accepted: torch.Tensor, live: torch.Tensor) -> None:
        """accepted [B]: drafts the policy accepted this step; live [B] bool."""
        w = live.double()
        self.sum_full += (self.full + 1) * w
        self.sum_policy += (accepted + 1) * w
        self.sum_shadow += (self.shadow + 1) * w
        self.same += (accepted == self.full).double() * w
        self.count += w

    def summary(self) -> dict:
        """full_tau (tokens per step full verification would give on the same drafts),
        paired_retention (policy tau / full_tau on those steps), agree (share of steps with the same
        accepted count); with a shadow drafting, shadow_tau (tokens per step full verification gives
        the shadow's drafts) and draft_retention = full_tau / shadow_tau (the policy's drafts against
        the shadow's, both under full verification, on the same steps)."""
        f, p, s, c = (x.sum().item() for x in (self.sum_full, self.sum_policy, self.same, self.count))
        out = {"full_tau": f / max(c, 1), "paired_retention": p / f if f else 0.0, "agree": s / max(c, 1),
               "paired_policy" + PER_SEQUENCE: self.sum_policy.cpu().tolist(),
               "paired_full" + PER_SEQUENCE: self.sum_full.cpu().tolist()}
        if self.shadowed:
            sh = self.sum_shadow.sum().item()
            out.update(shadow_tau=sh / max(c, 1), draft_retention=f / sh if sh else 0.0,
                       **{"paired_shadow" + PER_SEQUENCE: self.sum_shadow.cpu().tolist()})
        return out
