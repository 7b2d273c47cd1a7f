"""The sparse-verification configuration: budget, sinks, window, draft share m and the retrieval heads
of the one set per sequence that every target layer attends.

The runtime never reads a profile artifact itself: `dustin_profile.Profile.to_sparse_config` turns
one into a `SparseConfig` (with `scale_m`, the one rule for m at another budget), and
`dustin_profile.plan` checks it was made for the loaded models."""

from __future__ import annotations

from dataclasses import dataclass, replace

from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError

Head = tuple[int, int, tuple[int, ...]]  # (layer, kv_head, query_heads): one retrieval head at KV granularity

DEFAULT_SINKS = 4
DEFAULT_WINDOW = 64
QUEST_PAGE = 16
DRAFT_KV = ("full", "verify-set")  # what the draft attends while drafting


@dataclass(frozen=True)
class SparseConfig:
    """Verification set of S = `budget` context rows per sequence: [0, sinks) + the last `window`
    rows + top-`m` by the draft signal + the rest by the target signal. `aggregation` reduces the
    retrieval heads' softmax over heads, queries and layers ("sum" or "max"). `draft_kv`: the draft
    attends its whole cache while drafting ("full"), or only the latest verification set, the
    rows committed since and this step's drafts ("verify-set").

    `refresh_layers`: target layers at which the verification pass chooses the set
    again, from the current queries of every KV head of that layer (scored as the pass reaches it);
    that layer and the following ones attend the new set, the earlier ones the set chosen before
    the pass. Each refresh reads one layer's keys."""

    budget: int
    sinks: int = DEFAULT_SINKS
    window: int = DEFAULT_WINDOW
    m: int = 0
    draft_heads: tuple[Head, ...] = ()
    target_heads: tuple[Head, ...] = ()
    aggregation: str = "sum"
    page_size: int = QUEST_PAGE
    draft_kv: str = "full"
    source: str = ""  # where it came from (a profile path, "all heads", ...), for records
    refresh_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.sinks < 0 or self.window < 0:
            raise DustinError(f"sinks ({self.sinks}) and window ({self.window}) must be >= 0")
        if self.budget < self.sinks + self.window or self.budget <= 0:
            raise DustinError(f"budget {self.budget} is smaller than sinks + window "
                              f"({self.sinks} + {self.window}); give --budget >= {max(1, self.sinks + self.window)}")
        if self.refresh_layers:
            r = list(self.refresh_layers)
            if r != sorted(set(r)) or r[0] < 0:
                raise DustinError(f"refresh layers must be distinct layer numbers >= 0 in ascending order, got {r}")
        if not 0 <= self.m <= self.free:
            raise DustinError(f"m = {self.m} is outside [0, budget - sinks - window = {self.free}]")
        if self.aggregation not in ("sum", "max"):
            raise DustinError(f"aggregation must be 'sum' or 'max', got {self.aggregation!r}")
        if self.page_size < 1:
            raise DustinError("page size must be >= 1")
        if self.draft_kv not in DRAFT_KV:
            raise DustinError(f"draft KV must be one of {', '.join(DRAFT_KV)}, got {self.draft_kv!r}")
        for h in self.draft_heads + self.target_heads:
            if len(h) != 3 or not h[2]:
                raise DustinError(f"retrieval head {h} must be (layer, kv_head, non-empty query_heads)")

    @property
    def free(self) -> int:
        """Rows chosen by the signals: budget - sinks - window."""
        return self.budget - self.sinks - self.window

    def refresh_heads(self, cfg: ModelConfig) -> dict[int, tuple[Head, ...]]:
        """Refresh layer -> the heads (layer, kv_head, query_heads) that score it (every KV head of the
        layer), of target `cfg`."""
        return {layer: tuple(h for h in every_head(cfg) if h[0] == layer) for layer in self.refresh_layers}

    def with_budget(self, budget: int, m: int | None = None) -> SparseConfig:
        """The same heads at another budget; m scaled to keep its share of the free rows unless given."""
        new_free = budget - self.sinks - self.window
        if m is None:
            m = scale_m(self.m, self.free, new_free)
        return replace(self, budget=budget, m=m)

    def check_models(self, target: ModelConfig, draft: ModelConfig) -> None:
        """Refuse heads outside the models' shapes, query heads outside their KV head's group, or
        refresh layers past the target's layers."""
        if self.refresh_layers and self.refresh_layers[-1] >= target.num_layers:
            raise DustinError(f"refresh layer {self.refresh_layers[-1]} is past the target's {target.num_layers} "
                              f"layers (0..{target.num_layers - 1})")
        for who, heads, cfg in (("draft", self.draft_heads, draft), ("target", self.target_heads, target)):
            for layer, kv, qh in heads:
                if not (0 <= layer < cfg.num_layers and 0 <= kv < cfg.num_kv_heads):
                    raise DustinError(f"{who} retrieval head (layer {layer}, KV head {kv}) is outside the "
                                      f"{who} model's {cfg.num_layers} layers x {cfg.num_kv_heads} KV heads")
                bad = [h for h in qh if not 0 <= h < cfg.num_heads or h // cfg.n_rep != kv]
                if bad:
                    raise DustinError(f"{who} retrieval head (layer {layer}, KV head {kv}): query heads {bad} "
                                      f"do not use KV head {kv}")

    @classmethod
    def all_heads(
        cls,
        target: ModelConfig,
        draft: ModelConfig,
        budget: int,
        *,
        sinks: int = DEFAULT_SINKS,
        window: int = DEFAULT_WINDOW,
        m: int | None = None,
    ) -> SparseConfig:
        """The documented default head set (no profile): every KV head of every layer of both models
        scores (all its query heads); m = half the free rows unless given. Costly: an analysis default."""
        free = budget - sinks - window
        return cls(
            budget=budget, sinks=sinks, window=window, m=free // 2 if m is None else m,
            draft_heads=every_head(draft), target_heads=every_head(target), source="all heads",
        )


def scale_m(m: int, free: int, new_free: int) -> int:
    """The draft share m of `free` signal rows carried to `new_free` rows: the same fraction, rounded,
    clipped to [0, new_free] (0 when there were no free rows)."""
    return max(0, min(new_free, round(m / free * new_free))) if free > 0 else 0


def every_head(cfg: ModelConfig) -> tuple[Head, ...]:
    """Every KV head of every layer, each with all its query heads."""
    r = cfg.n_rep
    return tuple((layer, g, tuple(range(g * r, (g + 1) * r)))
                 for layer in range(cfg.num_layers) for g in range(cfg.num_kv_heads))
