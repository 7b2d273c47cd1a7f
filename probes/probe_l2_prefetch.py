"""Probe: is the draft's decode forward (Qwen2.5-0.5B shape, batch 16, over a 521-row verification
set, CUDA graph) waiting on its weights' DRAM latency? Its kernels read 29.8 MB of weights a layer
at 1.6-2.3 TB/s (kernels/NOTES.md: latency-bound, DRAM mostly idle over a ~0.9 ms forward that
reads 0.99 GB). Measured here:

- `base`: the runtime's forward (each layer's weights laid out in one flat buffer, as below);
- `hot`: every layer runs layer 0's weights (29.8 MB, stays in the 60 MB L2): what a forward costs
  when its weights come from L2, the bound of anything prefetched;
- `prefetch-next P`: at the start of layer l a side stream (joined in the graph through events) asks
  L2 for layer l + 1's weights with Hopper's bulk prefetch (`cp.async.bulk.prefetch.L2`, P programs of
  one warp, 16 KB per instruction): they arrive while layer l runs;
- `prefetch-mlp P`: at the start of layer l, layer l's own MLP weights (w13, w2: 26 MB) while its
  norm, qkv, attention and wo run; and the next layer's attention weights during the MLP.

`python probes/probe_l2_prefetch.py [batch] [context] [T]` -> $OUT/probe-l2-prefetch.json"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl
from profile_draft_forward import SetAttention

import dustin_runtime.model as dm
from dustin_eval.timing import graph_ms
from dustin_runtime.loader import random_model
from dustin_runtime.presets import preset

CHUNK = 16384


@triton.jit
def _l2_prefetch(BASE, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    n_chunks = tl.cdiv(nbytes, CHUNK)
    for start in range(pid * BLOCK, n_chunks, tl.num_programs(0) * BLOCK):
        i = tl.minimum(start + tl.arange(0, BLOCK), n_chunks - 1).to(tl.int64)  # the tail repeats the last chunk
        size = tl.minimum(nbytes - i * CHUNK, CHUNK).to(tl.int32)
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                  [BASE + i * CHUNK, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(buf: torch.Tensor, programs: int) -> None:
    """Ask L2 for the bytes of `buf` (a uint8 view, 16-byte multiple)."""
    _l2_prefetch[(programs,)](buf, buf.numel(), CHUNK=CHUNK, BLOCK=32, num_warps=1)


def flatten_layers(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Lay each layer's weights out in one buffer (attention side, then the MLP) with the parameters
    as views of it; -> per layer (attention part, MLP part) as uint8 views."""
    out = []
    for blk in model.layers:
        groups = ([blk.attn_norm.weight, blk.attn.wqkv.weight, blk.attn.wo.weight]
                  + ([blk.attn.wqkv.bias] if blk.attn.wqkv.bias is not None else []),
                  [blk.ffn_norm.weight, blk.ffn.w13.weight, blk.ffn.w2.weight])
        sizes = [[-(-p.numel() * p.element_size() // 256) * 256 for p in g] for g in groups]
        flat = torch.empty(sum(map(sum, sizes)), dtype=torch.uint8, device="cuda")
        off, parts = 0, []
        for g, sz in zip(groups, sizes, strict=True):
            start = off
            for p, s in zip(g, sz, strict=True):
                view = flat[off:off + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
                view.copy_(p.data)
                p.data = view
                off += s
            parts.append(flat[start:off])
        out.append(tuple(parts))
    return out


@torch.inference_mode()
def main(batch: str = "16", context: str = "32768", T: str = "1"):
    B, N, T = int(batch), int(context), int(T)
    model = random_model(preset("qwen2.5-0.5b"), dtype=torch.bfloat16, device="cuda").use_kernels()
    cache = model.allocate_cache(B, N + 8)
    for t in cache.k + cache.v:
        t.normal_()
    tok = torch.randint(0, 1000, (B, T), device="cuda")
    rows = 521
    idx = torch.sort(torch.randperm(N, device="cuda")[:rows]).values.int().expand(B, rows).contiguous()
    be = SetAttention(idx)
    parts = flatten_layers(model)
    L = len(model.layers)
    side = torch.cuda.Stream()
    orig = dm.Block.forward
    mode = {"name": "base", "P": 0}

    def hooked(self, x, layer, *a, **k):
        name, P = mode["name"], mode["P"]
        main_s = torch.cuda.current_stream()
        if name != "base":
            ev = torch.cuda.Event()
            ev.record(main_s)  # layer - 1 is done
            side.wait_event(ev)
            with torch.cuda.stream(side):
                if name == "prefetch-next":
                    if layer == 0:
                        prefetch(parts[0][0], P), prefetch(parts[0][1], P)
                    if layer + 1 < L:
                        prefetch(parts[layer + 1][0], P), prefetch(parts[layer + 1][1], P)
                else:  # prefetch-mlp
                    if layer == 0:
                        prefetch(parts[0][0], P)
                    prefetch(parts[layer][1], P)
                    if layer + 1 < L:
                        prefetch(parts[layer + 1][0], P)
        out = orig(self, x, layer, *a, **k)
        if name != "base" and layer == L - 1:
            main_s.wait_stream(side)  # join the side stream (graph capture needs it)
        return out

    def fwd():
        cache.lengths.fill_(N)
        model(tok, cache, be, phase="draft", logits="last")

    res = {}
    dm.Block.forward = hooked
    try:
        runs = [("base", 0)] + [(n, p) for n in ("prefetch-next", "prefetch-mlp") for p in (8, 16, 32)]
        for rnd in range(2):  # two interleaved rounds
            for name, P in runs:
                mode.update(name=name, P=P)
                t = graph_ms([fwd], replays=30, budget_ms=None, warmup=3)
                res.setdefault(f"{name} {P}" if P else name, []).append(t["median_ms"])
                print(rnd, name, P, f"{t['median_ms']:.4f} ms", flush=True)
        mode.update(name="base", P=0)
        layers = model.layers
        model.layers = torch.nn.ModuleList([layers[0]] * L)  # every layer reads layer 0's weights
        t = graph_ms([fwd], replays=30, budget_ms=None, warmup=3)
        res["hot (layer 0's weights in every layer)"] = [t["median_ms"]]
        print("hot", f"{t['median_ms']:.4f} ms", flush=True)
        model.layers = layers
    finally:
        dm.Block.forward = orig
    out = {"gpu": torch.cuda.get_device_name(), "batch": B, "context": N, "T": T, "set_rows": rows,
           "layer_bytes": [int(a.numel() + m.numel()) for a, m in parts[:1]], "median_ms": res}
    with open(os.path.join(os.environ.get("OUT", "."), f"probe-l2-prefetch-T{T}.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
