"""Memory plans: what a command will hold on one GPU (per rank under tensor parallelism), part by
part, computed from the model shapes before any weight is read, so a run that cannot fit is
refused in one line that names what does not fit and the --tp / --context / --windows that would.

Parts (bytes, the largest rank's):
- weights: the target's shard (exact: the parameters of `Transformer` built on the meta device at
  its shard, so padded vocabulary rows count) and the draft, replicated;
- kv: the static caches (target: its KV heads of the rank, draft: its sequences of the rank);
- records (profile): the fp32 work of one recorded verification pass at L = context (K and V of a
  layer, the scores and probabilities of its M queries, the captured history queries, every
  layer's context attention) plus the calibration statistics the search holds on the device
  (every pass's context attention, per-layer attention in fp16 and each candidate KV head's
  signal, [passes, context] each) and the search's rankings;
- activations: one prefill chunk through a layer (hidden states, q/k/v, the MLP's gate and up)
  and the logits of a verification pass;
- overhead: the allocator's rounding and the kernels' workspaces (3% of the rest + 256 MiB).

`plan_profile`, `plan_bench` and `plan_decode` make the plans; `MemoryPlan.check(free)` raises.
`plan_decode_batch` plans one batch of decoded prompts and `decode_batch_size` picks the largest
batch that fits what is free beside the loaded models (host memory on CPU)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError

GIB = 1 << 30
OVERHEAD_SHARE, OVERHEAD_FIXED = 0.03, 256 << 20


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def weight_bytes(cfg: ModelConfig, tp: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes of one rank's parameters at `tp` ranks (rank 0: it holds the o-projection's bias)."""
    import torch

    from dustin_runtime.model import Transformer
    from dustin_runtime.tp import TensorParallel

    with torch.device("meta"):
        model = Transformer(cfg, None if tp == 1 else TensorParallel(0, tp))
    return sum(p.numel() for p in model.parameters()) * dtype_bytes


