"""Prefill and autoregressive decoding over the static cache, with the per-sequence bookkeeping
(ragged prompts, EOS and max-new-tokens per sequence) that speculative decoding shares.

Convention: after prefill the cache holds every prompt token but the last one, which becomes the
`cur` token of the first step; each step feeds `cur` (plus drafts), so decode and verify steps have
static shapes and no host sync. The loop syncs once per step to test whether all are done. Every
step's phases are plain functions over static buffers (`engine`): called eagerly, or replayed as
CUDA graphs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dustin_runtime.attention import AttentionBackend, default_backend
from dustin_runtime.engine import Engine, default_engine
from dustin_runtime.errors import DustinError
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.model import Transformer
from dustin_runtime.sampling import SamplingConfig, next_token, vocab_shard
from dustin_runtime.stats import DecodeStats, PhaseTimer

PREFILL_CHUNK = 2048


@dataclass
class GenerationResult:
    """New tokens per sequence (EOS included when it ended the sequence) and the run's stats."""

    tokens: list[list[int]]
    finish_reasons: list[str]  # "eos" | "length"
    stats: DecodeStats


def check_prompts(prompts: list[list[int]], max_new: list[int], model: Transformer, extra: int = 0) -> None:
    """Refuse empty prompts, unknown ids and prompts that do not fit the model's context."""
    limit = model.cfg.max_position_embeddings
    for i, (p, m) in enumerate(zip(prompts, max_new, strict=True)):
        if len(p) == 0:
            raise DustinError(f"prompt {i} is empty")
        if m < 0:
            raise DustinError(f"prompt {i}: max new tokens must be >= 0")
        if len(p) + m > limit:
            raise DustinError(
                f"prompt {i} has {len(p)} tokens; with {m} new tokens it exceeds the model's "
                f"context of {limit} tokens: shorten it to {limit - m} tokens or ask fewer new tokens"
            )
        if max(p) >= model.cfg.vocab_size or min(p) < 0:
            raise DustinError(f"prompt {i} has token ids outside the vocabulary ({model.cfg.vocab_size})")
        window = model.cfg.sliding_window
        if window is not None and len(p) + m + extra > window:
            raise DustinError(f"prompt {i} would exceed the sliding window ({window}), which is not supported")


def check_finite(logits: torch.Tensor, model: Transformer, who: str) -> None:
    """Refuse a run whose first step's logits hold NaN or +Inf (or a row of -Inf only): the greedy
    token would be 0 forever. One check per call, after the first step (one host sync); the EOS
    columns masked to -Inf before `min_new_tokens` pass."""
    bad = logits.isnan().any() | logits.isposinf().any() | logits.isneginf().all(-1).any()
    if bool(bad):
        dtype = str(model.dtype).removeprefix("torch.")
        raise DustinError(f"{who} {model.cfg.name or ''}: its logits are not finite (NaN/Inf) on the first step: "
                          f"its weights hold NaN/Inf or values that overflow {dtype} (a damaged or mis-converted "
                          "checkpoint?)")


def cache_capacity(prompts: list[list[int]], max_new: list[int], gamma: int = 0) -> int:
    """Rows needed per sequence: prompt + new tokens + room for one step's overshoot."""
    return max(len(p) for p in prompts) + max(max_new) + 2 * (gamma + 1) + 1


def prefill(
    model: Transformer,
    cache: KVCache,
    prompts: list[list[int]],
    backend: AttentionBackend,
    *,
    chunk: int = PREFILL_CHUNK,
    tail: int = 0,
    start: int = 0,
) -> None:
    """Write every prompt token but the last into the cache, in chunks (no N x N score matrix).
    Consecutive prompts of equal length go through together; others one run at a time. With
    `tail` > 0 the last `tail` of those tokens form their own final chunk (a policy can take its
    first target-history signal from those queries). With `start` > 0 the first `start` tokens of
    every prompt are already in the cache (a continued prefill)."""
    b = 0
    while b < len(prompts):
        e = b + 1
        while e < len(prompts) and len(prompts[e]) == len(prompts[b]):
            e += 1
        ids = torch.tensor([p[start:-1] for p in prompts[b:e]], dtype=torch.long, device=model.device)
        view, n = cache.rows(b, e), ids.shape[1]
        cut = max(n - tail, 0) if tail else n
        bounds = [(s, min(s + chunk, cut)) for s in range(0, cut, chunk)]
        if cut < n:
            bounds.append((cut, n))
        for s, stop in bounds:
            model(ids[:, s:stop], view, backend, phase="prefill", logits="none", kv_len=start + stop,
                  rows=(b, e), final=stop == n)
            view.advance(stop - s)
        b = e


