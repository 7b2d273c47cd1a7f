"""Train the SmolLM2 draft: distil from the target's logits (KL + a CE term), or CE only without it.

Runs on one CUDA GPU (or, slowly, on CPU for smoke tests). Everything is bounded by wall clock:
`--time-budget` seconds of optimisation, learning rate and sequence-length phases scheduled by the
elapsed share of that budget, checkpoints every `--ckpt-every` seconds, then an evaluation on the
eval windows (perplexity of draft and target, teacher-forced top-1 agreement).

Drafts come in two kinds. `--init-layers 0,6,12,17,23,29` builds a draft of the target's width from
those target layers (weights copied), the target's embedding (rounded to --embed-bits, frozen,
also the tied output head) and final norm; every layer matrix is trained through its --layer-bits
group value (`dustin_runtime.packed`, straight-through), so what is stored is what was trained. `--shapes 4x512` builds narrow
drafts from scratch (the first draft's recipe), stored in bf16.

Several drafts can train side by side on the same batches and teacher logits (`--init-layers
'0,6,12,17,23,29;0,10,19,29'` or `--shapes 4x512,2x512`): the first is the one saved; the others
are ablations that only report metrics.

Outputs under --out: draft.safetensors.partN (the first draft's weights, low-bit groups or bf16, byte-split
below 16 MiB, reassemble with `cat`), draft_config.json, train_log.jsonl, metrics.json.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from common import draft_config

from dustin_runtime.packed import fake_quant, pack

PART_BYTES = 15 * 1024 * 1024


def load_stream(pattern: str, device) -> torch.Tensor:
    """All uint16 shards matching `pattern`, concatenated, as int32 on `device`."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit(f"no token shards match {pattern}")
    arr = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in paths])
    print(f"data: {len(paths)} shards, {arr.size:,} tokens ({', '.join(paths)})", flush=True)
    return torch.from_numpy(arr.astype(np.int32)).to(device), paths


def load_teacher(gguf_path: str, device):
    """SmolLM2 from its GGUF (dequantised by transformers), bf16, eval mode."""
    from transformers import AutoModelForCausalLM, GgufConfig

    folder, name = os.path.split(os.path.abspath(gguf_path))
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(  # plain dense bf16 Linear layers, no GGUF kernels
        folder, gguf_file=name, dtype=torch.bfloat16, attn_implementation="sdpa",
        quantization_config=GgufConfig(dequantize=True))
    model.to(device).eval().requires_grad_(False)
    print(f"teacher loaded in {time.time() - t0:.1f}s", flush=True)
    return model


def pca_embedding(teacher, dim: int, std: float = 0.05) -> torch.Tensor:
    """Teacher's token embedding projected on its top-`dim` principal directions, rescaled to
    element std `std` (the raw scale gives initial logits near 30): [V, dim]."""
    e = teacher.get_input_embeddings().weight.float()  # [V, 576]
    _, _, vh = torch.linalg.svd(e - e.mean(0), full_matrices=False)
    p = e @ vh[:dim].T  # [V, dim]
    return p * (std / p.std())


def parse_shapes(spec: str) -> list[tuple[int, int]]:
    """'4x512,2x512' -> [(4, 512), (2, 512)]: layers x MLP width."""
    return [tuple(int(v) for v in s.split("x")) for s in spec.split(",")]


def parse_init_layers(spec: str) -> list[list[int]]:
    """'0,6,12;0,10' -> [[0, 6, 12], [0, 10]]: target layers copied into each draft."""
    return [[int(v) for v in part.split(",")] for part in spec.split(";")]


class FakeQuant(torch.nn.Module):
    """Parametrization: a weight is used as its stored group value at `bits` (straight-through)."""

    def __init__(self, bits: int):
        super().__init__()
        self.bits = bits

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return fake_quant(w, self.bits)


def draft_from_target(teacher, layers: list[int], layer_bits: int, embed_bits: int):
    """A Llama draft of the target's shape with len(layers) layers copied from the target's
    `layers`, the target's final norm, and the target's embedding rounded to `embed_bits` and
    frozen (tied head). Every layer matrix is parametrized through FakeQuant(layer_bits)."""
    import copy

    from torch.nn.utils import parametrize
    from transformers import LlamaForCausalLM

    n = teacher.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        sys.exit(f"--init-layers: layers must be in 0..{n - 1}, got {layers}")
    cfg = copy.deepcopy(teacher.config)
    cfg.num_hidden_layers = len(layers)
    cfg.tie_word_embeddings = True
    for key in ("layer_types", "quantization_config"):
        if hasattr(cfg, key):
            delattr(cfg, key)
    cfg._attn_implementation = "sdpa"
    dev = teacher.get_input_embeddings().weight.device
    m = LlamaForCausalLM(cfg).to(dev)
    with torch.no_grad():
        for i, src in enumerate(layers):
            m.model.layers[i].load_state_dict(teacher.model.layers[src].state_dict())
        m.model.norm.load_state_dict(teacher.model.norm.state_dict())
        emb = m.get_input_embeddings().weight
        emb.copy_(fake_quant(teacher.get_input_embeddings().weight.float(), embed_bits))
    m.tie_weights()
    m.get_input_embeddings().weight.requires_grad_(False)
    for mod in m.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            parametrize.register_parametrization(mod, "weight", FakeQuant(layer_bits))
    return m.float()


