"""Decode statistics and a phase timer that does not sync the host inside a step (CUDA events are
recorded in the stream and read once at the end)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

PHASES = ("prefill", "draft", "select", "verify", "decode", "other")


class PhaseTimer:
    """Accumulates time per phase: CUDA events on GPU (read in `totals`), perf_counter on CPU."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self._events: dict[str, list[tuple]] = defaultdict(list)
        self._cpu: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self._events[name].append((a, b))
        else:
            t = time.perf_counter()
            yield
            self._cpu[name] += time.perf_counter() - t

    def totals(self) -> dict[str, float]:
        """Seconds per phase (syncs the device once)."""
        out = dict(self._cpu)
        if self.cuda:
            torch.cuda.synchronize()
            for name, pairs in self._events.items():
                out[name] = sum(a.elapsed_time(b) for a, b in pairs) / 1e3
        return out


@dataclass
class DecodeStats:
    """What one `generate` call did: per-phase seconds, tokens and per-step accepted lengths."""

    mode: str  # "autoregressive" | "speculative"
    batch: int
    prompt_tokens: list[int]
    new_tokens: list[int]
    steps: int = 0
    gamma: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per phase (PHASES), "steps" (wall), "total"
    accepted: list[list[int]] = field(default_factory=list)  # [steps][B]: drafts accepted, -1 = finished
    policy: str = "full"
    extra: dict = field(default_factory=dict)
    cuda_graphs: bool = False  # the steps ran as CUDA graphs
    accept_source: str = "model"  # "model" | "replayed" (`speculative.AcceptReplay`)

    @property
    def decode_seconds(self) -> float:
        """Wall seconds of the decoding steps (prefill excluded)."""
        if "steps" in self.seconds:
            return self.seconds["steps"]
        return self.seconds.get("total", 0.0) - self.seconds.get("prefill", 0.0)

    @property
    def ms_per_step(self) -> float:
        """Wall milliseconds per decoding step (prefill excluded)."""
        return self.decode_seconds / self.steps * 1e3 if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decoding (prefill excluded), all sequences together."""
        s = self.decode_seconds
        return sum(self.new_tokens) / s if s > 0 else 0.0

    def accepted_per_sequence(self) -> list[float]:
        """Mean accepted draft tokens per step for each sequence (bonus token excluded)."""
        out = []
        for b in range(self.batch):
            vals = [row[b] for row in self.accepted if row[b] >= 0]
            out.append(sum(vals) / len(vals) if vals else 0.0)
        return out

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per (sequence, step), bonus token excluded."""
        vals = [a for row in self.accepted for a in row if a >= 0]
        return sum(vals) / len(vals) if vals else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tokens_per_s=self.tokens_per_s,
            ms_per_step=self.ms_per_step,
            mean_accepted=self.mean_accepted,
            mean_tokens_per_step=self.mean_accepted + 1 if self.mode == "speculative" else 1.0,
            accepted_per_sequence=self.accepted_per_sequence(),
        )
        return d


def join_stats(parts: list[DecodeStats]) -> DecodeStats:
    """The statistics of consecutive batches as one run's: sequences in order, steps and seconds
    added, each batch's accepted rows beside -1 (finished) for the other batches' sequences; extra
    statistics per sequence joined, the others kept where every batch has the same value and listed
    per batch under "batches" where they differ."""
    from dustin_runtime.sparse.measures import PER_SEQUENCE

    if len(parts) == 1:
        return parts[0]
    first, total = parts[0], sum(p.batch for p in parts)
    accepted, before = [], 0
    for p in parts:
        accepted += [[-1] * before + row + [-1] * (total - before - p.batch) for row in p.accepted]
        before += p.batch
    seconds: dict[str, float] = {}
    for p in parts:
        for k, v in p.seconds.items():
            seconds[k] = seconds.get(k, 0.0) + v
    extra, differ = {}, {}
    for k in first.extra:
        values = [p.extra.get(k) for p in parts]
        if k.endswith(PER_SEQUENCE):
            extra[k] = [x for v in values for x in (v or [])]
        elif all(v == values[0] for v in values):
            extra[k] = values[0]
        else:
            differ[k] = values
    if differ:
        extra["batches"] = [{k: v[i] for k, v in differ.items()} for i in range(len(parts))]
    return DecodeStats(mode=first.mode, batch=total, prompt_tokens=[t for p in parts for t in p.prompt_tokens],
                       new_tokens=[t for p in parts for t in p.new_tokens], steps=sum(p.steps for p in parts),
                       gamma=first.gamma, seconds=seconds, accepted=accepted, policy=first.policy, extra=extra,
                       cuda_graphs=all(p.cuda_graphs for p in parts), accept_source=first.accept_source)
