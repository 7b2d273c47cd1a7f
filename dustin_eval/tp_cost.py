"""What tensor parallelism adds to a decoding step (`dustin bench e2e --tp N`): the collectives each
phase of the loop issues, logged from one eager call of the phase (the step's state restored around
it), then timed alone, back to back in one CUDA graph at the same sizes and in the same order.
GPU only; every rank must call these in the same order (they run collectives)."""

from __future__ import annotations

import torch

from dustin_runtime.engine import Engine
from dustin_runtime.tp import TensorParallel


@torch.inference_mode()
def phase_collectives(eng: Engine, tp: TensorParallel) -> dict[str, list[tuple[str, int, torch.dtype]]]:
    """(kind, elements, dtype) of every collective each phase of the engine's last loop issues."""
    st = eng.last
    if st is None:
        return {}
    restore, out = st.snapshot(), {}
    for name, fn in st.graphs.fns.items():
        restore()
        tp.record = []
        try:
            fn()
        finally:
            out[name], tp.record = tp.record, None
    restore()
    return out


@torch.inference_mode()
def collectives_ms(tp: TensorParallel, calls: list[tuple[str, int, torch.dtype]], replays: int = 20) -> float:
    """Median milliseconds of `calls` replayed back to back in one CUDA graph (same count of replays
    on every rank: no time budget)."""
    from dustin_eval.timing import graph_ms

    if not calls:
        return 0.0
    bufs = [(kind, torch.zeros(n, dtype=dtype, device="cuda")) for kind, n, dtype in calls]

    def step():
        for kind, buf in bufs:
            if kind == "all_reduce":
                tp.all_reduce_(buf)
            else:
                tp.all_gather(buf)

    return graph_ms([step], replays=replays, budget_ms=None)["median_ms"]


def step_costs(eng: Engine, tp: TensorParallel, replays: int = 20) -> dict:
    """Per phase: collective calls, bytes each rank sends, and their time alone; and the step's sum."""
    phases = {}
    for name, calls in phase_collectives(eng, tp).items():
        sent = sum(n * torch.empty((), dtype=dt).element_size() for _, n, dt in calls)
        phases[name] = {"calls": len(calls), "bytes": sent, "ms": collectives_ms(tp, calls, replays)}
    return {"phases": phases, "collective_ms_per_step": sum(p["ms"] for p in phases.values()),
            "collective_bytes_per_step": sum(p["bytes"] for p in phases.values())}
