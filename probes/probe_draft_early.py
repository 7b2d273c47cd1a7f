"""Probe: the draft's attention over its set (`sparse_verify_attention_rope`, what sparse drafting runs)
with its first block of indexed rows, the lengths and RoPE's table rows loaded before the PDL wait
(`early`) or after it, and with early loads at other split counts and rows per block: the whole draft
decode forward (Qwen2.5-0.5B shape, batch 16, 32k cache, 521-row set, CUDA graph, skinny linears
before it as in the runtime), one and two tokens, two interleaved rounds; then, with `e2e`, `dustin
bench e2e`'s loop for `dustin-vs` with early on and off. The run at 2a53af8 also timed a combine of
the split partials in one load (`parallel`), measured slower and removed after it
(probes/results/probe-draft-early-2a53af8.json). `python probes/probe_draft_early.py [e2e]`
-> $OUT/probe-draft-early.json"""

from __future__ import annotations

import functools
import json
import os
import sys

import dustin_kernels.verify_attention as va
import torch
from dustin_kernels import sparse_verify_attention, sparse_verify_attention_rope

from dustin_eval.timing import graph_ms
from dustin_runtime.attention import AttentionBackend
from dustin_runtime.loader import random_model
from dustin_runtime.presets import preset


class SetRope(AttentionBackend):
    """Sparse drafting's attention: RoPE, the cache write and the set's attention in one kernel."""

    def __init__(self, idx, **kw):
        self.idx, self.kw = idx, kw

    def attend(self, layer, q, cache, ctx):
        return sparse_verify_attention(q, cache.k[layer], cache.v[layer], self.idx, ctx.start)

    def attend_qkv(self, layer, qkv, rope, num_heads, cache, ctx):
        return sparse_verify_attention_rope(qkv, rope, cache.k[layer], cache.v[layer], self.idx, ctx.start,
                                            num_heads, **self.kw)[0]


ORIG = va._launch


def arm(on: bool) -> None:
    """The kernel module's defaults (on) or early off (off)."""
    va._launch = ORIG if on else functools.partial(_old, ORIG)


def _old(orig, *a, **k):
    return orig(*a, **{**k, "early": False})


@torch.inference_mode()
def main(e2e: str = ""):
    B, N, rows = 16, 32768, 521
    model = random_model(preset("qwen2.5-0.5b"), dtype=torch.bfloat16, device="cuda").use_kernels()
    cache = model.allocate_cache(B, N + 8)
    for t in cache.k + cache.v:
        t.normal_()
    idx = torch.sort(torch.randperm(N, device="cuda")[:rows]).values.int().expand(B, rows).contiguous()
    res = {}
    variants = [("early (default)", {}), ("no early (before)", {"early": False})]
    grid = [(f"early, {sp} splits x {bn} rows", {"num_splits": sp, "block_n": bn})
            for sp in (1, 2, 3, 5, 6) for bn in (64, 128)]  # the launcher's split grid with early loads
    for rnd in range(2):
        for T in (1, 2):
            tok = torch.randint(0, 1000, (B, T), device="cuda")
            for name, kw in variants + (grid if T == 1 else []):
                be = SetRope(idx, **kw)

                def fwd(be=be, tok=tok):
                    cache.lengths.fill_(N)
                    model(tok, cache, be, phase="draft", logits="last")

                ms = graph_ms([fwd], replays=30, budget_ms=None, warmup=3)["median_ms"]
                res.setdefault(f"T{T} {name}", []).append(ms)
                print(rnd, T, name, f"{ms:.4f} ms", flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "batch": B, "context": N, "set_rows": rows, "forward_ms": res}
    if e2e:
        from common import e2e_ab

        e2e_ab("dustin-vs", "16", "32768", "1", arm, "new_defaults", "probe-draft-early-e2e.json")
    with open(os.path.join(os.environ.get("OUT", "."), "probe-draft-early.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