class Bookkeeper:
    """Device-side outputs of a batch: emitted tokens, EOS and length limits per sequence, and the
    accepted draft count of every step. Static buffers sized once (`rows` new tokens per sequence
    at most, `width` tokens per step, `steps` steps at most: `rows` by default), refilled in place
    by `reset` for each call."""

    def __init__(self, batch: int, rows: int, width: int, eos_ids, device, min_new: int = 0,
                 steps: int | None = None):
        self.device, self.min_new, self.width = device, min_new, width
        self.max_new = torch.zeros(batch, dtype=torch.long, device=device)
        self.produced = torch.zeros(batch, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = torch.tensor(sorted(set(eos_ids)) or [-1], device=device)
        self.out = torch.zeros(batch, rows + 2 * width + 1, dtype=torch.long, device=device)
        self.trash = self.out.shape[1] - 1
        self.accepted = torch.full(((steps or rows) + 1, batch), -1, dtype=torch.long, device=device)  # [steps, B]
        self.step = torch.zeros(1, dtype=torch.long, device=device)

    def reset(self, max_new: list[int]) -> None:
        """Start a call: per-sequence limits, nothing produced."""
        if max(max_new) + 1 > self.accepted.shape[0]:
            raise ValueError(f"{max(max_new)} new tokens exceed the bookkeeper's {self.accepted.shape[0] - 1}")
        self.max_new.copy_(torch.tensor(max_new))
        self.produced.zero_()
        torch.le(self.max_new, 0, out=self.done)
        self.out.zero_()
        self.accepted.fill_(-1)
        self.step.zero_()

    def mask_early_stops(self, logits: torch.Tensor, offset: int = 0, rows: slice | None = None,
                         eos: torch.Tensor | None = None) -> torch.Tensor:
        """Forbid end-of-sequence ids before `min_new` tokens: logits [B, T, V] (token t of the pass
        would be new token produced + offset + t) get -inf on those ids. No host sync. Under tensor
        parallelism the logits may hold `rows` of the batch (a rank's drafts) and `eos` gives the
        EOS ids' columns among a rank's vocabulary columns (possibly none)."""
        eos = self.eos if eos is None else eos
        if self.min_new <= 0 or eos.numel() == 0:
            return logits
        T = logits.shape[1]
        produced = self.produced if rows is None else self.produced[rows]
        pos = produced.view(-1, 1) + offset + torch.arange(T, device=self.device)  # [B, T]
        early = (pos < self.min_new).unsqueeze(-1)  # [B, T, 1]
        cols = logits[:, :, eos]
        logits[:, :, eos] = torch.where(early, torch.full_like(cols, float("-inf")), cols)
        return logits

    def emit(self, emitted: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """Append emitted[b, :count[b]] ([B, W], [B]) for live sequences and record the step's
        accepted drafts (count - 1, cut where the sequence ends: at its length limit or its first
        EOS; -1 for finished sequences); returns the per-sequence advance (count for live ones,
        0 for finished ones)."""
        W = emitted.shape[1]
        live = ~self.done
        j = torch.arange(W, device=self.device)
        valid = (j.view(1, W) < count.view(-1, 1)) & live.view(-1, 1)  # [B, W]
        pos = (self.produced.view(-1, 1) + j).clamp_max(self.trash - 1)
        self.out.scatter_(1, torch.where(valid, pos, self.trash), emitted)
        is_eos = torch.isin(emitted, self.eos) & valid  # [B, W]
        hit_eos = is_eos.any(1)
        kept = torch.minimum(count, self.max_new - self.produced)  # tokens inside the length limit
        kept = torch.where(hit_eos, torch.minimum(kept, is_eos.int().argmax(1) + 1), kept)  # up to the EOS
        self.accepted.index_copy_(0, self.step, torch.where(live, kept - 1, -1).view(1, -1))
        self.step += 1
        advance = torch.where(live, count, torch.zeros_like(count))
        self.produced += advance
        self.done |= hit_eos | (self.produced >= self.max_new)
        return advance

    def all_done(self) -> bool:
        """The one host synchronisation of a step."""
        return bool(self.done.all())

    def accepted_rows(self, steps: int) -> list[list[int]]:
        """Accepted drafts per step and sequence, [steps][B] (-1 = finished)."""
        return self.accepted[:steps].cpu().tolist()

    def results(self, max_new) -> tuple[list[list[int]], list[str]]:
        out, produced = self.out.cpu().tolist(), self.produced.cpu().tolist()
        eos = set(self.eos.cpu().tolist())
        tokens, reasons = [], []
        for b, row in enumerate(out):
            row = row[: min(produced[b], max_new[b])]
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            if cut is not None:
                tokens.append(row[: cut + 1])
                reasons.append("eos")
            else:
                tokens.append(row)
                reasons.append("length")
        return tokens, reasons


def start_steps(device: torch.device) -> float:
    """The wall clock at the first step: prefill (asynchronous on CUDA) is waited for first, so the
    steps' wall time (`seconds["steps"]`, ended by the last step's done check) excludes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def use_graphs(cuda_graphs: bool | None, device: torch.device, cacheable: bool) -> bool:
    """CUDA graphs by default on CUDA for a loop whose configuration can be cached; never on CPU."""
    if device.type != "cuda":
        return False
    return cacheable if cuda_graphs is None else cuda_graphs and cacheable


@torch.inference_mode()
def generate(
    model: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int | list[int],
    *,
    sampling: SamplingConfig = SamplingConfig(),
    eos_ids: tuple[int, ...] = (),
    backend: AttentionBackend | None = None,
    seed: int = 0,
    prefill_chunk: int = PREFILL_CHUNK,
    min_new_tokens: int = 0,
    cuda_graphs: bool | None = None,
    engine: Engine | None = None,
    prefilled: int | None = None,
) -> GenerationResult:
    """Autoregressive decoding of a batch of prompts of any lengths (EOS ids are forbidden
    before `min_new_tokens` new tokens). On CUDA the decode step runs as a CUDA graph (captured on
    the second step, reused by later calls of the same configuration) unless `cuda_graphs` is
    False; with a custom `backend` only when `cuda_graphs` is True. `prefilled` = rows: the
    engine's cache (`engine.caches`) already holds the first rows of every prompt."""
    max_new = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    check_prompts(prompts, max_new, model)
    device, B = model.device, len(prompts)
    graphs = use_graphs(cuda_graphs if backend is None else bool(cuda_graphs), device, True)
    engine = engine or (default_engine(model) if graphs else Engine(model))
    backend = backend or default_backend(device)
    timer = PhaseTimer(device)
    t0 = time.perf_counter()
    tcache, _ = engine.caches(B, cache_capacity(prompts, max_new), draft=False)
    key = ("ar", B, tcache.max_len, sampling, min_new_tokens, tuple(sorted(set(eos_ids))), type(backend).__name__)

    def build(st):
        st.objs["book"] = Bookkeeper(B, tcache.max_len, 1, eos_ids, device, min_new_tokens)
        st.objs["cur"] = torch.zeros(B, dtype=torch.long, device=device)
        st.objs["one"] = torch.ones(B, dtype=torch.long, device=device)
        book = st.objs["book"]
        st.mutable = [tcache.lengths, st.objs["cur"], book.produced, book.done, book.step]

    st = engine.state(key, build, graphs=graphs, sampled=not sampling.greedy)
    book, cur, one = st.objs["book"], st.objs["cur"], st.objs["one"]
    shard = vocab_shard(model, model.cfg.vocab_size)  # tensor parallel: this rank's logits columns
    eos = None if shard is None else shard.columns(sorted(set(eos_ids))).to(device)
    st.generator.manual_seed(seed)
    book.reset(max_new)
    tcache.lengths.fill_(prefilled or 0)
    with timer.phase("prefill"):
        prefill(model, tcache, prompts, backend, chunk=prefill_chunk, start=prefilled or 0)
    cur.copy_(torch.tensor([p[-1] for p in prompts]))
    step: dict[str, torch.Tensor] = {}
    t_steps = start_steps(device)

    def decode():
        logits = model(cur.view(-1, 1), tcache, backend, phase="decode", local_vocab=True)
        step["logits"] = book.mask_early_stops(logits, eos=eos)[:, -1]

    def commit():
        nxt = next_token(step["logits"], sampling, st.generator, shard)
        advance = book.emit(nxt.view(-1, 1), one)
        tcache.advance(advance.to(torch.int32))
        cur.copy_(torch.where(advance > 0, nxt, cur))

    steps = 0
    while not book.all_done():
        with timer.phase("decode"):
            st.graphs.run("decode", decode)
        if steps == 0:
            check_finite(step["logits"], model, "the model")
        with timer.phase("other"):
            st.graphs.run("other", commit)
        steps += 1
    seconds = {"steps": time.perf_counter() - t_steps}
    tokens, reasons = book.results(max_new)
    seconds.update(timer.totals())
    seconds["total"] = time.perf_counter() - t0
    stats = DecodeStats(
        mode="autoregressive",
        batch=B,
        prompt_tokens=[len(p) for p in prompts],
        new_tokens=[len(t) for t in tokens],
        steps=steps,
        seconds=seconds,
        cuda_graphs=st.graphs.enabled,
    )
    return GenerationResult(tokens, reasons, stats)
