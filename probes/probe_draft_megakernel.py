"""Probe: the draft's decode forward over its verification set as one persistent CUDA kernel
(`dustin_kernels.draft_forward`, in the tree from b3ecc3d to 86cfce4: run it against 86cfce4) against the Triton path the runtime uses now (`skinny_linear` +
`sparse_verify_attention_rope`, ~7 kernels a layer), Qwen2.5-0.5B shapes with random weights, batch
16, 32k context, a 521-row set (S 512 + 2 gamma + 1), T = 1 and 2 tokens per sequence.

Correctness: logits of both paths and of the fp32 torch reference (`draft_forward_ref`), the new
K / V rows both write, the RoPE'd queries. Speed: CUDA-graph time of the layers alone and of the
forward with its LM head, per path, grid sizes (every SM; 16 SMs left to a side stream); where the
time goes inside the kernel (a PROF build's clock64 stamps at every grid barrier and inside phases).
The runs in probes/results/draft-megakernel (r3 = b3ecc3d) also timed an arm without the L2
prefetch of the attention's rows (`mega_layers_noprefetch`): the prefetch was no faster and was
removed after b3ecc3d.
`python probes/probe_draft_megakernel.py [batch] [context] [rows]`; writes $OUT/probe-draft-megakernel.json."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from dustin_kernels import sparse_verify_attention_rope
from dustin_kernels.draft_forward import draft_forward, draft_forward_ref
from dustin_kernels.layer_ops import add_rms_norm

from dustin_eval.timing import graph_ms
from dustin_runtime.attention import AttentionBackend
from dustin_runtime.loader import random_model
from dustin_runtime.presets import preset


class SetAttention(AttentionBackend):
    """The runtime's sparse drafting path: RoPE + cache write + attention over the set in one kernel."""

    def __init__(self, idx):
        self.idx = idx

    def attend_qkv(self, layer, qkv, rope, num_heads, cache, ctx):
        out, _ = sparse_verify_attention_rope(qkv, rope, cache.k[layer], cache.v[layer], self.idx, ctx.start, num_heads)
        return out

    def attend(self, layer, q, cache, ctx):  # pragma: no cover - attend_qkv takes every layer
        raise AssertionError


GHZ = 1.98  # the H200's SM clock under load (nvidia-smi): clock64 cycles to microseconds


def us(cycles):
    return round(cycles / GHZ / 1e3, 3)


def layer_weights(model):
    return [(b.attn.wqkv.weight, b.attn.wqkv.bias, b.attn.wo.weight, b.attn.wo.bias, b.ffn.w13.weight,
             b.ffn.w2.weight, b.attn_norm.weight, b.ffn_norm.weight) for b in model.layers]


