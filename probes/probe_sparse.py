"""Round 3 of the sparse verification kernel (kernels/NOTES.md): context rows loaded before the PDL
wait, tiles small enough for two programs per SM, timed like `dustin bench attention` (per call in
a CUDA graph of many calls over distinct buffers), back to back and after the real decode-step
neighbour (`rope_qkv_to_cache`, which writes q and the new tokens). Every variant is checked
against the fp32 reference.

    python -m dustin_eval.probe_sparse OUT.json [--small] [--only=1,5,7] [--no-sweep]
    python -m dustin_eval.probe_sparse OUT.json --srh [--small]   # srh_scores configurations

Recorded runs: probes/results/probe-round3*.json, probe-rope-*.json, probe-srh-*.json. It sets
kernel keywords that were removed once measured (early, prefetch, prefetch_rows, pass2,
probs_pad): it runs against commit 9542e17 (`git checkout 9542e17`), as the module
`dustin_eval.probe_sparse` shown above.
"""

from __future__ import annotations

import json
import sys

import torch

from dustin_eval.bench_attention import (
    SHAPES,
    _n_calls,
    _record,
    copy_bandwidth_tbps,
    environment,
    random_index_sets,
    verify_buffers,
)

VARIANTS = [  # shared memory per program on sm_90 (triton 3.6) in brackets: <= 113 KB lets 2 share an SM
    ("default (pdl, 128 rows, 3 stages) [217 KB]", {}),
    ("64 rows, 2 stages [88 KB]", dict(block_n=64, num_stages=2)),
    ("32 rows, 4 stages [56 KB]", dict(block_n=32, num_stages=4)),
    ("early 64, 32 rows, 3 stages [88 KB]", dict(early=64, block_n=32, num_stages=3)),
    ("early 64, 32 rows, 2 stages [88 KB]", dict(early=64, block_n=32, num_stages=2)),
    ("early 32, 64 rows, 2 stages [104 KB]", dict(early=32, block_n=64, num_stages=2)),
    ("early 32, 32 rows, 3 stages [72 KB]", dict(early=32, block_n=32, num_stages=3)),
    ("early 128, 32 rows, 2 stages [120 KB]", dict(early=128, block_n=32, num_stages=2)),
    ("64 rows, 2 stages + prefetch 256 [88 KB]", dict(block_n=64, num_stages=2, prefetch=2, prefetch_rows=256)),
    ("64 rows, 2 stages + prefetch all [88 KB]", dict(block_n=64, num_stages=2, prefetch=2, prefetch_rows=512)),
    ("early 64, 32 rows, 3 stages + prefetch 256", dict(early=64, block_n=32, num_stages=3, prefetch=2,
                                                        prefetch_rows=256)),
    ("early 64, 32 rows, 3 stages + prefetch all", dict(early=64, block_n=32, num_stages=3, prefetch=2,
                                                        prefetch_rows=512)),
    ("32 rows, 4 stages + prefetch all [56 KB]", dict(block_n=32, num_stages=4, prefetch=2, prefetch_rows=512)),
    ("early 64, 128 rows, 2 stages [184 KB]", dict(early=64, block_n=128, num_stages=2)),
    ("early 128, 128 rows, 2 stages [217 KB]", dict(early=128, block_n=128, num_stages=2)),
    ("128 rows, 2 stages [152 KB]", dict(block_n=128, num_stages=2)),
]


