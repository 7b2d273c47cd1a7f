"""Probe: does a library setting make the target's cuBLAS linears faster at the loop's row counts?

The 7B verification pass spends ~3.9 ms of its ~5 ms in four cuBLAS GEMMs a layer (qkv + bias, wo,
gate|up, w2) at 80 rows (batch 16 x gamma + 1), reading weights at 3.1-3.7 TB/s against 4.28 TB/s
copy bandwidth (kernels/NOTES.md). Vanilla decoding runs the same GEMMs at 16 rows. Three settings,
each in its own process (a mode leaves global state behind):
  default   F.linear as the runtime calls it (cuBLAS's own heuristic)
  lt        torch.backends.cuda.preferred_blas_library("cublaslt")
  tunable   torch.cuda.tunable (TunableOp) tunes every shape on first use, then its choice runs
  bias      F.linear with a zero bias vector: torch sends a bf16 GEMM with a 1-D bias to cuBLASLt's
            gemm_and_bias (no global setting)
Timed as CUDA graphs over 28 layers of distinct weights (no L2 reuse between calls): one layer's four
linears, and each linear alone; bytes / time against the copy bandwidth measured in the same process.
`python probes/probe_verify_gemm.py [rows,...] [modes,...]` -> $OUT/probe-verify-gemm.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from dustin_eval.bench_attention import copy_bandwidth_tbps
from dustin_eval.timing import graph_ms
from dustin_runtime.presets import preset


def run_mode(mode: str, rows: list[int]) -> dict:
    if mode == "lt":
        torch.backends.cuda.preferred_blas_library("cublaslt")
    elif mode == "tunable":
        import torch.cuda.tunable as tun

        tun.enable(True)
        tun.tuning_enable(True)
        tun.set_max_tuning_duration(200)
        tun.set_filename(os.path.join(os.environ.get("OUT", "."), "tunableop-results%d.csv"))
    elif mode not in ("default", "bias"):
        raise SystemExit(f"unknown mode {mode}")
    c = preset("qwen2.5-7b")
    d, q, kv, inter = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    dev, dt = torch.device("cuda"), torch.bfloat16
    L = c.num_layers
    g = torch.Generator(device=dev).manual_seed(0)

    def w(n, k):
        return torch.randn(n, k, device=dev, dtype=dt, generator=g) * k ** -0.5

    layers = [{"qkv": w(q + 2 * kv, d), "qkv_b": torch.zeros(q + 2 * kv, device=dev, dtype=dt), "wo": w(d, q),
               "w13": w(2 * inter, d), "w2": w(d, inter)} for _ in range(L)]
    if mode == "bias":
        for p in layers:
            p.update({f"{k}_b": torch.zeros(p[k].shape[0], device=dev, dtype=dt) for k in ("wo", "w13", "w2")})
    bw = copy_bandwidth_tbps()["tbps"]
    out = {"mode": mode, "copy_tbps": bw, "rows": {}}
    for M in rows:
        x = torch.randn(M, d, device=dev, dtype=dt, generator=g)
        xi = torch.randn(M, inter, device=dev, dtype=dt, generator=g)
        calls = {
            "qkv": lambda p, x=x: F.linear(x, p["qkv"], p["qkv_b"]),
            "wo": lambda p, x=x: F.linear(x, p["wo"], p.get("wo_b")),
            "w13": lambda p, x=x: F.linear(x, p["w13"], p.get("w13_b")),
            "w2": lambda p, xi=xi: F.linear(xi, p["w2"], p.get("w2_b")),
        }
        if mode == "tunable":  # tune every shape before any capture
            for f in calls.values():
                f(layers[0])
            torch.cuda.synchronize()
            torch.cuda.tunable.tuning_enable(False)
        res = {}
        for name, f in calls.items():
            ms = graph_ms([lambda p=p, f=f: f(p) for p in layers])["median_ms"]
            nbytes = layers[0][name].numel() * 2
            res[name] = {"us": ms * 1e3, "tbps": nbytes / ms / 1e9, "of_copy": nbytes / ms / 1e9 / bw}
        layer = graph_ms([lambda p=p, fs=tuple(calls.values()): [f(p) for f in fs] for p in layers])["median_ms"]
        nbytes = sum(layers[0][k].numel() * 2 for k in calls)
        res["layer"] = {"us": layer * 1e3, "tbps": nbytes / layer / 1e9, "floor_us": nbytes / bw / 1e6,
                        "x28_ms": layer * L}
        out["rows"][M] = res
        print(f"{mode:8s} M={M:3d} " + "  ".join(f"{k} {v['us']:.1f} us ({v['tbps']:.2f} TB/s)" for k, v in res.items()),
              flush=True)
    if mode == "tunable":
        out["tunable_results"] = [list(map(str, r)) for r in torch.cuda.tunable.get_results()]
    return out


def main() -> None:
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "16,80").split(",")]
    modes = (sys.argv[2] if len(sys.argv) > 2 else "default,lt,tunable").split(",")
    if os.environ.get("PROBE_MODE"):
        print("RESULT " + json.dumps(run_mode(os.environ["PROBE_MODE"], rows)), flush=True)
        return
    results = []
    for m in modes:  # one process per mode
        p = subprocess.run([sys.executable, __file__, ",".join(map(str, rows))], env={**os.environ, "PROBE_MODE": m},
                           capture_output=True, text=True, timeout=400)
        sys.stdout.write(p.stdout.replace("RESULT ", "", 0))
        sys.stderr.write(p.stderr[-3000:])
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        results.append(json.loads(line[7:]) if line else {"mode": m, "error": p.stderr[-2000:]})
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "commit": os.environ.get("DUSTIN_GIT_COMMIT")}
    path = os.path.join(os.environ.get("OUT", "."), "probe-verify-gemm.json")
    with open(path, "w") as f:
        json.dump({**info, "results": results}, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
