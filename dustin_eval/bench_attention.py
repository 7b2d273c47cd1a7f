"""`dustin bench attention`: verification-attention kernels against the copy bandwidth and SDPA.

Per (model shape, context, batch, budget) it times, in one process on one GPU:
- the copy bandwidth (device-to-device copy, bytes read + written);
- full-cache attention: ours (`full_verify_attention`) and every PyTorch SDPA backend that
  accepts the shape (enable_gqa where the backend takes it, else K/V expanded to H heads);
- sparse attention over a budget-sized index set (`sparse_verify_attention`, [B, S] and [B, G, S]);
- the estimator: `srh_scores` on one layer, `select_indices` vs `torch.topk`, and one estimate
  step (`estimate_set`: SRH scoring of 4 KV heads over 2 layers, accumulated, then select), next
  to the cost model `estimate_cost_ms`; with `refresh_layers`
  > 0, dustin's refresh layers (`refresh_step` each: `srh_scores` of every KV head of one layer,
  normalised, then `select_indices` on that one signal, as the verification pass re-selects).
Each kernel is timed per layer inside a CUDA graph of many calls over distinct buffers (no launch
gaps, no L2 reuse between calls, as a decode step runs) and with plain `triton.testing.do_bench`.
GPU-only imports stay inside the functions, so CPU code may import this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dustin_eval.timing import do_bench_ms, graph_ms
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import atomic_write
from dustin_runtime.io.provenance import environment
from dustin_runtime.presets import preset

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class AttnShape:
    """Per-layer attention shape of a model: query heads, KV heads, head dim, layer count."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    layers: int


def attention_shape(name: str) -> AttnShape:
    """The attention shape of a named model shape of `dustin_runtime.presets` (aliases accepted)."""
    c = preset(name)
    return AttnShape(name, c.num_heads, c.num_kv_heads, c.head_dim, c.num_layers)


@dataclass(frozen=True)
class BenchConfig:
    shape: str
    context: int
    batch: int
    budget: int
    gamma: int = 4  # draft tokens; M = gamma + 1 verification queries
    sinks: int = 4  # the product's defaults (`sparse.config`), and bench e2e's m: random weights have no profile
    window: int = 64
    m: int = 112  # top-m by the first score; the rest of the budget by the second
    srh_layers: int = 2  # the estimate: SRH scoring over this many layers ...
    srh_kv_heads_per_layer: int = 2  # ... of this many KV heads each (4 KV heads in all)
    refresh_layers: int = 0  # dustin's refresh layers: each scores every KV head of its layer, then selects
    mem_budget_gb: float = 56.0  # distinct KV buffers for the graph timings
    sdpa: bool = True


def parse_list(text: str, kind=int) -> list:
    """'8192,16384' -> [8192, 16384]; one clear error on junk."""
    try:
        return [kind(x) for x in str(text).split(",") if x.strip()]
    except ValueError as e:
        raise DustinError(f"bad list {text!r}: {e}") from None


