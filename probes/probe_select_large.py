"""select_indices vs torch.topk at a large batch x context (B 32, 64k, S 512): programs per row and
warps, each checked exact against the reference; per-call times from CUDA-graph replays (H200).

Usage (device): python3 probes/probe_select_large.py  ->  one line per configuration.
Recorded run: probes/results/probe-select-large-a549e5c.log (the defaults then: 16 warps).
"""

from __future__ import annotations

import torch
from common import graph_us
from dustin_kernels import select_indices_ref
from dustin_kernels.select import select_indices

B, N, S = 32, 65541, 512
KW = dict(budget=S, sinks=4, window=64, m=200)


def main() -> None:
    torch.manual_seed(0)
    prim = [torch.rand(B, N, device="cuda") for _ in range(8)]  # [B, N] each: distinct buffers per call
    sec = [torch.rand(B, N, device="cuda") for _ in range(8)]
    lens = torch.full((B,), N - 5, dtype=torch.int32, device="cuda")
    ref = select_indices_ref(prim[0], sec[0], lens, **KW)
    print("topk", round(graph_us(lambda i: torch.topk(prim[i % 8], S, dim=1), 40), 1))
    for P in (None, 8, 12, 16):
        for w in (None, 4, 16):
            opts = dict(programs_per_row=P, num_warps=w, **KW)
            exact = torch.equal(select_indices(prim[0], sec[0], lens, **opts), ref)
            us = graph_us(lambda i, opts=opts: select_indices(prim[i % 8], sec[i % 8], lens, **opts), 40)
            print("select P", P, "warps", w, round(us, 1), "exact", exact, flush=True)


if __name__ == "__main__":
    main()