def lr_at(frac: float, peak: float, warmup: float, floor: float) -> float:
    """Linear warm-up then cosine decay to floor*peak, over the elapsed share of the budget."""
    if frac < warmup:
        return peak * max(frac / warmup, 0.01)
    p = min((frac - warmup) / max(1 - warmup, 1e-9), 1.0)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def draft_logits(model, x: torch.Tensor) -> torch.Tensor:
    """Logits of a LlamaForCausalLM without the cache machinery: [B, T, V]."""
    return model(input_ids=x, use_cache=False).logits


def draft_state(model, embed_bits: int) -> dict[str, torch.Tensor]:
    """What is stored: group entries for the matrices of a draft from the target (its layers'
    parametrized weights at their bits, the embedding at `embed_bits`), bf16 for the rest; bf16
    throughout for a narrow draft. The head is tied to the embedding and not stored."""
    from torch.nn.utils import parametrize

    grouped = any(parametrize.is_parametrized(mod) for mod in model.modules())
    bits = {f"{name}.weight": mod.parametrizations.weight[0].bits for name, mod in model.named_modules()
            if parametrize.is_parametrized(mod, "weight")}
    sd = {}
    for name, mod in model.named_modules():
        for pname, p in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            if pname == "original":
                continue
            full = f"{name}.{pname}" if name else pname
            if full.startswith("lm_head."):
                continue
            sd[full] = p
        if parametrize.is_parametrized(mod, "weight"):
            sd[f"{name}.weight"] = mod.parametrizations.weight.original
    out = {}
    for k, v in sd.items():
        v = v.detach().float().cpu()
        if grouped and v.dim() == 2:
            out.update(pack(k, v, bits.get(k, embed_bits)))
        else:
            out[k] = v.to(torch.bfloat16).contiguous()
    return out


def save_draft(model, out: str, embed_bits: int) -> dict:
    """The saved draft's weights (`draft_state`), written as byte parts below 16 MiB (atomic renames)."""
    from safetensors.torch import save

    blob = save(draft_state(model, embed_bits), metadata={"format": "pt"})
    n = math.ceil(len(blob) / PART_BYTES)
    for i in range(n):
        tmp = os.path.join(out, f".tmp.part{i}")
        with open(tmp, "wb") as f:
            f.write(blob[i * PART_BYTES:(i + 1) * PART_BYTES])
        os.replace(tmp, os.path.join(out, f"draft.safetensors.part{i}"))
    return {"bytes": len(blob), "parts": n, "sha256": hashlib.sha256(blob).hexdigest()}


@torch.no_grad()
def evaluate(models: dict, windows: torch.Tensor, device, bounds=(512, 2048, 4096, 8192)) -> dict:
    """Per-book perplexity (first 4k and full window), NLL by position bucket, and the
    teacher-forced top-1 agreement of each draft with the target ('target' key, if present)."""
    res = {name: {"nll4k": [], "nll_full": [], "bucket_nll": [], "agree4k": [], "agree_full": [],
                  "bucket_agree": [], "spec_proxy": []} for name in models}
    n_books, L = windows.shape
    edges = [0] + [b for b in bounds if b <= L]
    for i in range(n_books):
        x = windows[i:i + 1].to(device)  # [1, L]
        inp, lab = x[:, :-1], x[0, 1:]
        preds = {}
        for name, m in models.items():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logits = draft_logits(m, inp)[0].float()  # [L-1, V]
            nll = F.cross_entropy(logits, lab, reduction="none")  # [L-1]
            preds[name] = logits.argmax(-1)
            r = res[name]
            r["nll4k"].append(nll[:min(4096, L) - 1].mean().item())
            r["nll_full"].append(nll.mean().item())
            r["bucket_nll"].append([nll[a:b - 1].mean().item() for a, b in zip(edges, edges[1:], strict=False)])
            del logits
        if "target" in preds:
            tgt = preds["target"]
            for name in models:
                if name == "target":
                    continue
                match = (preds[name] == tgt)
                r = res[name]
                r["agree4k"].append(match[:min(4096, L) - 1].float().mean().item())
                r["agree_full"].append(match.float().mean().item())
                r["bucket_agree"].append([match[a:b - 1].float().mean().item()
                                          for a, b in zip(edges, edges[1:], strict=False)])
                r["spec_proxy"].append(spec_proxy(match.cpu().tolist()))
    out = {}
    for name, r in res.items():
        o = {"ppl4k_mean": math.exp(float(np.mean(r["nll4k"]))),
             "ppl_full_mean": math.exp(float(np.mean(r["nll_full"]))),
             "ppl4k_per_book": [math.exp(v) for v in r["nll4k"]],
             "ppl_full_per_book": [math.exp(v) for v in r["nll_full"]],
             "bucket_edges": edges,
             "bucket_ppl": [math.exp(v) for v in np.mean(r["bucket_nll"], 0).tolist()]}
        if r["agree4k"]:
            o["top1_agreement_4k"] = float(np.mean(r["agree4k"]))
            o["top1_agreement_full"] = float(np.mean(r["agree_full"]))
            o["bucket_top1_agreement"] = np.mean(r["bucket_agree"], 0).tolist()
            o["spec_proxy_accepted_per_step_gamma4"] = float(np.mean(r["spec_proxy"]))
        out[name] = o
    return out


