"""CUDA timers of the benchmarks and probes: medians of CUDA-event timings, of eager calls and of
CUDA-graph replays, after a warm-up on a side stream (compilation, lazy allocations and library
handles happen before a capture). The decoding loop's per-phase timer is
`dustin_runtime.stats.PhaseTimer`. GPU only."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def warm_up(calls: Sequence[Callable[[], object]], times: int = 1) -> None:
    """Run every call `times` times on a side stream, then wait for the device."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def _summary(times: list[float]) -> dict:
    times = sorted(times)
    return {"median_ms": statistics.median(times), "min_ms": times[0], "max_ms": times[-1]}


def events_ms(fn: Callable[[], object], reps: int, warmup: int = 0,
              setup: Callable[[], object] | None = None) -> dict:
    """Median, min and max milliseconds of `reps` calls of fn, each between two CUDA events
    (`setup`, untimed, runs before each call: e.g. restoring the state a call changes)."""
    if warmup:
        warm_up([fn], warmup)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        if setup is not None:
            setup()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {**_summary(times), "reps": reps}


def graph_ms(calls: Sequence[Callable[[], object]], replays: int = 15, budget_ms: float | None = 300.0,
             warmup: int = 1) -> dict:
    """Per-call milliseconds of `calls` captured back to back in one CUDA graph: median, min and max
    over `replays` replays of (replay time / len(calls)). With `budget_ms`, fewer replays (at least
    3) when one replay is long. Many calls over distinct buffers time a kernel as a decode step runs
    it: no launch gaps, no L2 reuse between calls."""
    warm_up(calls, warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()  # the first replay warms up and measures
    end.record()
    end.synchronize()
    if budget_ms is not None:
        replays = max(3, min(replays, int(budget_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    del graph
    return {**_summary(times), "calls_per_graph": len(calls), "replays": replays}


def do_bench_ms(fn: Callable[[], object]) -> float:
    """`triton.testing.do_bench` median of one call after an L2 flush (host launch overhead included)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
