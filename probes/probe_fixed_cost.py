"""What a kernel costs on the H200 before it moves bytes: per-call time of back-to-back launches in
one CUDA graph (128 programs, as the sparse verification kernel at B 16 x G 8), for
(a) a kernel that stores one value per program, (b) one dependent load chain (index -> 256-byte
row -> store), (c) = (b) with programmatic dependent launch, (d) the sparse kernel's reads alone (sum of the
selected K and V rows, 33.5 MB, various splits and pipelines; and the same for contiguous rows),
and the sparse kernel itself at a
budget of 16, 64 and 512 rows (72B shape, 32k, batch 16). The gap between (b)/(c) and the sparse
kernel at a small budget is the part of its fixed cost that a different kernel could remove.

Usage (device): python3 probes/probe_fixed_cost.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from common import graph_us
from dustin_kernels import sparse_verify_attention
from dustin_kernels._util import pdl_supported

from dustin_eval.bench_attention import random_index_sets, verify_buffers
from dustin_runtime.io.provenance import environment

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the Triton version
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _store_one(OUT):
    tl.store(OUT + tl.program_id(0), 1.0)


@triton.jit
def _chain(IDX, K, OUT, D: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        gdc_wait()
        gdc_launch_dependents()
    p = tl.program_id(0)
    row = tl.load(IDX + p * 512)  # the program's first index
    rd = tl.arange(0, D)
    k = tl.load(K + (p.to(tl.int64) * 32768 + row) * D + rd)  # one 256-byte row of its (b, g)
    tl.store(OUT + p * D + rd, k)


@triton.jit
def _gather_sum(IDX, K, V, OUT, rows_per_prog, n_splits, n_ctx,
                D: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """The bytes of sparse verification without the attention: program (split, pair) sums the K and
    V rows its slice of the pair's 512 indices names (or 512 contiguous rows) and stores [D]."""
    split = tl.program_id(0)
    pair = tl.program_id(1)
    rd = tl.arange(0, D)
    base = pair.to(tl.int64) * n_ctx * D
    acc = tl.zeros([BLOCK, D], tl.float32)
    lo = split * rows_per_prog
    for start in tl.range(lo, lo + rows_per_prog, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        if CONTIGUOUS:
            rows = offs
        else:
            rows = tl.load(IDX + pair * 512 + offs)
        ptr = base + rows.to(tl.int64)[:, None] * D + rd[None, :]
        acc += tl.load(K + ptr).to(tl.float32) + tl.load(V + ptr).to(tl.float32)
    tl.store(OUT + (pair * n_splits + split) * D + rd, tl.sum(acc, 0).to(OUT.dtype.element_ty))


def main(path: str) -> None:
    dev = torch.device("cuda")
    B, H, G, D, N, M = 16, 64, 8, 128, 32768, 5
    P = B * G
    out = torch.empty(P * D, dtype=torch.bfloat16, device=dev)
    keys = [torch.randn(P * N * D, dtype=torch.bfloat16, device=dev) for _ in range(4)]  # [B*G, N, D] flat
    idx = [torch.randint(0, N, (P * 512,), dtype=torch.int32, device=dev) for _ in range(4)]
    pdl = pdl_supported(dev)
    recs = {
        "store_one": graph_us(lambda i: _store_one[(P,)](out)),
        "chain": graph_us(lambda i: _chain[(P,)](idx[i % 4], keys[i % 4], out, D=D, GDC=False)),
    }
    if pdl:
        recs["chain_pdl"] = graph_us(lambda i: _chain[(P,)](idx[i % 4], keys[i % 4], out, D=D, GDC=True,
                                                            launch_pdl=True))
    vals = [torch.randn(P * N * D, dtype=torch.bfloat16, device=dev) for _ in range(4)]
    outs_g = torch.empty(P * 8 * D, dtype=torch.bfloat16, device=dev)
    for contiguous in (False, True):
        for splits in (1, 2, 4):
            for block, stages in ((32, 4), (64, 3), (128, 2)):
                rpp = 512 // splits
                if block > rpp:
                    continue
                name = f"gather_sum_{'contig' if contiguous else 'idx'}_sp{splits}_b{block}_st{stages}"
                recs[name] = graph_us(lambda i, sp=splits, b=block, st=stages, r=rpp, c=contiguous: _gather_sum[(sp, P)](
                    idx[i % 4], keys[i % 4], vals[i % 4], outs_g, r, sp, N, D=D, BLOCK=b, STAGES=st, CONTIGUOUS=c))
    ks, vs, qs, outs, lens = verify_buffers(B, H, G, D, N, M, 12, torch.bfloat16, dev)
    for S in (16, 64, 512):
        sets = random_index_sets(B, N, S, 12, dev)
        recs[f"sparse_S{S}"] = graph_us(lambda i, sets=sets: sparse_verify_attention(
            qs[i % 12], ks[i % 12], vs[i % 12], sets[i % 12], lens, out=outs[i % 12]))
    res = {"gpu": torch.cuda.get_device_name(0), "programs": P, "pdl": pdl, "per_call_us": recs,
           "environment": environment("python3 probes/probe_fixed_cost.py " + path)}
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    for k, v in recs.items():
        print(f"{k:14s} {v:7.2f} us")


if __name__ == "__main__":
    main(sys.argv[1])