def spec_proxy(match: list[bool], gamma: int = 4) -> float:
    """Teacher-forced proxy of greedy speculative acceptance: walk the eval text, accept the run of
    draft/target top-1 matches (at most gamma) per step, skip the bonus position. Mean accepted."""
    t, acc, steps = 0, 0, 0
    while t + gamma < len(match):
        k = 0
        while k < gamma and match[t + k]:
            k += 1
        acc, steps, t = acc + k, steps + 1, t + k + 1
    return acc / max(steps, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=".carry/d*/train.bin", help="glob of uint16 token shards")
    ap.add_argument("--eval-bin", default=".carry/d3/eval.bin")
    ap.add_argument("--eval-len", type=int, default=8192)
    ap.add_argument("--eval-books", type=int, default=0, help="0 = all windows")
    ap.add_argument("--teacher-gguf", default=None, help="distil from this GGUF; CE only without")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4x512", help="layers x MLP width, comma separated")
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--init-layers", default="", help="drafts from these target layers (';' between drafts); "
                    "replaces --shapes, needs --teacher-gguf")
    ap.add_argument("--layer-bits", type=int, default=4, help="--init-layers drafts: bits of layer matrices")
    ap.add_argument("--embed-bits", type=int, default=6, help="--init-layers drafts: bits of the embedding")
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of optimisation")
    ap.add_argument("--max-steps", type=int, default=0, help="stop earlier (smoke tests)")
    ap.add_argument("--tokens-per-step", type=int, default=32768)
    ap.add_argument("--seq-short", type=int, default=2048)
    ap.add_argument("--seq-long", type=int, default=8192)
    ap.add_argument("--long-frac", type=float, default=0.3, help="final share of time at seq-long")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup-frac", type=float, default=0.03)
    ap.add_argument("--lr-floor", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--kl-weight", type=float, default=1.0)
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--no-pca-init", action="store_true")
    ap.add_argument("--ckpt-every", type=float, default=60.0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    data, shard_paths = load_stream(args.data, device)
    teacher = load_teacher(args.teacher_gguf, device) if args.teacher_gguf else None
    kl_w = args.kl_weight if teacher is not None else 0.0
    ce_w = args.ce_weight if teacher is not None else 1.0

    built = []
    if args.init_layers:
        if teacher is None:
            sys.exit("--init-layers needs --teacher-gguf")
        for layers in parse_init_layers(args.init_layers):
            built.append((f"draft_L{'-'.join(map(str, layers))}", draft_from_target(teacher, layers, args.layer_bits, args.embed_bits)))
    else:
        emb = pca_embedding(teacher, args.hidden) if teacher is not None and not args.no_pca_init else None
        for n_layers, mlp in parse_shapes(args.shapes):
            cfg = draft_config(n_layers=n_layers, hidden=args.hidden, intermediate=mlp)
            cfg._attn_implementation = "sdpa"
            m = LlamaForCausalLM(cfg).to(device)
            if emb is not None:
                with torch.no_grad():
                    m.get_input_embeddings().weight.copy_(emb)
            built.append((f"draft_{n_layers}x{mlp}", m))
    drafts, opts = {}, {}
    for name, m in built:
        assert m.lm_head.weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
        params = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
        decay = [p for n, p in params if p.dim() >= 2 and "embed" not in n]
        other = [p for n, p in params if not (p.dim() >= 2 and "embed" not in n)]
        opts[name] = torch.optim.AdamW(
            [{"params": decay, "weight_decay": args.weight_decay}, {"params": other, "weight_decay": 0.0}],
            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
        drafts[name] = m
        print(f"{name}: {sum(p.numel() for p in m.parameters()):,} params, "
              f"{sum(p.numel() for p in m.parameters() if p.requires_grad):,} trained", flush=True)
    main_name = next(iter(drafts))
    with open(os.path.join(args.out, "draft_config.json"), "w") as f:
        f.write(drafts[main_name].config.to_json_string())

    log = open(os.path.join(args.out, "train_log.jsonl"), "w")
    setup_s = time.time() - t_start
    print(f"setup {setup_s:.1f}s; training for {args.time_budget:.0f}s", flush=True)
    t0 = time.time()
    last_ckpt = t0
    step, tokens, phase_tokens, rec = 0, 0, {"short": 0, "long": 0}, {}
    n_data = data.numel()
    while True:
        el = time.time() - t0
        frac = el / args.time_budget
        if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
            break
        long_phase = frac >= 1.0 - args.long_frac
        T = args.seq_long if long_phase else args.seq_short
        B = max(1, args.tokens_per_step // T)
        starts = torch.randint(0, n_data - T - 1, (B,), device=device)
        idx = starts[:, None] + torch.arange(T + 1, device=device)[None]  # [B, T+1]
        xy = data[idx].long()
        x, y = xy[:, :-1], xy[:, 1:]  # [B, T]
        lr = lr_at(frac, args.lr, args.warmup_frac, args.lr_floor)
        t_logp = t_p = None
        ent = 0.0
        if teacher is not None:
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                t_logits = teacher(input_ids=x, use_cache=False).logits  # [B, T, V]
            t_logp = torch.log_softmax(t_logits.float().flatten(0, 1), -1)  # [N, V]
            del t_logits
            t_p = t_logp.exp()
            ent = -(t_p * t_logp).sum(-1).mean().item() if step % args.log_every == 0 else 0.0
        rec = {"step": step, "t": round(el, 2), "lr": lr, "seq": T, "batch": B, "tokens": tokens}
        for name, m in drafts.items():
            opt = opts[name]
            for g in opt.param_groups:
                g["lr"] = lr
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                z = draft_logits(m, x)  # [B, T, V]
            z = z.float().flatten(0, 1)  # [N, V]
            lse = torch.logsumexp(z, -1)  # [N]
            ce = (lse - z.gather(1, y.reshape(-1, 1))[:, 0]).mean()
            loss = ce_w * ce
            if t_p is not None:
                soft = (lse - (t_p * z).sum(-1)).mean()  # cross-entropy with the teacher's soft labels
                loss = loss + kl_w * soft
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_([p for p in m.parameters() if p.requires_grad], 1.0)
            opt.step()
            if step % args.log_every == 0:
                rec[name] = {"ce": round(ce.item(), 4), "gnorm": round(gn.item(), 3)}
                if t_p is not None:
                    rec[name]["kl"] = round(soft.item() - ent, 4)
            del z, lse, loss
        if step % args.log_every == 0:
            if t_p is not None:
                rec["teacher_entropy"] = round(ent, 4)
            rec["tok_per_s"] = round(tokens / max(el, 1e-6))
            if device.type == "cuda":
                rec["max_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), flush=True)
        del t_logp, t_p
        step += 1
        tokens += B * T
        phase_tokens["long" if long_phase else "short"] += B * T
        if time.time() - last_ckpt > args.ckpt_every:
            save_draft(drafts[main_name], args.out, args.embed_bits)
            last_ckpt = time.time()
    train_s = time.time() - t0
    saved = save_draft(drafts[main_name], args.out, args.embed_bits)
    print(f"trained {step} steps, {tokens:,} tokens in {train_s:.1f}s; saved {saved}", flush=True)

    t_ev = time.time()
    windows = torch.from_numpy(np.fromfile(args.eval_bin, dtype=np.uint16).astype(np.int64)).view(-1, args.eval_len)
    if args.eval_books:
        windows = windows[:args.eval_books]
    models = {name: m.to(torch.bfloat16).eval() for name, m in drafts.items()}
    if teacher is not None:
        models["target"] = teacher
    ev = evaluate(models, windows, device)
    eval_s = time.time() - t_ev
    for name, o in ev.items():
        print(name, {k: v for k, v in o.items() if "per_book" not in k}, flush=True)

    import transformers
    metrics = {
        "schema_version": 1,
        "command": " ".join(sys.argv),
        "args": vars(args),
        "mode": "distil (KL to target + CE)" if teacher is not None else "CE only (no teacher)",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "shards": shard_paths, "train_stream_tokens": int(n_data),
        "steps": step, "tokens_seen": tokens, "phase_tokens": phase_tokens,
        "setup_s": round(setup_s, 1), "train_s": round(train_s, 1), "eval_s": round(eval_s, 1),
        "saved": {"name": main_name, **saved},
        "params": {n: sum(p.numel() for p in m.parameters()) for n, m in drafts.items()},
        "eval": {"windows": int(windows.shape[0]), "window_len": args.eval_len, **ev},
        "final_train": rec,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"done in {time.time() - t_start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
