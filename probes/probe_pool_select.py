"""pool_select's launch parameters at the 72B and 7B verification shapes (32k, batch 16, pool 1024 ->
512): num_splits x block_n x num_warps, each timed as a CUDA graph of 12 calls over 6 distinct key
buffers (do_bench of the replay / 12). Output: probes/results/pool-select-sweep-<commit>.log.

    python probes/probe_pool_select.py   (against commit b0b3309: `dustin_kernels.pool_select` was removed after
    it, kernels/NOTES.md)"""

import torch
import triton
from dustin_kernels import pool_select


def main() -> None:
    torch.manual_seed(0)
    for B, H, G in ((16, 64, 8), (16, 28, 4)):
        D, M, N, P, S = 128, 5, 32768, 1024, 512
        q = torch.randn(B, H, M, D, device="cuda", dtype=torch.bfloat16)
        ks = [torch.randn(B, G, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(6)]
        pool = torch.sort(torch.rand(B, N, device="cuda").topk(P, dim=1).indices, dim=1).values.int()
        lens = torch.full((B,), N - M, dtype=torch.int32, device="cuda")
        out = torch.empty(B, G, S, dtype=torch.int32, device="cuda")
        res = []
        for sp in (None, 2, 4, 8, 16):
            for bn in (32, 64, 128):
                for nw in (4, 8):
                    kw = dict(budget=S, sinks=4, window=64, out=out, num_splits=sp, block_n=bn, num_warps=nw)
                    pool_select(q, ks[0], pool, lens, **kw)  # compile and allocate the counters
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for i in range(12):
                            pool_select(q, ks[i % 6], pool, lens, **kw)
                    res.append((triton.testing.do_bench(g.replay, warmup=5, rep=40) / 12, sp, bn, nw))
        res.sort()
        print("B,H,G", B, H, G, "best", [(f"{r[0]:.4f} ms",) + r[1:] for r in res[:6]], "default(None,64,4)",
              [r for r in res if r[1:4] == (None, 64, 4)])


if __name__ == "__main__":
    main()
