"""The profile artifact: what Algorithm 1 found for one target/draft pair, as versioned JSON that the
runtime loads. Parquet tables and PNG plots sit beside the JSON (named in `tables`).

Loading validates the schema; `check_models` refuses a profile made for other models."""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class HeadChoice:
    """One retrieval head at KV-head granularity: the query heads it serves all score."""

    layer: int
    kv_head: int
    query_heads: tuple[int, ...]


@dataclass(frozen=True)
class ModelInfo:
    """Identity and attention shape of one model of the pair."""

    id: str
    config_hash: str
    tokenizer_hash: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Profile:
    """Retrieval heads, the draft/target budget split, and how well they did on calibration text."""

    tool_version: str
    git_commit: str
    created: str
    target: ModelInfo
    draft: ModelInfo
    gamma: int
    budget: int
    sinks: int
    window: int
    m: int  # tokens chosen by the draft signal at `budget`
    m_by_budget: dict[int, int]  # best m at other budgets (the runtime scales m for unlisted ones)
    draft_heads: tuple[HeadChoice, ...]
    target_heads: tuple[HeadChoice, ...]
    arr: float  # ARR of this profile on the calibration windows
    arr_baselines: dict[str, float]  # streamingllm, draft-only, target-only, quest, oracle, ...
    calibration: dict  # description, files, windows, context, seed, sha256
    online_cost: dict  # key bytes read per step by the estimator, as a share of the full cache
    aggregation: str = "sum"  # over heads and queries: "sum" | "max"
    tables: dict[str, str] = field(default_factory=dict)  # name -> file beside the JSON
    schema_version: int = SCHEMA_VERSION

    def m_for_budget(self, budget: int) -> int:
        """Draft share at `budget`: the calibrated value, else the calibrated fraction scaled."""
        if budget in self.m_by_budget:
            return self.m_by_budget[budget]
        free = self.budget - self.sinks - self.window
        frac = self.m / free if free > 0 else 0.0
        return max(0, min(budget - self.sinks - self.window, round(frac * (budget - self.sinks - self.window))))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["m_by_budget"] = {str(k): v for k, v in sorted(self.m_by_budget.items())}
        return {"schema_version": d.pop("schema_version"), **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path


def _build(cls, d: dict, where: str):
    if not isinstance(d, dict):
        raise DustinError(f"{where}: expected an object")
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - set(d))
    if missing:
        raise DustinError(f"{where}: missing field(s) {', '.join(missing)}")
    return {k: v for k, v in d.items() if k in names}


def profile_from_dict(d: dict, source: str = "profile") -> Profile:
    """Validate and build a `Profile`; one clear `DustinError` for anything wrong."""
    if not isinstance(d, dict):
        raise DustinError(f"{source}: not a JSON object")
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DustinError(f"{source}: schema_version {version!r} is not supported (this dustin reads {SCHEMA_VERSION})")
    kw = _build(Profile, d, source)
    try:
        kw["target"] = ModelInfo(**_build(ModelInfo, d["target"], f"{source}: target"))
        kw["draft"] = ModelInfo(**_build(ModelInfo, d["draft"], f"{source}: draft"))
        for key in ("draft_heads", "target_heads"):
            kw[key] = tuple(
                HeadChoice(int(h["layer"]), int(h["kv_head"]), tuple(int(q) for q in h["query_heads"]))
                for h in d[key]
            )
        kw["m_by_budget"] = {int(k): int(v) for k, v in d["m_by_budget"].items()}
        prof = Profile(**kw)
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise DustinError(f"{source}: malformed field ({type(e).__name__}: {e})") from None
    if prof.budget < prof.sinks + prof.window:
        raise DustinError(
            f"{source}: budget {prof.budget} is smaller than sinks + window ({prof.sinks} + {prof.window})"
        )
    if not 0 <= prof.m <= prof.budget - prof.sinks - prof.window:
        raise DustinError(f"{source}: m = {prof.m} is outside [0, budget - sinks - window]")
    for who, heads, info in (("draft", prof.draft_heads, prof.draft), ("target", prof.target_heads, prof.target)):
        for h in heads:
            if not (0 <= h.layer < info.num_layers and 0 <= h.kv_head < info.num_kv_heads):
                raise DustinError(f"{source}: {who} head {h} is outside the model's {info.num_layers} layers "
                                  f"x {info.num_kv_heads} KV heads")
    return prof


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file."""
    path = Path(path)
    if not path.is_file():
        raise DustinError(f"{path}: no such profile file")
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DustinError(f"{path}: not a readable JSON profile ({e})") from None
    return profile_from_dict(d, str(path))


def config_hash(cfg: ModelConfig) -> str:
    """Hash of the architecture-defining fields of a model config (the name excluded)."""
    d = asdict(cfg)
    d.pop("name", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_info(model_id: str, cfg: ModelConfig, tokenizer_hash: str) -> ModelInfo:
    return ModelInfo(model_id, config_hash(cfg), tokenizer_hash, cfg.num_layers, cfg.num_heads,
                     cfg.num_kv_heads, cfg.head_dim)


def check_models(prof: Profile, target: ModelInfo, draft: ModelInfo, source: str = "profile") -> None:
    """Refuse a profile whose target or draft is not the one being run (config or tokenizer)."""
    for who, want, got in (("target", prof.target, target), ("draft", prof.draft, draft)):
        if want.config_hash != got.config_hash:
            raise DustinError(f"{source} was made for {who} {want.id} ({want.num_layers} layers, "
                              f"{want.num_heads} heads), not {got.id} ({got.num_layers} layers, {got.num_heads} heads)")
        if want.tokenizer_hash != got.tokenizer_hash:
            raise DustinError(f"{source} was made for a {who} with another tokenizer ({want.id})")
