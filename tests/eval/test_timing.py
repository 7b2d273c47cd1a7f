"""The CUDA timers of the benchmarks: what graph and event timings report."""

import pytest
import torch


@pytest.mark.gpu
def test_graph_and_event_timers():
    from dustin_eval.timing import events_ms, graph_ms

    x = torch.randn(1 << 24, device="cuda")
    y = torch.empty_like(x)
    one = graph_ms([lambda: y.copy_(x)], replays=5)
    eight = graph_ms([lambda: y.copy_(x)] * 8, replays=5)
    assert one["calls_per_graph"] == 1 and eight["calls_per_graph"] == 8 and eight["replays"] <= 5
    assert 0 < one["min_ms"] <= one["median_ms"] <= one["max_ms"]
    ev = events_ms(lambda: y.copy_(x), 5, warmup=2)
    assert ev["reps"] == 5 and ev["median_ms"] > 0