@torch.inference_mode()
def main(batch=16, context=32768, rows=521):
    torch.manual_seed(0)
    model = random_model(preset("qwen2.5-0.5b"), dtype=torch.bfloat16, device="cuda").use_kernels()
    cfg = model.cfg
    cache = model.allocate_cache(batch, context + 8)
    for t in cache.k + cache.v:
        t.normal_()
    cache.lengths.fill_(context)
    idx = torch.sort(torch.randperm(context, device="cuda")[:rows]).values.int().expand(batch, rows).contiguous()
    idx[:, -7:] = -1  # the set's padding
    be = SetAttention(idx)
    layers = layer_weights(model)
    H, eps = cfg.num_heads, cfg.rms_eps
    out = {"batch": batch, "context": context, "rows": rows, "gpu": torch.cuda.get_device_name(),
           "commit": os.environ.get("DUSTIN_GIT_COMMIT", "?"), "torch": torch.__version__}

    def mega(tok, logits=True, reserve=0):
        x = model.embed_tokens(tok)
        resid, h, q = draft_forward(x, layers, cache.k, cache.v, idx, cache.lengths, model.rope, num_heads=H, eps=eps,
                                    reserve=reserve)
        if not logits:
            return None
        y = add_rms_norm(resid, h.unsqueeze(0), model.norm.weight, eps, partials=True)[1]
        return model.logits(y).view(tok.shape[0], tok.shape[1], -1), q

    for T in (1, 2):
        tok = torch.randint(0, 1000, (batch, T), device="cuda")
        rec = {}
        t0 = time.time()
        ls = model(tok, cache, be, phase="draft", logits="all")  # [B, T, V]
        kv_s = [(k[:, :, context:context + T].clone(), v[:, :, context:context + T].clone())
                for k, v in zip(cache.k, cache.v, strict=True)]
        for k, v in zip(cache.k, cache.v, strict=True):
            k[:, :, context:context + T] = 7.0
            v[:, :, context:context + T] = 7.0
        lm, qm = mega(tok)
        torch.cuda.synchronize()
        rec["first_call_s"] = round(time.time() - t0, 2)
        kv_m = [(k[:, :, context:context + T].clone(), v[:, :, context:context + T].clone())
                for k, v in zip(cache.k, cache.v, strict=True)]
        xr = model.embed_tokens(tok)
        rr, hr, qr = draft_forward_ref(xr, layers, cache.k, cache.v, idx, cache.lengths, model.rope, num_heads=H,
                                       eps=eps)
        yr = add_rms_norm(rr, hr.unsqueeze(0), model.norm.weight, eps, partials=True)[1]
        lr = model.logits(yr).view(batch, T, -1)
        scale = lr.abs().max().item()
        rec["logits_scale"] = scale
        rec["mega_vs_ref_max"] = (lm - lr).abs().max().item() / scale
        rec["skinny_vs_ref_max"] = (ls - lr).abs().max().item() / scale
        rec["mega_vs_skinny_max"] = (lm - ls).abs().max().item() / scale
        rec["argmax_mega_eq_ref"] = (lm.argmax(-1) == lr.argmax(-1)).float().mean().item()
        rec["argmax_skinny_eq_ref"] = (ls.argmax(-1) == lr.argmax(-1)).float().mean().item()
        rec["argmax_mega_eq_skinny"] = (lm.argmax(-1) == ls.argmax(-1)).float().mean().item()
        rec["kv_rows_max_diff_first_layer"] = max((a - b).abs().max().item() for a, b in zip(kv_s[0], kv_m[0], strict=True))
        rec["kv_rows_max_diff_all"] = max((a.float() - b.float()).abs().max().item()
                                          for s, m in zip(kv_s, kv_m, strict=True) for a, b in zip(s, m, strict=True))
        rec["q_max_diff_layer0"] = (qm[0].float() - qr[0].float()).abs().max().item()
        rec["q_max_diff_all"] = (qm.float() - qr.float()).abs().max().item()
        rec["q_scale"] = qr.float().abs().max().item()
        print(f"T={T} correctness:", json.dumps(rec), flush=True)

        def body_skinny(tok=tok):
            cache.lengths.fill_(context)
            model(tok, cache, be, phase="draft", logits="none")

        def fwd_skinny(tok=tok):
            cache.lengths.fill_(context)
            model(tok, cache, be, phase="draft", logits="last")

        timing = {}
        for name, fn in (("skinny_layers", body_skinny), ("skinny_forward", fwd_skinny),
                         ("mega_layers", lambda tok=tok: mega(tok, logits=False)),
                         ("mega_forward", lambda tok=tok: mega(tok)),
                         ("mega_layers_reserve16", lambda tok=tok: mega(tok, logits=False, reserve=16)),
                         ("skinny_layers_again", body_skinny), ("mega_layers_again", lambda tok=tok: mega(tok, logits=False))):
            timing[name] = round(graph_ms([fn], replays=30, budget_ms=None, warmup=3)["median_ms"], 4)
            print(f"T={T} {name}: {timing[name]:.4f} ms", flush=True)
        rec["graph_ms"] = timing
        # where the time goes: clock64 stamps at every barrier (a PROF build), per CTA
        from dustin_kernels._util import num_sms

        L = len(layers)
        prof = torch.zeros(num_sms(torch.device("cuda")), L, 16, dtype=torch.int64, device="cuda")
        x = model.embed_tokens(tok)
        for _ in range(3):
            draft_forward(x, layers, cache.k, cache.v, idx, cache.lengths, model.rope, num_heads=H, eps=eps, prof=prof)
        torch.cuda.synchronize()
        st = prof.double().cpu()  # [cta, L, 16]
        rel = st[:, :, 1:10:2]  # releases [cta, L, 5]
        arr = st[:, :, 0:10:2]
        prev = torch.cat([rel[:, :-1, 4:5], rel[:, 1:, :4]], dim=2)  # release before each phase, layers 1..L-1
        work = arr[:, 1:, :] - prev  # [cta, L-1, 5] cycles from the phase's start to this CTA's arrival
        wait = rel[:, 1:, :] - arr[:, 1:, :]
        ghz = GHZ

        phases = "A qkv", "B attention", "C wo", "D gate|up", "E w2"
        rec["phase_us"] = {ph: {"work_max": us(work[:, :, i].max(0).values.median().item()),
                                "work_median_cta": us(work[:, :, i].median(0).values.median().item()),
                                "wait_min": us(wait[:, :, i].min(0).values.median().item())}
                           for i, ph in enumerate(phases)}
        inner = st[:, 1:, 10:16]  # stamps inside phases (0 where a CTA had no work there)

        def span(a, b, who):  # median over layers and working CTAs of b - a
            d = (b - a)[who]
            return us(d.median().item()) if d.numel() else None

        na, nc = (inner[:, 0, 0] > 0), (inner[:, 0, 5] > 0)
        rec["inside_us"] = {
            "A norm stage": span(prev[:, :, 0], inner[:, :, 0], na), "A product": span(inner[:, :, 0], inner[:, :, 1], na),
            "A epilogue": span(inner[:, :, 1], arr[:, 1:, 0], na),
            "C stage": span(prev[:, :, 2], inner[:, :, 5], nc), "C rest": span(inner[:, :, 5], arr[:, 1:, 2], nc),
            "D norm stage": span(prev[:, :, 3], inner[:, :, 2], inner[:, 0, 2] > 0),
            "D units": span(inner[:, :, 2], arr[:, 1:, 3], inner[:, 0, 2] > 0),
            "E stage": span(prev[:, :, 4], inner[:, :, 3], inner[:, 0, 3] > 0),
            "E rest": span(inner[:, :, 3], arr[:, 1:, 4], inner[:, 0, 3] > 0)}
        rec["layer_us"] = us((rel[:, 2:, 4] - rel[:, 1:-1, 4]).median().item())
        print(f"T={T} phases (us at {ghz} GHz):", json.dumps(rec["phase_us"]), "layer", rec["layer_us"], flush=True)
        print(f"T={T} inside phases (us):", json.dumps(rec["inside_us"]), flush=True)
        out[f"T{T}"] = rec
    path = os.path.join(os.environ.get("OUT", "."), "probe-draft-megakernel.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
