"""Probe (was `dustin bench decode`, dropped as redundant with `dustin bench e2e`): one step of each
decoding phase of our runtime on the GPU, at a real model shape with random weights (timings do not depend on values), next to its byte or FLOP floor.

Phases: target decode step (1 token per sequence), target verification step (gamma + 1 tokens),
the same verification step with dustin's sparse verification (selection from the target history
of `srh` retrieval KV heads, their scoring inside the pass, S-row attention), draft step (1 token),
prefill chunk (one sequence, `chunk` tokens at the end of the context).
Decode-type steps run as CUDA graphs (as the runtime would replay them), timed over many replays
after warm-up; the floor is (weights + KV bytes read) / copy bandwidth measured in the same run.
Optionally Hugging Face transformers (StaticCache, SDPA) is timed on the same shapes in the same
process as the baseline.

    python probes/bench_decode.py [config] [batch] [context] [hf]  -> $OUT/decode-<config>-<context>-<batch>.json"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dustin_eval.bench_attention import copy_bandwidth_tbps
from dustin_eval.bench_e2e import srh_heads
from dustin_eval.timing import events_ms, graph_ms
from dustin_runtime.attention import TritonAttention
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import atomic_write
from dustin_runtime.io.provenance import environment
from dustin_runtime.loader import random_model
from dustin_runtime.model import Transformer
from dustin_runtime.presets import default_draft, preset


@dataclass(frozen=True)
class DecodeBenchConfig:
    """What to time."""

    config: str = "qwen2.5-7b"
    draft: str | None = None  # default: the usual draft of `config`
    batch: int = 16
    context: int = 32768
    gamma: int = 4
    prefill_chunk: int = 2048
    replays: int = 30
    hf_baseline: bool = False
    budget: int = 512  # the sparse verification step's S
    srh: int = 4  # retrieval KV heads of that step, spread over 2 layers


def sparse_verify_step(model: Transformer, draft: Transformer, cache, tokens: torch.Tensor, *, budget: int, srh: int,
                       gamma: int, sinks: int = 4, window: int = 64,
                       backend=None) -> tuple[Callable[[], torch.Tensor], int]:
    """One dustin verification step as a function (the retrieval heads' scoring of the last pass's
    queries, the set selected from that history, then the target pass over the M = gamma + 1 tokens in
    `tokens` [B, M] with sparse attention), and the bytes it must read at least: weights, the selected K/V rows
    and the retrieval heads' keys."""
    from dustin_runtime.attention import TorchAttention
    from dustin_runtime.sparse.config import SparseConfig
    from dustin_runtime.sparse.policies import make_policy

    scfg = SparseConfig(budget=budget, sinks=sinks, window=window, target_heads=srh_heads(model.cfg, srh),
                        source="bench")
    policy = make_policy("dustin", scfg, target=model, draft=draft)
    dcache = draft.allocate_cache(cache.batch, 8)  # unused by a target-signal-only set
    policy.setup(cache, dcache, gamma)
    default = backend or (TritonAttention() if model.device.type == "cuda" else TorchAttention())
    be = policy.target_backend(default)

    def step():
        policy.before_draft()  # the last pass's history, where the loop scores it while drafting
        policy.drafted(tokens)
        policy.before_verify()
        return model(tokens, cache, be, phase="verify")

    B, c = cache.batch, model.cfg
    rows = min(budget, int(cache.lengths.max())) + gamma + 1
    kv_row = c.kv_bytes_per_token(2) // c.num_layers  # one row of K and V, one layer, bf16
    floor = _weights_bytes(model) + B * rows * c.num_layers * kv_row + B * srh * int(cache.lengths.max()) * c.head_dim * 2
    return step, floor