def probe_round3(small: bool = False, only: list[int] | None = None, sweep: bool = True) -> dict:
    """Records for every variant at the 72B shape (32k, batch 16, S 512), the best ones against the
    budget, and after the decode-step neighbour. small=True: tiny CPU shapes, one untimed call each."""
    from dustin_kernels import sparse_verify_attention, sparse_verify_attention_ref
    from dustin_kernels.checks import rel_err
    from dustin_kernels.layer_ops import rope_qkv_to_cache

    if small:
        B, H, G, D, N, S, n_buf, dev, dt = 2, 8, 2, 16, 300, 48, 2, torch.device("cpu"), torch.float32
        copy_tbps, l2 = 1.0, 1 << 20
        variants = [(n, {**kw, "block_n": 16, "early": min(kw.get("early", 0), 32)} if kw else kw)
                    for n, kw in VARIANTS[:4]]

        def rec(kernel, calls, bytes_, **extra):
            calls[0]()
            return {"kernel": kernel, "bytes": int(bytes_), "median_ms": 1.0, **extra}
    else:
        shp = SHAPES["qwen2.5-72b"]
        B, H, G, D, N, S, n_buf, dev, dt = 16, shp.heads, shp.kv_heads, shp.head_dim, 32768, 512, 12, \
            torch.device("cuda"), torch.bfloat16
        copy_tbps = copy_bandwidth_tbps()["tbps"]
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        variants = [v for i, v in enumerate(VARIANTS) if only is None or i == 0 or i in only]

        def rec(kernel, calls, bytes_, **extra):
            return _record(kernel, calls, bytes_, copy_tbps, **extra)

    M = 5
    n_max = N + M
    torch.manual_seed(0)
    ks, vs, qs, outs, lens = verify_buffers(B, H, G, D, N, M, n_buf, dt, dev)
    q_bytes = B * H * M * D * dt.itemsize
    # the decode-step neighbour: rope + cache write of the M new tokens from a fused qkv projection
    qkv = [torch.randn(B, M, (H + 2 * G) * D, dtype=dt, device=dev) for _ in range(2)]
    rope = torch.randn(2, n_max, D, dtype=torch.float32, device=dev)
    pos = (lens[:, None] + torch.arange(M, device=dev)[None, :]).to(torch.int64)

    def idx_sets(S_, n):
        return random_index_sets(B, N, S_, n, dev)

    def measure(S_, name, kw, idx, n_calls, neighbour=False):
        try:
            return _measure(S_, name, kw, idx, n_calls, neighbour)
        except Exception as e:  # a variant the compiler rejects (resources): record why, go on
            return {"kernel": "rope_then_sparse" if neighbour else "sparse", "variant": name, "budget": S_,
                    "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", **kw}

    def _measure(S_, name, kw, idx, n_calls, neighbour=False):
        sel = 2 * B * G * (S_ + M) * D * dt.itemsize
        sbytes = sel + 2 * q_bytes + B * S_ * 4
        if not neighbour:
            ref = sparse_verify_attention_ref(qs[0], ks[0], vs[0], idx[0], lens)
            err = rel_err(sparse_verify_attention(qs[0], ks[0], vs[0], idx[0], lens, **kw), ref)
            calls = [lambda i=i: sparse_verify_attention(qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], idx[i % len(idx)],
                                                         lens, out=outs[i % n_buf], **kw) for i in range(n_calls)]
            return rec("sparse", calls, sbytes, variant=name, budget=S_, rel_err=err, **kw)

        def step(i):
            b = i % n_buf
            q = rope_qkv_to_cache(qkv[i % 2], rope, pos, ks[b], vs[b], H)
            return sparse_verify_attention(q, ks[b], vs[b], idx[i % len(idx)], lens, out=outs[b], **kw)

        q0 = rope_qkv_to_cache(qkv[0], rope, pos, ks[0], vs[0], H)
        err = rel_err(step(0), sparse_verify_attention_ref(q0, ks[0], vs[0], idx[0], lens))
        return rec("rope_then_sparse", [lambda i=i: step(i) for i in range(n_calls)], sbytes, variant=name,
                   budget=S_, rel_err=err, **kw)

    recs: list[dict] = []
    n512 = 2 if small else _n_calls(2 * B * G * (S + M) * D * dt.itemsize, l2)
    idx = idx_sets(S, n512)
    for name, kw in variants:
        recs.append(measure(S, name, kw, idx, n512))
    ranked = sorted((r for r in recs if "error" not in r), key=lambda r: r["median_ms"])
    best = [v for v in variants if v[0] in {r["variant"] for r in ranked[:3]}]
    base = variants[0]
    if base not in best:
        best = [base] + best
    # after the decode-step neighbour (it lets a PDL kernel start early on Hopper), and rope alone
    for name, kw in best:
        recs.append(measure(S, name, kw, idx, n512, neighbour=True))
    recs.append(rec("rope_alone", [lambda i=i: rope_qkv_to_cache(qkv[i % 2], rope, pos, ks[i % n_buf], vs[i % n_buf], H)
                                   for i in range(n512)], 2 * q_bytes, budget=S))
    # the budget sweep: fixed cost (intercept) and cost per selected row (slope)
    for S_ in ([] if small or not sweep else [64, 128, 256, 1024, 2048]):
        n = _n_calls(2 * B * G * (S_ + M) * D * dt.itemsize, l2)
        idx_s = idx_sets(S_, n)
        for name, kw in best:
            recs.append(measure(S_, name, kw, idx_s, n))
    return {"copy_tbps": copy_tbps, "gpu": "cpu (interpreter)" if small else torch.cuda.get_device_name(0),
            "shape": {"B": B, "H": H, "G": G, "D": D, "N": N, "S": S, "M": M}, "records": recs}


