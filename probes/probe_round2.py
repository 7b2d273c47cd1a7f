"""Kernel variants of the second tuning pass (kernels/NOTES.md, "Round 2"), timed like
`dustin bench attention`, each checked against its reference: sparse (L2 prefetch of the selected
rows, programmatic dependent launch on/off, head split, blocks), select (ticket vs barrier launcher,
warps, programs per row, ties), srh_scores (stored probabilities, either MMA orientation, vs two
passes over the keys), full (pipelined combine; splits at batch 1).
Recorded run: probes/results/probe-round2-qwen2.5-72b-32768-16-512.json.

It sets kernel keywords that were removed once measured (prefetch, pdl, head_split,
combine_stages, probs_pad): it runs against commit 9542e17 (`git checkout 9542e17`), where it was
`python -m dustin_eval.bench_attention OUT.json round2` (`round2-small`: tiny CPU shapes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dustin_eval.bench_attention import (
    _n_calls,
    _record,
    copy_bandwidth_tbps,
    random_index_sets,
    verify_buffers,
)


def probe_round2(small: bool = False) -> dict:
    """Kernel variants of round 2 (kernels/NOTES.md), timed like the benchmark, each checked against
    its reference: sparse (L2 prefetch of the selected rows, programmatic dependent launch, head
    split, blocks), select (ticket vs barrier launcher, warps, programs per row, ties), srh_scores
    (stored probabilities, either MMA orientation, vs two passes over the keys), full (pipelined
    combine; splits at batch 1).

    small=True: tiny shapes, each call run once without timing (a CPU/interpreter smoke test).
    """
    from dustin_kernels import (
        full_verify_attention_ref,
        select_indices,
        select_indices_ref,
        sparse_verify_attention,
        sparse_verify_attention_ref,
        srh_scores,
        srh_scores_ref,
    )
    from dustin_kernels.checks import rel_err
    from dustin_kernels.select import _select_barrier, _select_ticket, _ticket_plan
    from dustin_kernels.verify_attention import _launch

    if small:
        B, H, G, D, N, S, n_buf, dev, dt = 2, 8, 2, 16, 300, 48, 2, torch.device("cpu"), torch.float32
        sinks, window, m = 4, 8, 16
        copy_tbps, l2 = 1.0, 1 << 20

        def rec(kernel, calls, bytes_, **extra):
            calls[0]()
            return {"kernel": kernel, "bytes": int(bytes_), "median_ms": 1.0, **extra}
    else:
        B, H, G, D, N, S, n_buf, dev, dt = 16, 64, 8, 128, 32768, 512, 12, torch.device("cuda"), torch.bfloat16
        sinks, window, m = 16, 64, 216
        copy_tbps = copy_bandwidth_tbps()["tbps"]
        l2 = torch.cuda.get_device_properties(0).L2_cache_size

        def rec(kernel, calls, bytes_, **extra):
            return _record(kernel, calls, bytes_, copy_tbps, **extra)

    M = 5
    n_max = N + M
    torch.manual_seed(0)
    recs: list[dict] = []
    ks, vs, qs, outs, lens = verify_buffers(B, H, G, D, N, M, n_buf, dt, dev)
    q_bytes = B * H * M * D * dt.itemsize

    # ---- sparse: variants back to back in a graph, and after a small kernel that writes q
    def idx_sets(S_, n):
        return random_index_sets(B, N, S_, n, dev)

    sparse_variants = [
        ("v2 (round-1 default)", dict(prefetch=0, pdl=False)),
        ("prefetch bulk", dict(prefetch=2, pdl=False)),
        ("prefetch lines", dict(prefetch=1, pdl=False)),
        ("pdl (default)", dict()),
        ("prefetch bulk + pdl", dict(prefetch=2, pdl=True)),
        ("head split 2, 64 rows, 3 stages, pdl", dict(head_split=2, block_n=64, num_stages=3)),
        ("64 rows, 4 stages, pdl", dict(block_n=64, num_stages=4)),
    ]
    for S_ in ([S] if small else [S, 64, 2048]):
        sel = 2 * B * G * (S_ + M) * D * dt.itemsize
        sbytes = sel + 2 * q_bytes + B * S_ * 4
        n_calls = 2 if small else _n_calls(sel, l2)
        idx = idx_sets(S_, n_calls)
        ref = sparse_verify_attention_ref(qs[0], ks[0], vs[0], idx[0], lens)
        for name, kw in (sparse_variants if S_ == S else sparse_variants[:1] + sparse_variants[3:5]):
            err = rel_err(sparse_verify_attention(qs[0], ks[0], vs[0], idx[0], lens, **kw), ref)
            calls = [lambda i=i, kw=kw, idx=idx: sparse_verify_attention(
                qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], idx[i % len(idx)], lens, out=outs[i % n_buf], **kw)
                for i in range(n_calls)]
            recs.append(rec("sparse", calls, sbytes, variant=name, budget=S_, rel_err=err, **kw))
            if S_ == S and name in ("v2 (round-1 default)", "pdl (default)", "prefetch bulk + pdl"):
                # decode-step neighbour: a small elementwise kernel writes q right before each call
                q_src = [torch.randn_like(qs[0]) for _ in range(2)]
                qw = [torch.empty_like(qs[0]) for _ in range(n_buf)]
                pre = [lambda i=i, q_src=q_src, qw=qw: torch.mul(q_src[i % 2], 1.0, out=qw[i % n_buf])
                       for i in range(n_calls)]

                def both(i, kw=kw, pre=pre, idx=idx, qw=qw):
                    pre[i]()
                    sparse_verify_attention(qw[i % n_buf], ks[i % n_buf], vs[i % n_buf], idx[i % len(idx)], lens,
                                            out=outs[i % n_buf], **kw)

                recs.append(rec("sparse_after_q_writer", [lambda i=i, both=both: both(i) for i in range(n_calls)], sbytes,
                                variant=name, budget=S_, **kw))
                if name == "v2 (round-1 default)":
                    recs.append(rec("q_writer_alone", pre, 2 * q_bytes, budget=S_))

    # ---- full: the round-1 combine (one partial at a time) vs the pipelined one; splits at batch 1
    fbytes = 2 * B * G * n_max * D * dt.itemsize + 2 * q_bytes
    n_full = 2 if small else _n_calls(fbytes, l2)
    ref = full_verify_attention_ref(qs[0], ks[0], vs[0], lens)
    for name, cs in (("serial combine (default, as round 1)", 1), ("pipelined combine", 3)):
        err = rel_err(_launch(qs[0], ks[0], vs[0], None, 0, lens, None, None, None, None, False, None, None, None,
                              None, combine_stages=cs), ref)
        calls = [lambda i=i, cs=cs: _launch(qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], None, 0, lens, None, None,
                                            None, outs[i % n_buf], False, None, None, None, None, combine_stages=cs)
                 for i in range(n_full)]
        recs.append(rec("full", calls, fbytes, variant=name, batch=B, rel_err=err))
    B1 = 1
    ks1 = [torch.empty(B1, G, n_max, D, dtype=dt, device=dev).normal_() for _ in range(n_buf)]
    vs1 = [torch.empty(B1, G, n_max, D, dtype=dt, device=dev).normal_() for _ in range(n_buf)]
    qs1 = [torch.randn(B1, H, M, D, dtype=dt, device=dev) for _ in range(n_buf)]
    os1 = [torch.empty_like(qs1[0]) for _ in range(n_buf)]
    lens1 = lens[:1].contiguous()
    fbytes1 = 2 * B1 * G * n_max * D * dt.itemsize + 2 * q_bytes // B
    n_full1 = 2 if small else _n_calls(fbytes1, l2)
    ref1 = full_verify_attention_ref(qs1[0], ks1[0], vs1[0], lens1)
    sms = 4 if small else torch.cuda.get_device_properties(0).multi_processor_count
    for splits, cs in ((round(6 * sms / G), 1), (round(6 * sms / G), 3), (None, 1), (None, 3), (-(-sms // G), 1),
                       (-(-4 * sms // G), 1)):
        err = rel_err(_launch(qs1[0], ks1[0], vs1[0], None, 0, lens1, None, None, None, None, False, splits, None,
                              None, None, combine_stages=cs), ref1)
        calls = [lambda i=i, sp=splits, cs=cs: _launch(qs1[i % n_buf], ks1[i % n_buf], vs1[i % n_buf], None, 0, lens1,
                                                       None, None, None, os1[i % n_buf], False, sp, None, None, None,
                                                       combine_stages=cs) for i in range(n_full1)]
        recs.append(rec("full", calls, fbytes1, variant=f"batch 1, splits {splits or 'default'}, combine stages {cs}",
                        batch=1, num_splits=splits, combine_stages=cs, rel_err=err))
    # sparse at batch 1 (16 splits: the combine matters here too)
    idx1 = [torch.sort(torch.rand(B1, N, device=dev).topk(S, dim=1).indices, dim=1).values.to(torch.int32)
            for _ in range(n_full1)]
    sref1 = sparse_verify_attention_ref(qs1[0], ks1[0], vs1[0], idx1[0], lens1)
    for name, kw in (sparse_variants[0], sparse_variants[3]):
        err = rel_err(sparse_verify_attention(qs1[0], ks1[0], vs1[0], idx1[0], lens1, **kw), sref1)
        calls = [lambda i=i, kw=kw: sparse_verify_attention(qs1[i % n_buf], ks1[i % n_buf], vs1[i % n_buf], idx1[i],
                                                            lens1, out=os1[i % n_buf], **kw) for i in range(n_full1)]
        recs.append(rec("sparse", calls, 2 * G * (S + M) * D * dt.itemsize, variant=f"batch 1, {name}", batch=1,
                        rel_err=err))

    # ---- select: ticket launcher variants vs the barrier launcher vs torch.topk
    sel_kw = dict(budget=S, sinks=sinks, window=window, m=m)
    m1, m2 = m, S - sinks - window - m
    for Bs in (B, 1):
        lens_s = torch.full((Bs,), N, dtype=torch.int32, device=dev)
        prim = [torch.rand(Bs, n_max, device=dev) for _ in range(8)]
        sec = [torch.rand(Bs, n_max, device=dev) for _ in range(8)]
        ties = [torch.randint(0, 50, (Bs, n_max), device=dev).float() for _ in range(2)]
        sel_out = [torch.empty(Bs, S, dtype=torch.int32, device=dev) for _ in range(8)]
        n_sel = 2 if small else 24
        sbytes = 2 * Bs * n_max * 4 + Bs * S * 4
        ref = select_indices_ref(prim[0], sec[0], lens_s, **sel_kw)
        ref_t = select_indices_ref(ties[0], ties[1], lens_s, **sel_kw)
        variants = [("ticket (default)", None, {}), ("ticket, 16 warps", None, {"num_warps": 16})]
        base_plan = _ticket_plan(Bs, n_max, S, sinks, window, m1, m2, dev)
        for P in (4, 16):
            if base_plan is not None and P != base_plan[0]:
                variants.append((f"ticket, {P} programs per row", P, {}))
        for name, P, kw in variants:
            plan = _ticket_plan(Bs, n_max, S, sinks, window, m1, m2, dev, programs_per_row=P)
            if plan is None:
                continue

            def run(p, s_, o, plan=plan, kw=kw, lens_s=lens_s):
                return _select_ticket(p, s_, lens_s, o, S, sinks, window, m1, m2, plan, kw.get("num_warps"))

            ok = torch.equal(run(prim[0], sec[0], sel_out[0]), ref)
            ok_t = torch.equal(run(ties[0], ties[1], sel_out[1]), ref_t)
            calls = [lambda i=i, run=run, prim=prim, sec=sec, sel_out=sel_out: run(prim[i % 8], sec[i % 8], sel_out[i % 8])
                     for i in range(n_sel)]
            recs.append(rec("select", calls, sbytes, variant=name, batch=Bs, programs_per_row=plan[0],
                            exact=ok, exact_ties=ok_t))
            if name == "ticket (default)":
                calls = [lambda i=i, run=run, ties=ties, sel_out=sel_out: run(ties[i % 2], ties[(i + 1) % 2], sel_out[i % 8])
                         for i in range(n_sel)]
                recs.append(rec("select", calls, sbytes, variant="ticket (default), scores with many ties", batch=Bs))

        def run_b(p, s_, o, lens_s=lens_s):
            return _select_barrier(p, s_, lens_s, o, S, sinks, window, m1, m2)

        ok = torch.equal(run_b(prim[0], sec[0], sel_out[0]), ref)
        calls = [lambda i=i, prim=prim, sec=sec, sel_out=sel_out, run_b=run_b: run_b(prim[i % 8], sec[i % 8], sel_out[i % 8])
                 for i in range(n_sel)]
        recs.append(rec("select", calls, sbytes, variant="barrier (round 1)", batch=Bs, exact=ok))
        recs.append(rec("torch_topk", [lambda i=i, prim=prim: torch.topk(prim[i % 8], S, dim=1) for i in range(n_sel)],
                        Bs * n_max * 4, variant="one top-k", batch=Bs))
        assert torch.equal(select_indices(prim[0], sec[0], lens_s, **sel_kw), ref)

    # ---- srh_scores at the runtime's query count: stored probabilities (one pass over the keys) vs two passes
    hs = 2
    rows = (H // G) * M
    kv_heads = torch.tensor([0, G // 2], dtype=torch.int32, device=dev)
    n_srh_buf = min(n_buf, 4)
    ks = [torch.empty(B, G, n_max, D, dtype=dt, device=dev).normal_() for _ in range(n_srh_buf)]
    q_srh = [torch.randn(B, hs, rows, D, dtype=dt, device=dev) for _ in range(n_srh_buf)]
    score_out = [torch.empty(B, n_max, dtype=torch.float32, device=dev) for _ in range(4)]
    srh_bytes = B * hs * N * D * dt.itemsize + B * n_max * 4
    n_srh = 2 if small else _n_calls(srh_bytes, l2, lo=12, hi=64)
    ref = srh_scores_ref(q_srh[0], kv_heads, ks[0], lens)
    for name, kw in (("two passes over the keys, queries as the MMA M side in pass 1 (default)", dict()),
                     ("two passes over the keys, keys as the M side (round 3)", dict(queries_as_m=False)),
                     ("stored fp16 probabilities (one pass over the keys)", dict(store_probs=True)),
                     ("stored probabilities, vectorised tile stores", dict(store_probs=True, probs_pad=0))):
        err = rel_err(srh_scores(q_srh[0], kv_heads, ks[0], lens, **kw), ref)
        calls = [lambda i=i, kw=kw: srh_scores(q_srh[i % n_srh_buf], kv_heads, ks[i % n_srh_buf], lens,
                                               out=score_out[i % 4], **kw) for i in range(n_srh)]
        recs.append(rec("srh_scores", calls, srh_bytes, variant=name, rel_err=err, rows=rows))
    return {"copy_tbps": copy_tbps, "gpu": "cpu (interpreter)" if small else torch.cuda.get_device_name(0),
            "shape": {"B": B, "H": H, "G": G, "D": D, "N": N, "S": S, "M": M}, "records": recs}


def _print_probe(res: dict) -> None:
    for r in res["records"]:
        extra = {k: r[k] for k in ("budget", "batch", "rel_err", "exact", "exact_ties", "programs_per_row") if k in r}
        print(f"{r['kernel']:22s} {r.get('variant', ''):50s} {r.get('median_ms', float('nan')) * 1e3:9.1f} us  "
              f"do_bench {r.get('do_bench_ms', float('nan')) * 1e3:8.1f} us  {extra} {r.get('error', '')}")


if __name__ == "__main__":
    res = probe_round2(small=len(sys.argv) > 2 and sys.argv[2] == "round2-small")
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1) + "\n")
    _print_probe(res)
