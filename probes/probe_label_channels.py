"""Retrieval scoring on a few key channels: what dustin's set keeps when its scorers read r of D.

Every dustin scorer (the target-history heads of the estimate and the refresh layers, which score
every KV head of their layer) reads whole keys: at the 72B shape the estimate costs 0.84% of 80 full
layers and the two refresh layers 2.94% (`dustin bench attention --refresh 2`), bytes-bound. Double
Sparsity's observation: a few channels carry most of q . k's variation across keys. If a scorer
reads a packed copy of r of the D channels (a "label" cache kept beside the KV cache for the scored
heads only: r / D of their key bytes), its cost falls by D / r. This probe measures what the
teacher-forced perplexity through the set (S = 512, refresh 5 and 17, the committed profile) keeps
when every scorer uses r channels per KV head, chosen offline on calibration text, on the CPU
(torch reference path), like `probe_refresh_heads.py`.

Channel choice per (layer, KV head), from the queries of the last `QTAIL` positions and the keys of
calibration windows (another split than the scored windows):
- "var": E[q_i^2] over the group's query heads x Var_n(k_n,i): the spread channel i adds to the
  logits across keys (a constant shift does not change a softmax);
- "abs": E|q_i| x E|k_i| (Double Sparsity's criterion);
- "+pairs": the same summed over RoPE's channel pairs (i, i + D/2), r/2 pairs kept.
Logits are q_r . k_r / sqrt(D) (the model's scale).

Written before the runtime had label keys: its "var" criterion is `dustin_profile.channels` and its
`ChannelHistory` is what `dustin_runtime.sparse.label_keys` does in the product; it keeps its own copies for
the criteria it compares (and so that its committed results re-run as they were made).

    python probes/probe_label_channels.py OUT.json [windows] [context] [eval_tokens] [split] [variants]
    (defaults: 8 4096 256 eval "var:16,var:8,abs:16,var+pairs:16")
"""

from __future__ import annotations

import sys

import torch
from common import report_set_ppl, smollm2_windows

from dustin_eval.corpus import gutenberg_split
from dustin_eval.pg19 import iter_windows
from dustin_runtime.attention import default_backend
from dustin_runtime.generate import prefill
from dustin_runtime.loader import resolve_checkpoint
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.sparse.signals import TargetHistory
from dustin_runtime.tokenizer import load_tokenizer

CALIB_WINDOWS = 4
QTAIL = 256  # calibration queries: the last QTAIL positions of each window (decode-like, far from the sinks)


@torch.inference_mode()
def channel_stats(model, wins, context: int) -> tuple[torch.Tensor, ...]:
    """Per layer, KV head and channel [Lt, G, D] (fp64): E[q^2] and E|q| summed over the group's
    query heads (last QTAIL queries), Var(k) and E|k| over every key of the windows."""
    c = model.cfg
    base = default_backend("cpu")
    qs: dict[int, torch.Tensor] = {}
    attend = base.attend

    def capture(layer, q, cache, ctx):  # q [B, H, T, D] after RoPE; the last chunk's stay
        qs[layer] = q
        return attend(layer, q, cache, ctx)

    base.attend = capture
    L, G, D, rep = c.num_layers, c.num_kv_heads, c.head_dim, c.n_rep
    q2, qa, kv, ka = (torch.zeros(L, G, D, dtype=torch.float64) for _ in range(4))
    for w in wins:
        cache = model.allocate_cache(1, context + 1)
        qs.clear()
        prefill(model, cache, [w.ids[:context]], base, chunk=context - QTAIL, tail=0)
        for layer in range(L):
            q = qs[layer][0].double()  # [H, QTAIL - 1, D]: the last chunk's queries
            k = cache.k[layer][0, :, : context - 1].double()  # [G, N, D]
            q2[layer] += (q ** 2).mean(1).view(G, rep, D).sum(1)
            qa[layer] += q.abs().mean(1).view(G, rep, D).sum(1)
            kv[layer] += k.var(1)
            ka[layer] += k.abs().mean(1)
    base.attend = attend
    return q2, qa, kv, ka


def choose(stats, how: str, r: int) -> torch.Tensor:
    """[Lt, G, r] int64 channels (ascending) per layer and KV head."""
    q2, qa, kv, ka = stats
    score = q2 * kv if how.startswith("var") else qa * ka  # [Lt, G, D]
    D = score.shape[-1]
    if how.endswith("+pairs"):
        pair = score[..., : D // 2] + score[..., D // 2:]
        top = pair.topk(r // 2, dim=-1).indices
        return torch.cat([top, top + D // 2], -1).sort(-1).values
    return score.topk(r, dim=-1).indices.sort(-1).values


class ChannelHistory(TargetHistory):
    """A TargetHistory whose heads see only `channels[layer, g]` of q and k (logits at the model's scale)."""

    def __init__(self, inner: TargetHistory, channels: torch.Tensor, n_rep: int):
        self.__dict__.update(inner.__dict__)
        self.channels, self.n_rep = channels, n_rep

    def score(self, layer, q, k_cache, lens, out, rows=None):
        if layer not in self.layers:
            return False
        ch = self.channels[layer]  # [G, r]
        G, r = ch.shape
        B, H, M, D = q.shape
        idx_q = ch.repeat_interleave(self.n_rep, 0).view(1, H, 1, r).expand(B, H, M, r)
        qr = q.gather(-1, idx_q) * (r / D) ** 0.5  # q_r . k_r / sqrt(r) = q_r . k_r / sqrt(D)
        idx_k = ch.view(1, G, 1, r).expand(B, G, k_cache.shape[2], r)
        kr = k_cache.gather(-1, idx_k)
        return super().score(layer, qr, kr, lens, out, rows)


def with_channels(policy, channels: torch.Tensor):
    """`policy` whose every target scorer (history groups and refresh layers) reads `channels` only."""
    allocate = policy.allocate

    def allocate_channels(batch, max_len, device):
        allocate(batch, max_len, device)
        n_rep = policy.target.cfg.n_rep
        for g in policy.groups:
            if g.target_signal is not None:
                g.target_signal = ChannelHistory(g.target_signal, channels, n_rep)
        policy.refresh = {layer: ChannelHistory(s, channels, n_rep) for layer, s in policy.refresh.items()}

    policy.allocate = allocate_channels
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, split: str = "eval",
         variants: str = "var:16,var:8,abs:16,var+pairs:16") -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens, split, refresh=True)
    skip = windows if split == "calib" else 0  # channels from other calibration windows than the scored ones
    tok = load_tokenizer(resolve_checkpoint("smollm2"))
    calib = list(iter_windows(tok, gutenberg_split("calib"), context + eval_tokens,
                              max_windows=skip + CALIB_WINDOWS, max_windows_per_book=1))[skip:]
    stats = channel_stats(t, calib, context)
    runs = [("full", None), (f"dustin, refresh {list(cfg.refresh_layers)}, every channel",
                             make_policy("dustin", cfg, target=t, draft=d))]
    chosen = {}
    for v in variants.split(","):
        how, r = v.split(":")
        ch = choose(stats, how, int(r))
        chosen[v] = ch.tolist()
        runs.append((f"dustin, refresh, {r} of {t.cfg.head_dim} channels ({how})",
                     with_channels(make_policy("dustin", cfg, target=t, draft=d), ch)))
    torch.manual_seed(0)
    report_set_ppl(out, t, d, wins, context, runs, eval_tokens=eval_tokens, budget=cfg.budget, split=split,
                   refresh_layers=list(cfg.refresh_layers), specs=variants, channels=chosen,
                   calib_books=[w.book for w in calib])


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:6])
