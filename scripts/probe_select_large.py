"""select_indices vs torch.topk at a large batch x context (B 32, 64k, S 512): programs per row and
warps, each checked exact against the reference; per-call times from CUDA-graph replays (H200)."""
import torch, time
from dustin_kernels.select import select_indices
from dustin_kernels import select_indices_ref
B, N, S = 32, 65541, 512
torch.manual_seed(0)
prim = [torch.rand(B, N, device="cuda") for _ in range(8)]
sec = [torch.rand(B, N, device="cuda") for _ in range(8)]
lens = torch.full((B,), N - 5, dtype=torch.int32, device="cuda")
kw = dict(budget=S, sinks=4, window=64, m=200)
ref = select_indices_ref(prim[0], sec[0], lens, **kw)
def t(fn, n=40):
    g = torch.cuda.CUDAGraph()
    fn(0); torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / n)
    return sorted(ts)[5] * 1e3
print("topk", t(lambda i: torch.topk(prim[i % 8], S, dim=1)))
for P in (None, 8, 12, 16):
    for w in (None, 4, 16):
        try:
            o = select_indices(prim[0], sec[0], lens, programs_per_row=P, num_warps=w, **kw)
            ok = torch.equal(o, ref)
            print("select P", P, "warps", w, round(t(lambda i: select_indices(prim[i % 8], sec[i % 8], lens, programs_per_row=P, num_warps=w, **kw)), 1), "exact", ok, flush=True)
        except Exception as e:
            print("select P", P, w, "error", str(e)[:100])
