"""Probe: where a draft decode forward spends its time (Qwen2.5-0.5B shape, batch 16, 32k context,
random weights, CUDA graph), per kernel from the torch profiler, against its byte floor: over the
whole cache (`full`) and over a verification set of S + 2 gamma + 1 rows (`verify-set`, what
`--draft-kv verify-set` attends); with the linears through cuBLAS or `skinny_linear`, with and
without programmatic dependent launches; and the loop's first forward of a step, two tokens
([prev, cur], `verify-set-T2`). `python probes/profile_draft_forward.py [batch] [context] [rows] [modes]`
(modes: comma-separated names, default all)."""

from __future__ import annotations

import os
import sys

import torch
from dustin_kernels import sparse_verify_attention
from torch.profiler import ProfilerActivity, profile

from dustin_eval.timing import graph_ms
from dustin_runtime.attention import AttentionBackend, TritonAttention
from dustin_runtime.loader import random_model
from dustin_runtime.presets import preset


class SetAttention(AttentionBackend):
    def __init__(self, idx):
        self.idx = idx

    def attend(self, layer, q, cache, ctx):
        return sparse_verify_attention(q, cache.k[layer], cache.v[layer], self.idx, ctx.start)


@torch.inference_mode()
def main(batch=16, context=32768, rows=521, modes=""):
    model = random_model(preset("qwen2.5-0.5b"), dtype=torch.bfloat16, device="cuda").use_kernels()
    cache = model.allocate_cache(batch, context + 8)
    for t in cache.k + cache.v:
        t.normal_()
    cache.lengths.fill_(context)
    toks = {1: torch.randint(0, 1000, (batch, 1), device="cuda"), 2: torch.randint(0, 1000, (batch, 2), device="cuda")}
    idx = torch.sort(torch.randperm(context, device="cuda")[:rows]).values.int().expand(batch, rows).contiguous()
    out_dir = os.environ.get("OUT", ".")
    w = sum(p.numel() * p.element_size() for p in model.parameters())
    head = model.lm_head.weight.numel() * 2
    import dustin_kernels.layer_ops as lo
    import dustin_kernels.skinny as sk

    pdl = sk.pdl_supported
    runs = (("full", TritonAttention(), True, True, 1), ("verify-set-cublas", SetAttention(idx), False, True, 1),
            ("verify-set-nopdl", SetAttention(idx), True, False, 1), ("verify-set", SetAttention(idx), True, True, 1),
            ("verify-set-T2", SetAttention(idx), True, True, 2))
    for name, be, skinny, use_pdl, T in runs:
        if modes and name not in modes.split(","):
            continue
        tok = toks[T]
        model.skinny = skinny  # the linears through skinny_linear (the runtime's choice) or cuBLAS
        sk.pdl_supported = lo.pdl_supported = pdl if use_pdl else (lambda device: False)
        def fwd(be=be, tok=tok):
            cache.lengths.fill_(context)
            model(tok, cache, be, phase="draft", logits="last")

        def body(be=be, tok=tok):
            cache.lengths.fill_(context)
            model(tok, cache, be, phase="draft", logits="none")

        ms = graph_ms([fwd], replays=20, budget_ms=None, warmup=3)["median_ms"]
        ms_body = graph_ms([body], replays=20, budget_ms=None, warmup=3)["median_ms"]
        kv = batch * (context if name == "full" else rows) * model.cfg.kv_bytes_per_token(2)
        print(f"[{name}] draft forward graph: {ms:.3f} ms (layers only {ms_body:.3f}); weights {w / 1e9:.2f} GB "
              f"(head {head / 1e9:.3f}), KV {kv / 1e9:.3f} GB; floor at 4.26 TB/s {(w + kv) / 4.26e9:.3f} ms")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fwd()  # eager: one kernel per op, per-kernel device times
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
        print(table)
        with open(os.path.join(out_dir, f"profile-draft-forward-{name}.txt"), "w") as f:
            f.write(table)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(*(int(x) for x in a[:3]), *a[3:4])
