"""Per-layer sets from a pool: the pass's set (pre-pass signals, re-chosen at the refresh layers) is a
pool of P > S rows; every layer attends its own S of them, sinks + window + the pool rows with the
most attention mass of that layer's current queries (every head, softmax over the pool's keys).
The layers that borrow a refresh layer's set (where the refresh leaves its loss,
probe_refresh_attribution.py) choose again, at the price of reading P keys per layer instead of S.
Teacher-forced on the CPU on calibration windows.

    python probes/probe_pool.py OUT.json [windows] [context] [eval_tokens] [split] [pools] [extra]
    (defaults: 8 4096 256 calib 768,1024 no-refresh; extra: comma-separated variants at the last pool,
    no-refresh and / or per-head: a set per KV head)"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.policies import make_policy


def pooled(policy, S: int, per_head: bool = False):
    """`policy` (its budget = the pool P) attending, at each layer, S rows of its pool: one set for
    the layer (mass summed over every head) or, `per_head`, one per KV head (its query heads' mass)."""
    c = policy.cfg
    assert c.sinks + c.window <= S

    def top_rows(rows, score, fixed):
        score = score.double()
        score[fixed] = float("inf")  # sinks and window always (at most sinks + window <= S of them)
        return torch.sort(rows[torch.topk(score, S, sorted=False).indices]).values.int()

    def layer_indices(layer, q, cache, ctx):
        pool = policy.indices  # [B, P], this layer's pool (after any refresh at it)
        B, H, M, D = q.shape
        G = cache.k[layer].shape[1]
        out = torch.full((B, G, S) if per_head else (B, S), -1, dtype=torch.int32)
        for b in range(B):
            rows = pool[b][pool[b] >= 0].long()
            L = int(ctx.start[b])
            fixed = (rows < c.sinks) | (rows >= L - c.window)
            if rows.numel() <= S:
                out[b, ..., : rows.numel()] = rows.int()
                continue
            k = cache.k[layer][b][:, rows].float()  # [G, R, D]
            qg = q[b].float().reshape(G, H // G * M, D)
            p = torch.softmax(qg @ k.transpose(1, 2) / D**0.5, dim=-1)  # [G, r M, R]
            if per_head:
                for g in range(G):
                    out[b, g] = top_rows(rows, p[g].sum(0), fixed)
            else:
                out[b] = top_rows(rows, p.sum(dim=(0, 1)), fixed)
        return out

    policy.layer_indices = layer_indices
    policy.layer_sets = True
    return policy


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, split: str = "calib",
         pools: str = "768,1024", extra: str = "no-refresh") -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens, split, refresh=True)
    refresh = list(cfg.refresh_layers)
    S = cfg.budget
    variants = [("full", None), (f"dustin, refresh {refresh}", make_policy("dustin", cfg, target=t, draft=d))]
    for P in (int(x) for x in pools.split(",")):
        wide = replace(cfg, budget=P, m=round(cfg.m * (P - cfg.sinks - cfg.window) / cfg.free))
        variants.append((f"dustin, refresh {refresh}, pool {P} -> {S} per layer",
                         pooled(make_policy("dustin", wide, target=t, draft=d), S)))
    P = int(pools.split(",")[-1])
    if "per-head" in extra.split(","):
        wide = replace(cfg, budget=P, m=round(cfg.m * (P - cfg.sinks - cfg.window) / cfg.free))
        variants.append((f"dustin, refresh {refresh}, pool {P} -> {S} per layer and KV head",
                         pooled(make_policy("dustin", wide, target=t, draft=d), S, per_head=True)))
    if "no-refresh" in extra.split(","):
        wide = replace(cfg, budget=P, refresh_layers=(), m=round(cfg.m * (P - cfg.sinks - cfg.window) / cfg.free))
        variants.append((f"dustin, no refresh, pool {P} -> {S} per layer",
                         pooled(make_policy("dustin", wide, target=t, draft=d), S)))
    torch.manual_seed(0)
    report_set_ppl(out, t, d, wins, context, variants, eval_tokens=eval_tokens, budget=S, split=split,
                   refresh_layers=refresh, pools=pools, extra=extra)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:7])