def probe_srh(small: bool = False, splits_sweep: bool = False, n_extra: int = 0, rows: int = 40) -> dict:
    """srh_scores configurations at the runtime's query count (every query head of a retrieval KV
    head stacked: 72B: 8 heads x 5 queries = 40 rows), 2 KV heads of one layer, 32k, batch 16;
    each checked against the fp32 reference. n_extra: cache capacity beyond the 32k context (0: a
    power of two, the hard case for strided scratch); rows: stacked queries per KV head (5: one
    query head); kernel_us: per-kernel times (torch profiler)."""
    from dustin_kernels import srh_scores, srh_scores_ref
    from dustin_kernels.checks import rel_err

    def cfg(bn, w, st, probs, qm, splits=None, p2=None, pad=None):
        return dict(block_n=bn, num_warps=w, num_stages=st, store_probs=probs, queries_as_m=qm,
                    num_splits=splits, pass2=p2, probs_pad=pad)

    if small:
        B, G, D, N, R, dev, dt, n_buf = 2, 4, 16, 200, 12, torch.device("cpu"), torch.float32, 2
        copy_tbps, l2 = 1.0, 1 << 20
        grid = [cfg(16, 4, 2, None, None), cfg(32, 4, 2, True, True), cfg(32, 4, 2, True, False),
                cfg(16, 4, 2, False, False), cfg(16, 4, 2, False, True), cfg(32, 4, 2, True, True, pad=1)]
    else:
        B, G, D, N, R, dev, dt, n_buf = 16, 8, 128, 32768, rows, torch.device("cuda"), torch.bfloat16, 4
        copy_tbps = copy_bandwidth_tbps()["tbps"]
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        grid = [cfg(128, 4, 3, False, False), cfg(128, 4, 3, False, True), cfg(64, 4, 4, False, True),
                cfg(128, 4, 4, False, False)]
        grid += [cfg(bn, 4, st, True, True, pad=pad) for bn, st in ((64, 4), (128, 3)) for pad in (None, 1, 8)]
        grid += [cfg(bn, 4, st, True, False, pad=1) for bn, st in ((64, 4), (128, 3))]
        if rows <= 16:  # one query head per KV head
            grid = [cfg(None, 4, 3, None, None), cfg(None, 4, 3, True, None), cfg(None, 4, 3, False, None),
                    cfg(64, 4, 3, True, None, None, (64, 4, 1, 132)), cfg(128, 4, 3, True, None)]
        if splits_sweep and rows > 16:
            grid += [cfg(64, 4, 4, True, True, None, (64, 4, st2, p2), pad=1) for st2 in (1, 3) for p2 in (33, 132)]
            grid += [cfg(128, 4, 3, False, False, None, (128, 4, 3, p2)) for p2 in (17, 66)]
    torch.manual_seed(0)
    n_max = N + n_extra
    ks = [torch.randn(B, G, n_max, D, dtype=dt, device=dev) for _ in range(n_buf)]
    qs = [torch.randn(B, 2, R, D, dtype=dt, device=dev) for _ in range(n_buf)]
    kvh = torch.tensor([0, G // 2], dtype=torch.int32, device=dev)
    lens = torch.full((B,), N, dtype=torch.int32, device=dev)
    outs = [torch.empty(B, n_max, dtype=torch.float32, device=dev) for _ in range(4)]
    ref = srh_scores_ref(qs[0], kvh, ks[0], lens)
    nbytes = B * 2 * N * D * dt.itemsize + B * n_max * 4
    recs = []
    for kw in grid:
        try:
            err = rel_err(srh_scores(qs[0], kvh, ks[0], lens, **kw), ref)
            calls = [lambda i=i, kw=kw: srh_scores(qs[i % n_buf], kvh, ks[i % n_buf], lens, out=outs[i % 4], **kw)
                     for i in range(2 if small else _n_calls(nbytes, l2, lo=12, hi=48))]
            if small:
                calls[0]()
                rec = {"kernel": "srh_scores", "median_ms": 1.0}
            else:
                rec = _record("srh_scores", calls, nbytes, copy_tbps)
                rec["kernel_us"] = _kernel_us(calls[:8])
            rec.update(variant=(f"block {kw['block_n']}, {kw['num_warps']} warps, {kw['num_stages']} stages, "
                                f"probs {kw['store_probs']}, q as M {kw['queries_as_m']}, splits {kw['num_splits']}, "
                                f"pass 2 {kw['pass2']}, pad {kw['probs_pad']}"),
                       rel_err=err, **kw)
        except Exception as e:  # resources: record why
            rec = {"kernel": "srh_scores", "variant": f"{kw}", "error": f"{type(e).__name__}: {str(e)[:160]}"}
        recs.append(rec)
    return {"copy_tbps": copy_tbps, "gpu": "cpu (interpreter)" if small else torch.cuda.get_device_name(0),
            "shape": {"B": B, "G": G, "D": D, "N": N, "n_max": n_max, "rows": R}, "records": recs}


def _kernel_us(calls: list) -> dict[str, float]:
    """Mean CUDA time per call of each kernel the calls launch (torch profiler, after one warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    for c in calls:
        c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for c in calls:
            c()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / len(calls), 2) for e in prof.key_averages()
            if e.device_time_total > 0}


def main(argv: list[str]) -> None:
    small = "--small" in argv
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), None)
    path = [a for a in argv if not a.startswith("--")][0]
    if "--srh" in argv:
        extra = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--n-extra=")), 0)
        rows = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--rows=")), 40)
        res = probe_srh(small, "--splits" in argv, extra, rows)
    else:
        res = probe_round3(small, [int(x) for x in only.split(",")] if only else None, "--no-sweep" not in argv)
    res["environment"] = environment("python -m dustin_eval.probe_sparse " + " ".join(argv)) if not small else {}
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    for r in res["records"]:
        print(f"{r['kernel']:18s} {r.get('variant', ''):46s} S={r.get('budget', '')!s:5s} "
              f"{r.get('median_ms', float('nan')) * 1e3:8.2f} us  do_bench {r.get('do_bench_ms', float('nan')) * 1e3:7.1f}"
              f"  err {r.get('rel_err', float('nan')):.4f} {r.get('error', '')} {r.get('kernel_us', '')}")


if __name__ == "__main__":
    main(sys.argv[1:])
