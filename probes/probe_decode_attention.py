"""Probe: `full_verify_attention` at the decode shapes of the loop (draft Qwen2.5-0.5B: 14 q / 2 kv
heads, d 64, one query; target Qwen2.5-7B: 28 / 4, d 128, one query and gamma + 1 = 5), over a grid
of rows per block and split counts, against copy bandwidth. Each configuration is replayed in a
CUDA graph of 20 launches over rotating caches (the caches exceed L2). Prints a table; writes JSON
to $OUT or the current folder."""

from __future__ import annotations

import json
import os
import sys

import torch
from common import graph_us
from dustin_kernels import full_verify_attention


def copy_tbps():
    x = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / graph_us(lambda i: y.copy_(x), 5) / 1e6


def main():
    bw = copy_tbps()
    shapes = [("draft-0.5b", 16, 14, 2, 64, 1, 32768), ("draft-0.5b", 8, 14, 2, 64, 1, 8192),
              ("draft-0.5b", 16, 14, 2, 64, 1, 65536), ("target-7b", 16, 28, 4, 128, 1, 32768),
              ("target-7b", 16, 28, 4, 128, 5, 32768)]
    rows = []
    for name, B, H, G, D, M, N in shapes:
        nbuf = 3
        ks = [torch.randn(B, G, N + 8, D, device="cuda", dtype=torch.bfloat16) for _ in range(nbuf)]
        vs = [torch.randn_like(k) for k in ks]
        q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
        nbytes = 2 * B * G * N * D * 2
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        best = None
        for bn in (None, 32, 64, 128, 256):
            for sp in (None, sms // (B * G), 2 * sms // (B * G), 4 * sms // (B * G), 8 * sms // (B * G)):
                if sp is not None and sp < 1:
                    continue
                def fn(i, ks=ks, vs=vs, q=q, lens=lens, sp=sp, bn=bn):  # call i reads cache i % nbuf
                    full_verify_attention(q, ks[i % len(ks)], vs[i % len(ks)], lens, num_splits=sp, block_n=bn)

                try:
                    us = graph_us(fn, 20)
                except Exception as e:  # noqa: BLE001 - a probe reports what fails
                    rows.append({"shape": name, "B": B, "N": N, "M": M, "block_n": bn, "splits": sp, "error": str(e)[:80]})
                    continue
                r = {"shape": name, "B": B, "N": N, "M": M, "block_n": bn, "splits": sp, "us": us,
                     "of_copy": nbytes / (us * 1e-6) / 1e12 / bw}
                rows.append(r)
                if best is None or us < best["us"]:
                    best = r
        default = next(r for r in rows if r["shape"] == name and r["N"] == N and r["M"] == M and r["block_n"] is None
                       and r["splits"] is None and "us" in r)
        print(f"{name} B{B} N{N} M{M}: default {default['us']:.1f} us ({default['of_copy']:.0%}), "
              f"best bn={best['block_n']} splits={best['splits']} {best['us']:.1f} us ({best['of_copy']:.0%})")
        del ks, vs
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "probe-decode-attention.json"), "w") as f:
        json.dump({"copy_tbps": bw, "rows": rows, "argv": sys.argv}, f, indent=1)


if __name__ == "__main__":
    main()
