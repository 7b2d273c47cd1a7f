"""Where a dustin verification step's time goes on the GPU: the step of `probes/bench_decode.py`
(Qwen2.5-7B shape, random weights, batch 16, 32k, S 512, 4 SRH KV heads) captured in a CUDA graph,
replayed under the torch profiler; prints the kernels by total GPU time.

    python probes/profile_dustin_verify.py [config] [batch] [context]
"""

import sys

import torch
from bench_decode import fill_cache, sparse_verify_step
from torch.profiler import ProfilerActivity, profile

from dustin_runtime.loader import random_model
from dustin_runtime.presets import default_draft, preset


def main(config: str = "qwen2.5-7b", batch: str = "16", context: str = "32768") -> None:
    B, L, gamma = int(batch), int(context), 4
    tcfg, dcfg = preset(config), preset(default_draft(config))
    model = random_model(tcfg, dtype=torch.bfloat16, device="cuda").use_kernels()
    draft = random_model(dcfg, dtype=torch.bfloat16, device="cuda")
    cache = fill_cache(model, B, L, gamma + 2)
    tok = torch.randint(0, tcfg.vocab_size, (B, gamma + 1), device="cuda")
    step, _ = sparse_verify_step(model, draft, cache, tok, budget=512, srh=4, gamma=gamma)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main(*sys.argv[1:])
