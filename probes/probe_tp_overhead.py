"""What the tensor-parallel code path costs on one GPU: `dustin bench e2e`'s loop (random weights at a
preset shape, replayed acceptance, CUDA graphs) run twice in one process, without a process group
and as rank 0 of a world of 1 under NCCL (all-reduces, vocabulary-parallel argmax and embedding,
the batch-parallel draft's gathers: every collective of a step, on one rank). Per policy: the loop's
ms per step and the sum of its phase graphs replayed alone (`dustin_eval.timing` via
`bench_e2e.time_phases`), and the overhead of the TP path (target: <= 3% per decode step).

    python probes/probe_tp_overhead.py OUT.json [config] [batch] [context]
    (or under `torchrun --nproc-per-node 1`; defaults: qwen2.5-7b 16 32768)

Needs a CUDA GPU with room for two copies of the model and caches (7B at 16 x 32k: ~45 GB)."""

from __future__ import annotations

import json
import os
import socket
import sys

import torch


def join_world_of_one():
    """Rank 0 of 1 under NCCL, as torchrun would start it (its variables set here when absent)."""
    from dustin_runtime import tp

    if not tp.launched():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    return tp.start(1, "cuda")


def main() -> None:
    from dustin_eval import bench_e2e as be
    from dustin_runtime.io.files import atomic_write

    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), "probe-tp-overhead.json")
    config = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-7b"
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    context = int(sys.argv[4]) if len(sys.argv) > 4 else 32768
    group = join_world_of_one()
    command = "python " + " ".join(sys.argv)
    cfg = be.E2EConfig(target=config, batch=batch, context=context, policies=("ar", "full", "dustin"), alphas=(),
                       new_tokens=32, phase_reps=50)
    runs = {}
    for mode, tp in (("no_process_group", None), ("tp_world_1", group)):
        res = be.run_e2e(cfg, command, tp=tp)
        runs[mode] = res
        torch.cuda.empty_cache()
    rows = []
    for a, b in zip(runs["no_process_group"]["records"], runs["tp_world_1"]["records"], strict=True):
        row = {"policy": a["policy"],
               "ms_per_step": [a["ms_per_step"], b["ms_per_step"]],
               "graph_phase_sum_ms": [a["graph_phase_sum_ms"], b["graph_phase_sum_ms"]],
               "graph_phase_ms": [a["graph_phase_ms"], b["graph_phase_ms"]],
               "overhead_graph_sum": b["graph_phase_sum_ms"] / a["graph_phase_sum_ms"] - 1,
               "overhead_ms_per_step": b["ms_per_step"] / a["ms_per_step"] - 1,
               "collectives_world_1": b.get("tp")}
        rows.append(row)
        print(f"{row['policy']:>8}: graph sum {a['graph_phase_sum_ms']:.3f} -> {b['graph_phase_sum_ms']:.3f} ms "
              f"({row['overhead_graph_sum']:+.2%}), loop {a['ms_per_step']:.3f} -> {b['ms_per_step']:.3f} ms/step "
              f"({row['overhead_ms_per_step']:+.2%})")
    env = runs["tp_world_1"]["environment"]
    atomic_write(out, json.dumps({"probe": "tp_overhead", "config": config, "batch": batch, "context": context,
                                  "target_overhead": 0.03, "rows": rows, "environment": env,
                                  "runs": runs}, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    from dustin_runtime.tp import finish

    finish()


if __name__ == "__main__":
    main()
