"""Probe: where a draft decode forward spends its time (Qwen2.5-0.5B shape, batch 16, 32k context,
random weights, CUDA graph), per kernel from the torch profiler, against its byte floor."""

from __future__ import annotations

import os

import torch
from torch.profiler import ProfilerActivity, profile

from dustin_eval.timing import graph_ms
from dustin_runtime.attention import TritonAttention
from dustin_runtime.loader import random_model
from dustin_runtime.presets import preset


@torch.inference_mode()
def main(batch=16, context=32768):
    model = random_model(preset("qwen2.5-0.5b"), dtype=torch.bfloat16, device="cuda").use_kernels()
    cache = model.allocate_cache(batch, context + 8)
    for t in cache.k + cache.v:
        t.normal_()
    cache.lengths.fill_(context)
    tok = torch.randint(0, 1000, (batch, 1), device="cuda")
    be = TritonAttention()

    def fwd():
        cache.lengths.fill_(context)
        model(tok, cache, be, phase="draft")

    ms = graph_ms([fwd], replays=20, budget_ms=None, warmup=3)["median_ms"]
    w = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = batch * context * model.cfg.kv_bytes_per_token(2)
    print(f"draft forward graph: {ms:.3f} ms; weights {w / 1e9:.2f} GB, KV {kv / 1e9:.2f} GB; floor at 4.26 TB/s "
          f"{(w + kv) / 4.26e9:.3f} ms")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fwd()  # eager: one kernel per op, per-kernel device times
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(table)
    with open(os.path.join(os.environ.get("OUT", "."), "profile-draft-forward.txt"), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