def _graph_step(fn: Callable[[], object], replays: int) -> dict:
    """Replays of `fn` captured in a CUDA graph (3 warm-up calls first), and its eager time."""
    out = graph_ms([fn], replays=replays, budget_ms=None, warmup=3)
    out["eager_ms"] = events_ms(fn, max(3, replays // 5))["median_ms"]
    return out


def fill_cache(model: Transformer, batch: int, context: int, extra: int):
    cache = model.allocate_cache(batch, context + extra)
    g = torch.Generator(device="cuda").manual_seed(1)
    for t in cache.k + cache.v:
        t.normal_(0.0, 1.0, generator=g)
    cache.lengths.fill_(context)
    return cache


def _weights_bytes(model: Transformer) -> int:
    return model.weight_bytes_read()


def _record(name: str, timing: dict, floor_bytes: int | None, copy_tbps: float, flops: float | None = None,
            matmul_tflops: float | None = None) -> dict:
    rec = {"phase": name, **timing}
    if floor_bytes is not None:
        floor = floor_bytes / (copy_tbps * 1e12) * 1e3
        rec.update(bytes=floor_bytes, floor_ms=floor, fraction_of_floor=floor / timing["median_ms"],
                   tbps=floor_bytes / (timing["median_ms"] * 1e-3) / 1e12)
    if flops is not None:
        floor = flops / (matmul_tflops * 1e12) * 1e3
        rec.update(flops=flops, floor_ms=floor, fraction_of_floor=floor / timing["median_ms"],
                   tflops=flops / (timing["median_ms"] * 1e-3) / 1e12)
    return rec


def matmul_tflops(n: int = 8192) -> float:
    """bf16 n x n x n matrix product rate on random data (median of events)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = events_ms(lambda: a @ b, 10, warmup=3)["median_ms"]
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _time_model_steps(cfg: DecodeBenchConfig, name: str, model_cfg, copy_tbps: float, *, verify: bool) -> list[dict]:
    model = random_model(model_cfg, dtype=torch.bfloat16, device="cuda").use_kernels()
    cache = fill_cache(model, cfg.batch, cfg.context, cfg.gamma + 2)
    backend = TritonAttention()
    w = _weights_bytes(model)
    kv = cfg.batch * cfg.context * model_cfg.kv_bytes_per_token(2)
    recs = []
    tok1 = torch.randint(0, model_cfg.vocab_size, (cfg.batch, 1), device="cuda")
    t = _graph_step(lambda: model(tok1, cache, backend, phase="decode"), cfg.replays)
    recs.append(_record(f"{name} decode step (1 token)", t, w + kv, copy_tbps))
    if verify:
        tokv = torch.randint(0, model_cfg.vocab_size, (cfg.batch, cfg.gamma + 1), device="cuda")
        t = _graph_step(lambda: model(tokv, cache, backend, phase="verify"), cfg.replays)
        recs.append(_record(f"{name} verify step ({cfg.gamma + 1} tokens)", t, w + kv, copy_tbps))
    return recs


def _time_sparse_verify(cfg: DecodeBenchConfig, model_cfg, draft_cfg, copy_tbps: float) -> list[dict]:
    model = random_model(model_cfg, dtype=torch.bfloat16, device="cuda").use_kernels()
    draft = random_model(draft_cfg, dtype=torch.bfloat16, device="cuda")
    cache = fill_cache(model, cfg.batch, cfg.context, cfg.gamma + 2)
    tokv = torch.randint(0, model_cfg.vocab_size, (cfg.batch, cfg.gamma + 1), device="cuda")
    step, floor = sparse_verify_step(model, draft, cache, tokv, budget=cfg.budget, srh=cfg.srh, gamma=cfg.gamma)
    t = _graph_step(step, cfg.replays)
    name = f"target dustin verify step ({cfg.gamma + 1} tokens, S = {cfg.budget}, {cfg.srh} SRH KV heads)"
    return [_record(name, t, floor, copy_tbps)]


def _time_prefill(cfg: DecodeBenchConfig, model_cfg, tflops: float) -> dict:
    model = random_model(model_cfg, dtype=torch.bfloat16, device="cuda").use_kernels()
    cache = fill_cache(model, 1, cfg.context - cfg.prefill_chunk, cfg.prefill_chunk + 2)
    backend = TritonAttention()
    c = cfg.prefill_chunk
    tok = torch.randint(0, model_cfg.vocab_size, (1, c), device="cuda")
    start = cfg.context - c

    def step():
        cache.lengths.fill_(start)
        model(tok, cache, backend, phase="prefill", logits="none", kv_len=cfg.context)

    t = events_ms(step, 5, warmup=2)
    params = model_cfg.num_params() - model_cfg.vocab_size * model_cfg.hidden_size  # no LM head in prefill
    attn = 4 * model_cfg.num_layers * model_cfg.num_heads * model_cfg.head_dim * c * (start + c / 2)
    rec = _record(f"target prefill chunk ({c} tokens at {start})", t, None, 0.0, 2 * params * c + attn, tflops)
    rec["tokens_per_s"] = c / (t["median_ms"] * 1e-3)
    return rec


def _time_hf(cfg: DecodeBenchConfig, model_cfg, copy_tbps: float) -> dict:
    """Hugging Face transformers, random weights, StaticCache filled to `context`, SDPA, eager."""
    from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

    hf_cfg = AutoConfig.for_model(
        model_cfg.arch, vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size, num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
        max_position_embeddings=max(model_cfg.max_position_embeddings, cfg.context + 8),
        tie_word_embeddings=model_cfg.tie_word_embeddings, attn_implementation="sdpa",
    )
    with torch.device("cuda"):
        hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16).eval()
    cache = StaticCache(config=hf_cfg, max_cache_len=cfg.context + 8)
    ids = torch.randint(0, model_cfg.vocab_size, (cfg.batch, 1), device="cuda")
    pos = torch.tensor([cfg.context], device="cuda")
    with torch.inference_mode():
        hf(ids, past_key_values=cache, cache_position=pos, use_cache=True)  # allocates the layers
        for layer in cache.layers:
            layer.keys.normal_()
            layer.values.normal_()

        def step():
            hf(ids, past_key_values=cache, cache_position=pos, use_cache=True)

        t = events_ms(step, 5, warmup=1)
    w = sum(p.numel() * p.element_size() for p in hf.parameters())
    kv = cfg.batch * cfg.context * model_cfg.kv_bytes_per_token(2)
    return _record("transformers decode step (StaticCache, SDPA, eager)", t, w + kv, copy_tbps)


def run_decode_bench(cfg: DecodeBenchConfig, command: str) -> dict:
    """Time every phase; returns the result record (also what gets written as JSON)."""
    if not torch.cuda.is_available():
        raise DustinError("probes/bench_decode.py needs a CUDA GPU")
    tcfg = preset(cfg.config)
    dname = cfg.draft or default_draft(cfg.config)
    dcfg = preset(dname)
    if dcfg.vocab_size != tcfg.vocab_size and dcfg.arch != tcfg.arch:
        raise DustinError(f"draft shape {dname} does not fit target shape {cfg.config}")
    copy = copy_bandwidth_tbps()
    tflops = matmul_tflops()
    phases = [
        lambda: _time_model_steps(cfg, "target", tcfg, copy["tbps"], verify=True),
        lambda: _time_sparse_verify(cfg, tcfg, dcfg, copy["tbps"]),
        lambda: _time_model_steps(cfg, "draft", dcfg, copy["tbps"], verify=False),
        lambda: [_time_prefill(cfg, tcfg, tflops)],
    ]
    if cfg.hf_baseline:
        phases.append(lambda: [_time_hf(cfg, tcfg, copy["tbps"])])
    records = []
    for phase in phases:  # each phase frees its model and cache before the next allocates
        records += phase()
        gc.collect()
        torch.cuda.empty_cache()
    records[2]["speedup_vs_full_verify"] = records[1]["median_ms"] / records[2]["median_ms"]
    if cfg.hf_baseline:
        ours = records[0]["median_ms"]
        records[-1]["ours_speedup"] = records[-1]["median_ms"] / ours
    return {
        "benchmark": "decode",
        "config": asdict(cfg) | {"draft": dname},
        "models": {"target": {"shape": cfg.config, "id": tcfg.name, "params": tcfg.num_params()},
                   "draft": {"shape": dname, "id": dcfg.name, "params": dcfg.num_params()},
                   "weights": "random (N(0, 0.02)), bf16"},
        "copy_tbps": copy["tbps"],
        "matmul_tflops": tflops,
        "records": records,
        "environment": environment(command),
    }


def result_path(out_dir: Path, cfg: DecodeBenchConfig) -> Path:
    return Path(out_dir) / f"decode-{cfg.config}-{cfg.context}-{cfg.batch}.json"


def write_result(res: dict, out_dir: Path, cfg: DecodeBenchConfig) -> Path:
    return atomic_write(result_path(out_dir, cfg), json.dumps(res, indent=2))


if __name__ == "__main__":
    args = sys.argv[1:]
    cfg = DecodeBenchConfig(config=args[0] if args else "qwen2.5-7b", batch=int(args[1]) if len(args) > 1 else 16,
                            context=int(args[2]) if len(args) > 2 else 32768, hf_baseline=len(args) > 3)
    res = run_decode_bench(cfg, "python probes/bench_decode.py " + " ".join(args))
    print(write_result(res, Path(os.environ.get("OUT", ".")), cfg))
