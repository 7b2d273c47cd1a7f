"""Exact mode's confirmation pass: full-cache verification attention at K (gamma + 1) query rows
(gamma 4: M = 5, 10, 20) at the 7B target's shape (28 q / 4 KV heads, D 128), batch 16, 32k, H200.
Times the launcher's defaults and a grid of its tuning keywords at M = 20, and the pass split into
row chunks (the second chunk attends the first through the cache), to find why the 20-row pass
costs more than 4 / 1.4 times the 5-row one. Usage (GPU): python probes/probe_confirm_attention.py"""

from __future__ import annotations

import itertools
import json
import sys

import torch
from dustin_kernels import full_verify_attention

from probes.common import graph_us

B, H, G, D, N = 16, 28, 4, 128, 32768


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    k = torch.randn(B, G, N + 64, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((B,), N, dtype=torch.int32, device=dev)
    rows = {}

    def q_of(m):
        return torch.randn(B, H, m, D, device=dev, dtype=torch.bfloat16)

    for m in (5, 10, 20):
        q = q_of(m)
        rows[f"default M={m}"] = graph_us(lambda i, q=q: full_verify_attention(q, k, v, lens))
    q10 = q_of(10)
    lens2 = lens + 10
    rows["chunks 10+10"] = graph_us(lambda i: (full_verify_attention(q10, k, v, lens),
                                               full_verify_attention(q10, k, v, lens2)))
    q4 = q_of(4)
    rows["chunks 5x4"] = graph_us(lambda i: [full_verify_attention(q4, k, v, lens + 4 * j) for j in range(5)])
    q20 = q_of(20)
    for nw, bn, ns in itertools.product((4, 8), (16, 32, 64), (2, 3)):
        try:
            rows[f"M=20 warps {nw} block_n {bn} stages {ns}"] = graph_us(
                lambda i, nw=nw, bn=bn, ns=ns: full_verify_attention(q20, k, v, lens, num_warps=nw, block_n=bn,
                                                                     num_stages=ns))
        except Exception as e:  # noqa: BLE001 (an out-of-resources configuration)
            rows[f"M=20 warps {nw} block_n {bn} stages {ns}"] = f"{type(e).__name__}"
    for k_splits in (33, 66, 132, 264):
        rows[f"M=20 splits {k_splits}"] = graph_us(lambda i, s=k_splits: full_verify_attention(q20, k, v, lens,
                                                                                             num_splits=s))
    byte_us = 2 * B * G * N * D * 2 / 4.8e12 * 1e6  # K and V once at ~4.8 TB/s
    for name, us in rows.items():
        print(f"{name:42s} {us if isinstance(us, str) else f'{us:8.1f} us'}")
    print(f"K/V bytes once at 4.8 TB/s: {byte_us:.1f} us (one layer)")
    json.dump({"shape": {"B": B, "H": H, "G": G, "D": D, "context": N}, "us": rows, "byte_floor_us": byte_us},
              sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
