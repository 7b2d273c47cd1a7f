"""Refresh layers scored with some of their KV heads: what the refresh keeps when it reads fewer keys.

A refresh layer chooses the set again from its current queries over every KV head's keys: at the
72B shape (8 KV heads, 32k, batch 16) the two refresh layers cost 3.1% of 80 layers of full attention
(`dustin bench attention --groups 2 --group-kv-heads 8`), against 0.82% for the whole estimate. Each
KV head scored less is an eighth of that there. This probe runs the committed profile (S = 512,
refresh layers 5 and 17) with the refresh layers scoring one KV head or two (every choice at one
layer with the other layer whole, and the same heads at both layers), teacher-forced, on the CPU
(the torch reference path), like `probe_pool.py`.

    python probes/probe_refresh_heads.py OUT.json [windows] [context] [eval_tokens] [split] [variants]
    (defaults: 8 4096 256 calib singles; variants: singles | pairs | a list like "5:0+17:1,5:0.2+17:1.2")
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace

import torch
from common import report_set_ppl, smollm2_windows

from dustin_runtime.sparse.policies import make_policy


def with_heads(policy, heads_by_layer: dict[int, tuple[int, ...]]):
    """`policy` again with its refresh layers scored by the given KV heads (each with all its query
    heads; a refresh layer not named keeps every KV head): the runtime's `refresh_kv_heads`."""
    cfg, G = policy.cfg, policy.target.cfg.num_kv_heads
    kv = tuple(tuple(heads_by_layer.get(layer, range(G))) for layer in cfg.refresh_layers)
    return make_policy("dustin", replace(cfg, refresh_kv_heads=kv), target=policy.target, draft=policy.draft)


def parse(spec: str) -> dict[int, tuple[int, ...]]:
    """'5:0.2+17:1' -> {5: (0, 2), 17: (1,)}."""
    return {int(a): tuple(int(g) for g in b.split(".")) for a, b in (p.split(":") for p in spec.split("+"))}


def main(out: str, windows: int = 8, context: int = 4096, eval_tokens: int = 256, split: str = "calib",
         variants: str = "singles") -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens, split, refresh=True)
    layers, G = list(cfg.refresh_layers), t.cfg.num_kv_heads
    every = {layer: tuple(range(G)) for layer in layers}
    if variants == "singles":  # one KV head at one refresh layer (the others whole), then at both
        specs = [{**every, layer: (g,)} for layer in layers for g in range(G)]
        specs += [{layer: (g,) for layer in layers} for g in range(G)]
    elif variants == "pairs":  # two KV heads at both layers
        specs = [{layer: pair for layer in layers} for pair in itertools.combinations(range(G), 2)]
    else:
        specs = [parse(s) for s in variants.split(",")]
    runs = [("full", None), (f"dustin, refresh {layers}, every KV head", make_policy("dustin", cfg, target=t, draft=d))]
    for spec in specs:
        name = ", ".join(f"L{layer}: KV {'.'.join(map(str, gs))}" for layer, gs in spec.items())
        runs.append((f"dustin, refresh {name}", with_heads(make_policy("dustin", cfg, target=t, draft=d), spec)))
    torch.manual_seed(0)
    report_set_ppl(out, t, d, wins, context, runs, eval_tokens=eval_tokens, budget=cfg.budget, split=split,
                   refresh_layers=layers, heads=variants)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:6])
