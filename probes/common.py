"""What the probes share: a per-call time in microseconds from `dustin_eval.timing.graph_ms`."""

from __future__ import annotations

from collections.abc import Callable

from dustin_eval.timing import graph_ms


def graph_us(fn: Callable[[int], object], n: int = 24) -> float:
    """Median per-call time (us) of fn(0..n-1) captured back to back in one CUDA graph."""
    return graph_ms([lambda i=i: fn(i) for i in range(n)])["median_ms"] * 1e3