def kv_bytes(cfg: ModelConfig, batch: int, tokens: int, tp: int = 1, dtype_bytes: int = 2) -> int:
    """K and V of `batch` sequences of `tokens` rows, one rank's KV heads."""
    return 2 * cfg.num_layers * (cfg.num_kv_heads // tp) * cfg.head_dim * batch * tokens * dtype_bytes


def activation_bytes(cfg: ModelConfig, rows: int, tp: int = 1, dtype_bytes: int = 2) -> int:
    """One layer's live tensors for `rows` rows: hidden states and norms, q/k/v, attention output,
    the MLP's gate, up and product (this rank's columns)."""
    q = cfg.num_heads // tp * cfg.head_dim
    kv = cfg.num_kv_heads // tp * cfg.head_dim
    inter = cfg.intermediate_size // tp
    return rows * (4 * cfg.hidden_size + 2 * (q + 2 * kv) + 4 * inter) * dtype_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU, by part, of one command at its settings (`settings`: option -> value, e.g.
    {"tp": 1, "context": 8192, "windows": 16}); `remake(**settings)` is the plan at others, from
    which `check` finds the settings that would fit."""

    command: str
    parts: tuple[tuple[str, int], ...]
    settings: dict = field(default_factory=dict)
    remake: Callable[..., MemoryPlan] | None = field(default=None, compare=False, repr=False)
    tp_choices: tuple[int, ...] = ()  # the --tp values the models allow (the KV heads divide by them)

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def part(self, name: str) -> int:
        return dict(self.parts).get(name, 0)

    def line(self) -> str:
        """'X GiB (weights A, kv B, ...)'."""
        return f"{gib(self.total)} ({', '.join(f'{k} {gib(n)}' for k, n in self.parts)})"

    def record(self) -> dict:
        """The plan as stored in an artifact: bytes by part, the total and the settings."""
        return {"bytes": dict(self.parts), "total_bytes": self.total, "settings": dict(self.settings)}

    def fits(self, free: int) -> list[str]:
        """The option changes (one each, e.g. '--tp 2 (70.3 GiB)') under which the plan fits `free`."""
        if self.remake is None:
            return []
        out = []
        tps = [t for t in self.tp_choices if t > self.settings.get("tp", 1)]
        for t in tps:
            p = self.remake(**{**self.settings, "tp": t})
            if p.total <= free:
                out.append(f"--tp {t} ({gib(p.total)} per GPU)")
                break
        for knob in ("context", "windows"):
            v = self.settings.get(knob)
            while v is not None and v > 1:
                v //= 2
                p = self.remake(**{**self.settings, knob: v})
                if p.total <= free:
                    out.append(f"--{knob} {v} ({gib(p.total)})")
                    break
        return out

    def check(self, free: int, where: str = "the GPU") -> None:
        """Raise the one-line refusal when the plan exceeds `free` bytes."""
        if self.total <= free:
            return
        fixes = self.fits(free)
        knobs = [f"--{k}" for k in ("tp", "context", "windows") if k in self.settings and (k != "tp" or self.tp_choices)]
        fix = ("; it fits with " + " or ".join(fixes)) if fixes else f"; no {' / '.join(knobs)} fits"
        raise DustinError(f"memory: {self.command} needs {self.line()} per GPU, {gib(free)} free on {where}{fix}")


def _overhead(parts: list[tuple[str, int]]) -> list[tuple[str, int]]:
    rest = sum(n for _, n in parts)
    return [*parts, ("overhead", int(OVERHEAD_SHARE * rest) + OVERHEAD_FIXED)]


def tp_choices(cfg: ModelConfig, most: int = 8) -> tuple[int, ...]:
    """World sizes that split the target by KV heads (up to `most` GPUs)."""
    return tuple(t for t in range(1, most + 1) if cfg.num_kv_heads % t == 0 and cfg.num_heads % t == 0)


def plan_profile(target: ModelConfig, draft: ModelConfig, *, context: int, windows: int, tp: int = 1,
                 extra_windows: int = 0, positions: int = 8, gamma: int = 4, budgets: int = 4, prefill_chunk: int = 2048,
                 dtype_bytes: int = 2, tp_allowed: bool = True) -> MemoryPlan:
    """`dustin profile`: both models, a batch-1 cache of each at context + gamma + 1 rows, one
    verification pass's fp32 records and the calibration statistics of `windows` windows (on rank 0,
    which searches; `extra_windows`: the held-out and retrieval ones)."""
    M = gamma + 1
    N = context + M
    G, H, D = target.num_kv_heads // tp, target.num_heads // tp, target.head_dim
    Lt = target.num_layers
    cand = draft.num_layers * draft.num_kv_heads + target.num_layers * target.num_kv_heads
    passes = (windows + extra_windows) * positions
    one_pass = (2 * G * N * D * 4  # a layer's K and V in fp32
                + 4 * H * M * N * 4  # scores, probabilities, context shares, masks
                + Lt * H * positions * M * D * dtype_bytes  # captured history queries
                + 2 * Lt * N * 4  # every layer's context attention
                + 2 * positions * G * N * 4)  # a layer's history signals
    stats = passes * N * (4 * (1 + cand) + 2 * Lt) + passes * Lt * budgets * 4
    search = 6 * passes * N * 8  # rankings (int64) and their cumulative sums
    parts = [("weights", weight_bytes(target, tp, dtype_bytes) + weight_bytes(draft, 1, dtype_bytes)),
             ("kv", kv_bytes(target, 1, N, tp, dtype_bytes) + kv_bytes(draft, 1, N, 1, dtype_bytes)),
             ("records", one_pass + stats + search),
             ("activations", activation_bytes(target, min(prefill_chunk, context), tp, dtype_bytes)
              + M * target.vocab_size * 4 * 2)]

    def remake(**s) -> MemoryPlan:
        return plan_profile(target, draft, extra_windows=extra_windows, positions=positions, gamma=gamma, budgets=budgets,
                            prefill_chunk=prefill_chunk, dtype_bytes=dtype_bytes, tp_allowed=tp_allowed, **s)

    return MemoryPlan("profile", tuple(_overhead(parts)), {"tp": tp, "context": context, "windows": windows},
                      remake, tp_choices(target) if tp_allowed else ())


def plan_bench(target: ModelConfig, draft: ModelConfig | None, *, context: int, batch: int, tp: int = 1,
               gamma: int = 4, prefill_chunk: int = 2048, dtype_bytes: int = 2) -> MemoryPlan:
    """`dustin bench e2e` (and decoding at a context): weights, the target's cache of `batch`
    sequences (this rank's KV heads) and the draft's of this rank's sequences, one prefill chunk."""
    rows = context + 2 * (gamma + 1)
    parts = [("weights", weight_bytes(target, tp, dtype_bytes) + (weight_bytes(draft, 1, dtype_bytes) if draft else 0)),
             ("kv", kv_bytes(target, batch, rows, tp, dtype_bytes)
              + (kv_bytes(draft, -(-batch // tp), rows, 1, dtype_bytes) if draft else 0)),
             ("activations", activation_bytes(target, min(prefill_chunk, context), tp, dtype_bytes)
              + batch * (gamma + 1) * target.vocab_size // tp * 4 * 2)]

    def remake(**s) -> MemoryPlan:
        return plan_bench(target, draft, batch=batch, gamma=gamma, prefill_chunk=prefill_chunk,
                          dtype_bytes=dtype_bytes, **s)

    return MemoryPlan("bench e2e", tuple(_overhead(parts)), {"tp": tp, "context": context}, remake,
                      tp_choices(target))


def plan_decode(target: ModelConfig, draft: ModelConfig | None, *, tp: int = 1, dtype_bytes: int = 2) -> MemoryPlan:
    """`dustin decode` / `eval`: the weights only (their caches follow the prompts)."""
    parts = [("weights", weight_bytes(target, tp, dtype_bytes) + (weight_bytes(draft, 1, dtype_bytes) if draft else 0))]

    def remake(**s) -> MemoryPlan:
        return plan_decode(target, draft, dtype_bytes=dtype_bytes, **s)

    return MemoryPlan("decode", tuple(parts), {"tp": tp}, remake, tp_choices(target))


def plan_decode_batch(target: ModelConfig, draft: ModelConfig | None, *, batch: int, rows: int, prompt: int,
                      gamma: int = 4, tp: int = 1, prefill_chunk: int = 2048, dtype_bytes: int = 2) -> MemoryPlan:
    """One batch of `dustin decode` beside the loaded weights: the caches of `batch` sequences of
    `rows` rows, a prefill chunk of every sequence through a layer (equal-length prompts prefill
    together; `prompt`: the longest), a step's logits (target's gamma + 1, the draft's gamma, with the
    sampling's copies: x3, fp32) and the bookkeeping (tokens, per-step accepted counts: int64)."""
    M = gamma + 1 if draft is not None else 1
    parts = [("kv", kv_bytes(target, batch, rows, tp, dtype_bytes)
              + (kv_bytes(draft, -(-batch // tp), rows, 1, dtype_bytes) if draft is not None else 0)),
             ("activations", activation_bytes(target, batch * min(prefill_chunk, prompt), tp, dtype_bytes)
              + 3 * batch * (M * -(-target.vocab_size // tp) + (gamma * draft.vocab_size if draft is not None else 0)) * 4),
             ("bookkeeping", 4 * batch * rows * 8)]
    return MemoryPlan("decode", tuple(_overhead(parts)), {"batch": batch})


def decode_batch_size(plan_at: Callable[[int], MemoryPlan], prompts: int, free: int, where: str = "the device") -> int:
    """The largest batch (<= `prompts`) whose plan (`plan_at(batch)`) fits `free` bytes; refused in
    one line when a single prompt does not fit."""
    one = plan_at(1)
    if one.total > free:
        raise DustinError(f"memory: one prompt of this decode needs {one.line()}, {gib(free)} free on {where} beside "
                          "the models: shorten the prompts or ask fewer new tokens")
    lo, hi = 1, prompts  # plan_at(lo) fits; the plan grows with the batch
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if plan_at(mid).total <= free else (lo, mid - 1)
    return lo


def host_free_bytes() -> int:
    """Host memory available to a new allocation (MemAvailable; all physical pages free elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_bytes(device: str) -> int | None:
    """Free memory of a CUDA device (None on CPU: host memory is not planned)."""
    import torch

    if not str(device).startswith("cuda"):
        return None
    free, _ = torch.cuda.mem_get_info(torch.device(device) if ":" in str(device) else None)
    return int(free)


def check_free(plan: MemoryPlan, device: str, tp=None) -> None:
    """Refuse `plan` on a CUDA `device` without the memory for it (no check on CPU); under `tp`
    (a `TensorParallel`) every rank raises when one does."""
    error = None
    try:
        free = free_bytes(device)
        if free is not None:
            plan.check(free, torch_device_name(device))
    except DustinError as e:
        error = str(e)
    if tp is not None:
        tp.agree(error)
    elif error is not None:
        raise DustinError(error)


def torch_device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device) if ":" in str(device) else None)


def peak_bytes(device: str) -> int | None:
    """torch.cuda.max_memory_allocated on CUDA (None elsewhere)."""
    import torch

    return int(torch.cuda.max_memory_allocated()) if str(device).startswith("cuda") else None
