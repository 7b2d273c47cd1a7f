"""Where the sparse verification kernel's time goes (H200): a pure Triton gather copy of the
selected rows, the kernel against the budget (intercept = fixed cost), contiguous vs random rows,
and grids of launch configurations (split count, rows per block, warps, stages) of the sparse and
full kernels. Timed like `dustin bench attention` (per call in a CUDA graph of many calls over
distinct buffers). Recorded run: probes/results/probe-sparse-qwen2.5-72b-32768-16-512.json.

    python probes/probe_kernel_costs.py OUT.json      (on a CUDA machine)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from dustin_eval.bench_attention import (
    attention_shape,
    calls_per_graph,
    copy_bandwidth_tbps,
    random_index_sets,
    record,
)


@triton.jit
def gather_copy(K, V, IDX, KO, VO, S, skb, skg, skn, sob, sog, son, G: tl.constexpr, D: tl.constexpr,
                BLOCK: tl.constexpr):
    s0 = tl.program_id(0) * BLOCK
    g = tl.program_id(1)
    b = tl.program_id(2)
    r = s0 + tl.arange(0, BLOCK)
    rd = tl.arange(0, D)
    rows = tl.load(IDX + b * S + r, mask=r < S, other=0)
    base = b.to(tl.int64) * skb + g.to(tl.int64) * skg
    obase = b.to(tl.int64) * sob + g.to(tl.int64) * sog
    m = (r < S)[:, None]
    k = tl.load(K + base + rows[:, None] * skn + rd[None, :], mask=m)
    v = tl.load(V + base + rows[:, None] * skn + rd[None, :], mask=m)
    tl.store(KO + obase + r[:, None] * son + rd[None, :], k, mask=m)
    tl.store(VO + obase + r[:, None] * son + rd[None, :], v, mask=m)



def probe_sparse(shape: str = "qwen2.5-72b", context: int = 32768, batch: int = 16, budget: int = 512) -> dict:
    """Where the sparse kernel's time goes: a pure gather copy of the same rows, the kernel against
    the budget (intercept = fixed cost), contiguous vs random rows, and a grid of configurations."""
    from dustin_kernels import full_verify_attention, sparse_verify_attention

    shp = attention_shape(shape)
    B, H, G, D, M, N = batch, shp.heads, shp.kv_heads, shp.head_dim, 5, context
    n_max, dt, dev = N + M, torch.bfloat16, "cuda"
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_tbps = copy_bandwidth_tbps()["tbps"]
    n_buf = max(1, min(12, int(48e9 // (2 * B * G * n_max * D * 2))))
    ks = [torch.empty(B, G, n_max, D, dtype=dt, device=dev).normal_() for _ in range(n_buf)]
    vs = [torch.empty(B, G, n_max, D, dtype=dt, device=dev).normal_() for _ in range(n_buf)]
    qs = [torch.randn(B, H, M, D, dtype=dt, device=dev) for _ in range(n_buf)]
    lens = torch.full((B,), N, dtype=torch.int32, device=dev)
    out = torch.empty(B, H, M, D, dtype=dt, device=dev)
    recs = []

    def sets(S, contiguous=False, n=64):
        if contiguous:
            return [torch.arange(S, dtype=torch.int32, device=dev).repeat(B, 1) + 0 for _ in range(n)]
        return random_index_sets(B, N, S, n, dev)

    def sparse_rec(name, S, idx, **kw):
        sel = 2 * B * G * (S + M) * D * 2
        n = calls_per_graph(sel, l2)
        calls = [lambda i=i: sparse_verify_attention(qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], idx[i % len(idx)],
                                                     lens, out=out, **kw) for i in range(n)]
        return record(name, calls, sel + 2 * B * H * M * D * 2 + B * S * 4, copy_tbps, budget=S, **kw)

    idx512 = sets(budget)
    ko = torch.empty(B, G, budget, D, dtype=dt, device=dev)
    vo = torch.empty_like(ko)
    for contiguous in (False, True):
        idx = sets(budget, contiguous) if contiguous else idx512
        for block in (32, 64):
            calls = [lambda i=i, idx=idx, block=block: gather_copy[(triton.cdiv(budget, block), G, B)](
                ks[i % n_buf], vs[i % n_buf], idx[i % len(idx)], ko, vo, budget, *ks[0].stride()[:3], *ko.stride()[:3],
                G=G, D=D, BLOCK=block) for i in range(calls_per_graph(2 * B * G * budget * D * 2, l2))]
            recs.append(record("gather_copy", calls, 4 * B * G * budget * D * 2, copy_tbps, block=block,
                               contiguous=contiguous, note="bytes = rows read + written"))
    for S in (64, 128, 256, 1024, 2048):
        recs.append(sparse_rec("sparse_vs_budget", S, sets(S, n=16)))
    recs.append(sparse_rec("sparse_contiguous_rows", budget, sets(budget, True, 4)))
    for splits, bn, nw, ns in ((1, 64, 4, 4), (1, 64, 4, 5), (1, 64, 4, 6), (1, 32, 4, 6), (1, 32, 4, 8),
                               (1, 128, 4, 3), (1, 128, 8, 3), (1, 64, 8, 5), (2, 64, 4, 4), (2, 64, 4, 5),
                               (2, 32, 4, 6), (2, 128, 4, 2)):
        recs.append(sparse_rec("sparse_variant", budget, idx512, num_splits=splits, block_n=bn, num_warps=nw,
                               num_stages=ns))
    fb = 2 * B * G * n_max * D * 2 + 2 * B * H * M * D * 2
    nf = calls_per_graph(fb, l2)
    for splits, bn, nw, ns in ((6, 32, 4, 4), (8, 32, 4, 4), (10, 32, 4, 4), (12, 32, 4, 4), (8, 32, 4, 5),
                               (8, 32, 4, 3), (8, 64, 4, 4), (8, 16, 4, 6)):
        calls = [lambda i=i, kw=dict(num_splits=splits, block_n=bn, num_warps=nw, num_stages=ns):
                 full_verify_attention(qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], lens, out=out, **kw)
                 for i in range(nf)]
        recs.append(record("full_variant", calls, fb, copy_tbps, num_splits=splits, block_n=bn, num_warps=nw,
                           num_stages=ns))
    return {"copy_tbps": copy_tbps, "gpu": torch.cuda.get_device_name(0), "records": recs}


def main(path: str) -> None:
    res = probe_sparse()
    Path(path).write_text(json.dumps(res, indent=1) + "\n")
    for r in res["records"]:
        cfg = {k: r[k] for k in ("budget", "block", "contiguous", "num_splits", "block_n", "num_warps", "num_stages")
               if k in r}
        print(f"{r['kernel']:24s} {r.get('median_ms', float('nan')) * 1e3:9.1f} us  do_bench "
              f"{r.get('do_bench_ms', float('nan')) * 1e3:8.1f} us  {r.get('bandwidth_fraction', 0):5.0%}  {cfg} "
              f"{r.get('error', '')}")


if __name__ == "__main__":
    main(sys.argv[1])
