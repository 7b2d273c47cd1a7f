"""Probe: the kernels of each phase graph (draft, select, verify, accept) of `dustin bench e2e`'s loop,
per policy, replayed under the torch profiler (random weights at the preset shapes; the state a
step changes is restored before every replay, its copies show as Memcpy rows).

    python probes/profile_e2e_phases.py [policies] [batch] [context]   (policies comma-separated)"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from dustin_eval.bench_e2e import (
    E2EConfig,
    _run,
    cache_capacity,
    load_pair,
    replay_counts,
    sparse_config,
)
from dustin_runtime.engine import Engine


@torch.inference_mode()
def main(policies: str = "dustin-vs,streamingllm-vs", batch: str = "16", context: str = "32768") -> None:
    cfg = E2EConfig(batch=int(batch), context=int(context), policies=tuple(policies.split(",")), new_tokens=32)
    pair = load_pair(cfg)
    scfg = sparse_config(cfg, pair)
    eng = Engine(pair.target, pair.draft, graphs=True)
    tc, dc = eng.caches(cfg.batch, cache_capacity(pair.prompts, [cfg.new_tokens] * cfg.batch, cfg.gamma), draft=True)
    for t in tc.k + tc.v + dc.k + dc.v:
        t.normal_()
    counts = replay_counts(cfg.acceptance, cfg.gamma, cfg.new_tokens + 1, cfg.batch, cfg.seed)
    for policy in cfg.policies:
        for _ in range(2):
            _run(pair, eng, policy, cfg, scfg, counts)
        st = eng.last
        restore = st.snapshot()
        for name, graph in st.graphs.graphs.items():
            for _ in range(3):
                restore()
                graph.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    restore()
                    graph.replay()
                torch.cuda.synchronize()
            print(f"\n## {policy} / {name} (5 replays)")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
        restore()


if __name__ == "__main__":
    main(*sys.argv[1:])
