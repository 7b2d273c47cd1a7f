"""Static state of the decoding loops, reused across calls, and the CUDA graphs of their phases.

A decoding step is a few phases (decode; or draft, select, verify, accept), each a plain function
over static buffers: the KV caches, the per-sequence bookkeeping, the policy's buffers. Eager
decoding calls the functions; on CUDA, `PhaseGraphs.run` calls a phase eagerly once (warm-up:
Triton compiles, kernels size their scratch), captures it the next time and replays it from then
on. The loop code is the same in both modes: only `PhaseGraphs.run` tells them apart.

Rules the phases follow so that a replay does what a call would:
- no host synchronisation and no Python branch on tensor values inside a phase;
- state that outlives a step (caches, lengths, `cur`, bookkeeping, policy buffers) is updated in
  place; values produced and consumed within one step may be rebound (a consumer captured after
  its producer reads the producer's graph output);
- per-call inputs (prompts' limits, replayed acceptance counts) are copied into the static
  buffers before the loop.

An `Engine` keeps, for one target (and draft), the caches of the last batch shape and one
`LoopState` per loop configuration (batch, capacity, gamma, sampling, policy, ...), so graphs are
captured once per configuration and replayed by later calls. `default_engine` keeps one engine for
autoregressive decoding and one for the latest draft on the target model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from dustin_runtime.kv_cache import KVCache

CAPACITY_STEP = 256  # caches are allocated in rows of this multiple, so calls of similar lengths share one
# The BLAS front end of the phases' torch GEMMs on CUDA (cuBLAS's own heuristic otherwise). H200, Qwen2.5-7B
# linears: w2 at 80 rows (a verification pass, batch 16) 37.1 vs 42.8 us, the others equal, equal at 16
# rows (probes/probe_verify_gemm.py); verification 4.94 -> 4.81 ms end to end (kernels/NOTES.md). The
# user's setting is restored after each phase; torch warns once per process that the setting is experimental.
BLAS = "cublaslt"


@contextmanager
def blas_library(name: str | None) -> Iterator[None]:
    """torch's preferred BLAS library set to `name` inside the block, then put back (None: untouched)."""
    if name is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def graphs_supported(device: torch.device | str, sampled: bool) -> bool:
    """CUDA graphs can run the loop: a CUDA device, and for sampling a torch that registers a
    custom generator's state with a graph."""
    if torch.device(device).type != "cuda":
        return False
    return not sampled or hasattr(torch.cuda.CUDAGraph, "register_generator_state")


class PhaseGraphs:
    """Runs the named phases of a loop: eagerly when disabled; else eager once, then captured into
    a CUDA graph (all phases share one memory pool, captured and replayed in step order). Calls and
    captures run under `blas_library(blas)`."""

    def __init__(self, enabled: bool, generator: torch.Generator | None = None, blas: str | None = None):
        self.enabled = enabled
        self.generator = generator
        self.blas = blas
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.fns: dict[str, Callable[[], None]] = {}  # each phase's function (side measurements call it)
        self.warm: set[str] = set()
        self.pool = None

    def run(self, name: str, fn: Callable[[], None]) -> None:
        self.fns[name] = fn
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
            return
        with blas_library(self.blas):
            if not self.enabled or name not in self.warm:  # eager, or the warm-up call before the capture
                self.warm.add(name)
                fn()
                return
            graph = torch.cuda.CUDAGraph()
            if self.generator is not None:
                graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph, pool=self.pool):
                fn()
        self.pool = graph.pool()
        self.graphs[name] = graph
        graph.replay()

    @property
    def captured(self) -> bool:
        return bool(self.graphs)


@dataclass
class LoopState:
    """What one loop configuration keeps between calls: its phase graphs, generator and buffers
    (`bufs`), and the objects the captured phases use (`objs`: bookkeeper, policy, ...)."""

    graphs: PhaseGraphs
    generator: torch.Generator
    objs: dict[str, Any] = field(default_factory=dict)
    mutable: list[torch.Tensor] = field(default_factory=list)  # what a step changes (lengths, bookkeeping)
    calls: int = 0

    def snapshot(self) -> Callable[[], None]:
        """A copy of what a step changes, and the function that puts it back (side measurements
        replay or call a phase alone, between restores)."""
        saved = [t.clone() for t in self.mutable]

        def restore() -> None:
            for t, s in zip(self.mutable, saved, strict=True):
                t.copy_(s)

        return restore


def round_capacity(rows: int) -> int:
    return -(-rows // CAPACITY_STEP) * CAPACITY_STEP


class Engine:
    """Caches and loop states of one target (and draft). `graphs` turns CUDA graphs on for the
    loops it serves."""

    def __init__(self, target, draft=None, *, graphs: bool = False):
        self.target, self.draft, self.graphs = target, draft, graphs
        self.tcache: KVCache | None = None
        self.dcache: KVCache | None = None
        self.states: dict[tuple, LoopState] = {}
        self.last: LoopState | None = None  # the state of the latest call

    def caches(self, batch: int, rows: int, *, draft: bool) -> tuple[KVCache, KVCache | None]:
        """Empty caches (lengths 0) for `batch` sequences of at least `rows` rows (under tensor
        parallelism the draft's holds this rank's batch / P sequences): the current ones
        when they fit closely (same batch, capacity within rows + max(1024, rows / 4)), else new
        ones (and every loop state built on the old ones is dropped)."""
        c = self.tcache
        fits = (c is not None and c.batch == batch and rows <= c.max_len <= rows + max(1024, rows // 4)
                and (self.dcache is not None or not draft))
        if not fits:
            self.states.clear()
            self.tcache = self.dcache = None  # free the old caches before allocating
            cap = round_capacity(rows)
            self.tcache = self.target.allocate_cache(batch, cap)
            tp = getattr(self.target, "tp", None)  # tensor parallel: the draft holds this rank's rows
            self.dcache = self.draft.allocate_cache(batch // (tp.world if tp else 1), cap) if draft else None
        for cache in (self.tcache, self.dcache):
            if cache is not None:
                cache.lengths.zero_()
        return self.tcache, self.dcache if draft else None

    def state(self, key: tuple | None, build: Callable[[LoopState], None], *, graphs: bool,
              sampled: bool) -> LoopState:
        """The loop state of configuration `key` (None: a fresh, uncached one). `build(state)`
        fills a new state's `objs`."""
        if key is not None and key in self.states:
            st = self.states[key]
        else:
            device = self.target.device
            gen = torch.Generator(device=device)
            blas = BLAS if torch.device(device).type == "cuda" else None
            st = LoopState(PhaseGraphs(graphs and graphs_supported(device, sampled), gen if sampled else None, blas),
                           gen)
            build(st)
            if key is not None:
                self.states[key] = st
        st.calls += 1
        self.last = st
        return st


def default_engine(target, draft=None) -> Engine:
    """The graph-enabled engine of a model pair, kept on the target model (it lives as long as the
    model does; a new draft replaces the engine of an earlier one)."""
    engines = target.__dict__.setdefault("_dustin_engines", {})
    key = "ar" if draft is None else "spec"
    eng = engines.get(key)
    if eng is None or eng.draft is not draft:
        engines.pop(key, None)  # free the old caches first
        eng = engines[key] = Engine(target, draft, graphs=True)
    return eng