def record(kernel: str, calls: list[Callable[[], object]], bytes_: int, copy_tbps: float, *, graph: bool = True,
           **extra) -> dict:
    """One kernel's record: per-call graph time of `calls` (`timing.graph_ms`), `do_bench` time of
    one call, TB/s of `bytes_` and its share of the copy bandwidth; or the error that stopped it."""
    rec = {"kernel": kernel, "bytes": int(bytes_)}
    try:
        if graph:
            rec.update(graph_ms(calls))
        rec["do_bench_ms"] = do_bench_ms(calls[0])
        if not graph:
            rec["median_ms"] = rec["do_bench_ms"]
        rec["tbps"] = bytes_ / (rec["median_ms"] * 1e-3) / 1e12
        rec["bandwidth_fraction"] = rec["tbps"] / copy_tbps
    except Exception as e:  # a backend that rejects the shape or capture: record why
        rec.update({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
        torch.cuda.synchronize()
    rec.update(extra)
    return rec


def copy_bandwidth_tbps(nbytes: int = 4 << 30) -> dict:
    """Device-to-device copy of nbytes: bytes read + written over the median time."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench_ms(lambda: dst.copy_(src))
    tbps = 2 * nbytes / (ms * 1e-3) / 1e12
    return {"kernel": "copy", "bytes": 2 * nbytes, "median_ms": ms, "do_bench_ms": ms, "tbps": tbps, "bandwidth_fraction": 1.0}


def verify_buffers(B: int, H: int, G: int, D: int, N: int, M: int, n_buf: int, dt, dev) -> tuple:
    """n_buf distinct (K cache, V cache, q, out) sets of one layer ([B, G, N + M, D] caches of
    N(0, 1), [B, H, M, D] q and out) and lens [B] = N: distinct buffers so timed calls miss L2."""
    ks = [torch.empty(B, G, N + M, D, dtype=dt, device=dev).normal_() for _ in range(n_buf)]
    vs = [torch.empty(B, G, N + M, D, dtype=dt, device=dev).normal_() for _ in range(n_buf)]
    qs = [torch.randn(B, H, M, D, dtype=dt, device=dev) for _ in range(n_buf)]
    outs = [torch.empty(B, H, M, D, dtype=dt, device=dev) for _ in range(n_buf)]
    return ks, vs, qs, outs, torch.full((B,), N, dtype=torch.int32, device=dev)


def random_index_sets(B: int, N: int, S: int, n: int, dev) -> list[torch.Tensor]:
    """n sorted random [B, S] int32 sets of distinct rows < N (as select_indices returns them)."""
    return [torch.sort(torch.rand(B, N, device=dev).topk(S, dim=1).indices, dim=1).values.to(torch.int32)
            for _ in range(n)]


def estimate_set(q: list[torch.Tensor], kv_heads: list[torch.Tensor], keys: list[torch.Tensor],
                   lens: torch.Tensor, scores: torch.Tensor, secondary: torch.Tensor, out: torch.Tensor,
                   **sel_kw) -> torch.Tensor:
    """The set's estimate + select as the runtime runs it: `srh_scores` of its retrieval
    heads, one call per layer (q[i] [B, h_i, r * M, D] over keys[i] [B, G, N_max, D], KV heads
    kv_heads[i] [h_i]) accumulated into scores [B, N_max], then `select_indices` with the
    secondary signal [B, N_max] into out [B, S]."""
    from dustin_kernels import select_indices, srh_scores

    for i, (qi, hi, ki) in enumerate(zip(q, kv_heads, keys, strict=True)):
        srh_scores(qi, hi, ki, lens, out=scores, accumulate=i > 0)
    return select_indices(scores, secondary, lens, out=out, **sel_kw)


def refresh_step(q: torch.Tensor, kv_heads: torch.Tensor, keys: torch.Tensor, lens: torch.Tensor,
                 scores: torch.Tensor, out: torch.Tensor, **sel_kw) -> torch.Tensor:
    """One refresh layer as the verification pass runs it: `srh_scores` of every KV head of the
    layer (q [B, G, r * M, D]: each KV head's query heads stacked, over keys [B, G, N_max, D]) into
    scores [B, N_max], normalised, then `select_indices` on that signal alone into out [B, S]."""
    from dustin_kernels import select_indices, srh_scores

    from dustin_runtime.sparse.signals import normalise_

    srh_scores(q, kv_heads, keys, lens, out=scores)
    return select_indices(normalise_(scores), None, lens, out=out, **sel_kw)


def estimate_cost_ms(selections: int, heads: int, per_layer: int, srh_ms: float, select_ms: float) -> float:
    """The estimate's cost model: each selection scores its heads (a `srh_scores` call reads its KV
    heads' keys, so its time scales with them: t_srh of `per_layer` heads per call) and selects
    once: selections x (heads / per_layer x t_srh + t_select)."""
    return selections * (heads / per_layer * srh_ms + select_ms)


def calls_per_graph(bytes_per_call: int, l2: int, lo: int = 12, hi: int = 256) -> int:
    """Enough calls per graph that the data they touch is 4x the L2."""
    return max(lo, min(hi, math.ceil(4 * l2 / max(1, bytes_per_call))))


def _sdpa_records(cfg, shp, qs, ks, vs, full_bytes, copy_tbps, mem_free) -> list[dict]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa_math", SDPBackend.MATH)]
    rep = shp.heads // shp.kv_heads
    recs = []
    for name, backend in backends:

        def call(i, backend=backend, gqa=True, kx=None, vx=None):
            with sdpa_kernel(backend):
                if gqa:
                    return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
                return F.scaled_dot_product_attention(qs[i], kx, vx)

        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qs[0], ks[0], vs[0], enable_gqa=True)
            torch.cuda.synchronize()
            calls = [lambda i=i: call(i) for i in range(len(ks))]
            recs.append(record(name, calls, full_bytes, copy_tbps, graph=name != "sdpa_math", gqa="enable_gqa",
                               mask="none (cost baseline)"))
            continue
        except Exception as e:  # noqa: BLE001 - the backend refuses enable_gqa: try expanded K/V
            gqa_error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            torch.cuda.synchronize()
        exp_bytes = 2 * ks[0].numel() * ks[0].element_size() * rep
        if rep > 1 and exp_bytes > 0.8 * mem_free():
            recs.append({"kernel": name, "error": f"enable_gqa refused ({gqa_error}); expanded K/V needs {exp_bytes / 1e9:.1f} GB"})
            continue
        kx = ks[0].repeat_interleave(rep, dim=1) if rep > 1 else ks[0]
        vx = vs[0].repeat_interleave(rep, dim=1) if rep > 1 else vs[0]
        rec = record(name, [lambda kx=kx, vx=vx, b=backend: call(0, b, False, kx, vx)], full_bytes, copy_tbps,
                     graph=True, gqa="expanded K/V (reads H/G times the bytes)", mask="none (cost baseline)",
                     gqa_error=gqa_error)
        recs.append(rec)
        del kx, vx
        torch.cuda.empty_cache()
    return recs


def run_attention_bench(cfg: BenchConfig, command: str) -> dict:
    """Time every kernel for one configuration; returns the result record (see module doc)."""
    from dustin_kernels import (
        full_verify_attention,
        full_verify_attention_ref,
        select_indices,
        sparse_verify_attention,
        sparse_verify_attention_ref,
        srh_scores,
    )
    from dustin_kernels.checks import rel_err

    shp = attention_shape(cfg.shape)
    if not torch.cuda.is_available():
        raise DustinError("dustin bench attention needs a CUDA GPU; on CPU, `make demo` checks correctness (the GPU "
                          "speeds measured are in RESULTS.md)")
    B, H, G, D, M, S = cfg.batch, shp.heads, shp.kv_heads, shp.head_dim, cfg.gamma + 1, cfg.budget
    N = cfg.context
    n_max = N + M  # the runtime writes the M new tokens' K/V into the cache first
    dt = torch.bfloat16
    dev = torch.device("cuda")
    env = environment(command)
    l2 = env["l2_bytes"] or (50 << 20)
    torch.manual_seed(0)
    torch.cuda.empty_cache()

    copy = copy_bandwidth_tbps()
    copy_tbps = copy["tbps"]

    layer_bytes = 2 * B * G * n_max * D * dt.itemsize
    n_buf = max(1, min(12, int(cfg.mem_budget_gb * 1e9 // layer_bytes)))
    ks, vs, qs, outs, lens = verify_buffers(B, H, G, D, N, M, n_buf, dt, dev)
    q_bytes = B * H * M * D * dt.itemsize
    full_bytes = layer_bytes + 2 * q_bytes  # K/V of context + new tokens, q in, out
    full_calls = [lambda i=i % n_buf: full_verify_attention(qs[i], ks[i], vs[i], lens, out=outs[i])
                  for i in range(calls_per_graph(layer_bytes, l2))]
    records = [copy, record("full_verify_attention", full_calls, full_bytes, copy_tbps, n_distinct_buffers=n_buf)]

    # sparse: a distinct random index set per call (sorted, as select_indices returns them)
    sel_bytes = 2 * B * G * (min(S, N) + M) * D * dt.itemsize
    sparse_bytes = sel_bytes + 2 * q_bytes + B * S * 4
    n_sparse = calls_per_graph(sel_bytes, l2)
    idx = random_index_sets(B, N, min(S, N), n_sparse, dev)
    idx_g = [torch.sort(torch.rand(B, G, N, device=dev).topk(min(S, N), dim=2).indices, dim=2).values.to(torch.int32)
             for _ in range(min(n_sparse, 64))]

    def sparse_calls(sets):
        return [lambda i=i: sparse_verify_attention(qs[i % n_buf], ks[i % n_buf], vs[i % n_buf], sets[i % len(sets)],
                                                    lens, out=outs[i % n_buf]) for i in range(n_sparse)]

    records.append(record("sparse_verify_attention", sparse_calls(idx), sparse_bytes, copy_tbps, index_form="[B, S]"))
    records.append(record("sparse_verify_attention_per_head", sparse_calls(idx_g), sparse_bytes, copy_tbps,
                          index_form="[B, G, S]"))

    # correctness gate on buffer 0 (bf16 vs fp32 reference)
    check = {
        "full_rel_err": rel_err(full_verify_attention(qs[0], ks[0], vs[0], lens),
                                full_verify_attention_ref(qs[0], ks[0], vs[0], lens)),
        "sparse_rel_err": rel_err(sparse_verify_attention(qs[0], ks[0], vs[0], idx[0], lens),
                                  sparse_verify_attention_ref(qs[0], ks[0], vs[0], idx[0], lens)),
    }

    # the estimator
    hs = cfg.srh_kv_heads_per_layer
    kv_heads = torch.tensor([(j * G) // hs for j in range(hs)], dtype=torch.int32, device=dev)  # spread over G
    # every query head of a retrieval KV head scores (as in the runtime): H / G heads x M queries
    # stacked per KV head, so the kernel reads each KV head's keys once for all of them
    q_srh = [torch.randn(B, hs, (H // G) * M, D, dtype=dt, device=dev) for _ in range(n_buf)]
    score_out = [torch.empty(B, n_max, dtype=torch.float32, device=dev) for _ in range(4)]
    srh_bytes = B * hs * N * D * dt.itemsize + B * n_max * 4  # keys once (the kernel reads them twice) + out
    n_srh = calls_per_graph(srh_bytes, l2, lo=12, hi=64)
    records.append(record(
        "srh_scores", [lambda i=i: srh_scores(q_srh[i % n_buf], kv_heads, ks[i % n_buf], lens,
                                              out=score_out[i % 4])
                       for i in range(n_srh)],
        srh_bytes, copy_tbps, heads=hs, queries_per_head=(H // G) * M, key_channels=D,
        note="all query heads of each KV head, stacked; bytes = keys once + output (pass 2 re-reads the keys; "
             "with few queries it reads stored fp16 probabilities instead)"))
    prim = [torch.rand(B, n_max, device=dev) for _ in range(8)]
    sec = [torch.rand(B, n_max, device=dev) for _ in range(8)]
    sel_out = [torch.empty(B, S, dtype=torch.int32, device=dev) for _ in range(8)]
    sel_kw = dict(budget=S, sinks=cfg.sinks, window=cfg.window, m=cfg.m)
    records.append(record(
        "select_indices", [lambda i=i: select_indices(prim[i % 8], sec[i % 8], lens, out=sel_out[i % 8], **sel_kw)
                           for i in range(24)],
        2 * B * n_max * 4 + B * S * 4, copy_tbps, note="scores are L2-resident in a decode step too"))
    records.append(record(
        "torch_topk", [lambda i=i: torch.topk(prim[i % 8], S, dim=1) for i in range(24)],
        B * n_max * 4, copy_tbps, note="one top-k only, unsorted indices; select does two plus the merge"))

    def estimate_step(i):
        """srh_scores of `hs` retrieval KV heads on each of `srh_layers` layers, then select; keys from
        distinct buffers."""
        bufs = [(i * cfg.srh_layers + c) % n_buf for c in range(cfg.srh_layers)]
        estimate_set([q_srh[b] for b in bufs], [kv_heads] * len(bufs), [ks[b] for b in bufs], lens,
                     score_out[i % 4], sec[i % 8], sel_out[i % 8], **sel_kw)

    n_est = max(6, n_srh // 2)
    records.append(record("estimate_step", [lambda i=i: estimate_step(i) for i in range(n_est)],
                          cfg.srh_layers * srh_bytes + 2 * B * n_max * 4, copy_tbps,
                          note=f"srh_scores on {cfg.srh_layers} layers x {hs} KV heads + select_indices"))

    if cfg.refresh_layers:
        Gr = G  # KV heads each refresh layer scores: every one
        q_all = [torch.randn(B, Gr, (H // G) * M, D, dtype=dt, device=dev) for _ in range(n_buf)]
        all_heads = torch.arange(0, G, G // Gr, dtype=torch.int32, device=dev)[:Gr]  # spread over G
        free_kw = dict(budget=S, sinks=cfg.sinks, window=cfg.window, m=S - cfg.sinks - cfg.window)

        def refresh(i):
            for j in range(cfg.refresh_layers):  # each refresh layer over its own keys
                b = (i * cfg.refresh_layers + j) % n_buf
                refresh_step(q_all[b], all_heads, ks[b], lens, score_out[(i + j) % 4], sel_out[(i + j) % 8],
                             **free_kw)

        records.append(record(
            "refresh_step", [lambda i=i: refresh(i) for i in range(max(3, n_est // 2))],
            cfg.refresh_layers * (Gr * B * N * D * dt.itemsize + 2 * B * n_max * 4), copy_tbps,
            note=f"{cfg.refresh_layers} refresh layers x (srh_scores of {Gr} of {G} KV heads + select_indices)"))

    if cfg.sdpa:
        mem_free = lambda: torch.cuda.mem_get_info()[0]  # noqa: E731
        records.extend(_sdpa_records(cfg, shp, qs, ks, vs, full_bytes, copy_tbps, mem_free))

    rec_by = {r["kernel"]: r for r in records if "median_ms" in r}
    full_kernels = [r for r in rec_by.values() if r["kernel"] == "full_verify_attention" or r["kernel"].startswith("sdpa_")]
    best_full = min(full_kernels, key=lambda r: r["median_ms"])
    sparse = rec_by["sparse_verify_attention"]
    est, sel, topk = rec_by.get("estimate_step"), rec_by.get("select_indices"), rec_by.get("torch_topk")
    srh, ref = rec_by.get("srh_scores"), rec_by.get("refresh_step")
    full_all = shp.layers * best_full["median_ms"]
    model = (lambda g, h: estimate_cost_ms(g, h, hs, srh["median_ms"], sel["median_ms"]) / full_all) if srh and sel \
        else (lambda g, h: None)
    summary = {
        "best_full_kernel": best_full["kernel"],
        "best_full_ms": best_full["median_ms"],
        "sparse_ms": sparse["median_ms"],
        "speedup_sparse_vs_best_full": best_full["median_ms"] / sparse["median_ms"],
        "speedup_sparse_vs_best_full_do_bench": best_full["do_bench_ms"] / sparse["do_bench_ms"],
        "full_bandwidth_fraction": rec_by["full_verify_attention"]["bandwidth_fraction"],
        "estimate_ms": est["median_ms"] if est else None,
        "estimate_select_fraction": est["median_ms"] / full_all if est else None,
        "estimate_model": "selections x (KV heads / KV heads per srh call x srh_scores + select_indices), "
                          "over layers x best full",
        "estimate_model_fraction": model(1, cfg.srh_layers * hs),
        "refresh_layers": cfg.refresh_layers,
        "refresh_ms": ref["median_ms"] if ref else None,
        "refresh_fraction": ref["median_ms"] / full_all if ref else None,
        "refresh_kv_heads": G if ref else None,
        "refresh_model_fraction": model(cfg.refresh_layers, G) if ref else None,
        "estimate_with_refresh_fraction": (est["median_ms"] + ref["median_ms"]) / full_all if est and ref else None,
        "select_vs_topk_speedup": topk["median_ms"] / sel["median_ms"] if sel and topk else None,
        "copy_tbps": copy_tbps,
        "floor_full_ms": full_bytes / (copy_tbps * 1e12) * 1e3,
        "floor_sparse_ms": sparse_bytes / (copy_tbps * 1e12) * 1e3,
        "byte_ratio": full_bytes / sparse_bytes,
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "attention",
        "config": asdict(cfg),
        "shapes": {"model": asdict(shp), "q": [B, H, M, D], "kv_cache_per_layer": [B, G, n_max, D],
                   "cache_lens": N, "indices": [B, S], "verification_queries": M},
        "dtype": "bfloat16",
        "environment": env,
        "timing": ("median_ms: per call inside one CUDA graph of calls_per_graph calls over distinct buffers "
                   "(median of `replays` replays; sdpa_math: do_bench only); do_bench_ms: triton.testing.do_bench "
                   "median of one call after an L2 flush, host launch overhead included"),
        "check": check,
        "records": records,
        "summary": summary,
    }


def result_path(out_dir: Path, cfg: BenchConfig) -> Path:
    refresh = f"-r{cfg.refresh_layers}" if cfg.refresh_layers else ""
    return Path(out_dir) / f"attention-{cfg.shape}-{cfg.context}-{cfg.batch}-{cfg.budget}{refresh}.json"


def run_sweep(configs: list[BenchConfig], out_dir: Path, command: str, on_result=None) -> list[dict]:
    """Run each configuration, write its JSON as soon as it is done, return all results."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for cfg in configs:
        res = run_attention_bench(cfg, command)
        atomic_write(result_path(out_dir, cfg), json.dumps(res, indent=1) + "\n")
        results.append(res)
        if on_result is not None:
            on_result(res)
        torch.cuda.empty_cache()
    return results
