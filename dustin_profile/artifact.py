"""The profile artifact: what Algorithm 1 found for one target/draft pair, as versioned JSON that the
runtime loads. Parquet tables and PNG plots sit beside the JSON (named in `tables`).

Schema 2 adds held-out figures (`heldout`); schema 3 refresh layers (`refresh_layers`,
`refresh_search`: `--max-refresh`); schema 8 drops the fields of features that measured no gain
(RESULTS.md, tried and dropped). Older files (1, 2, 3, 5, 6, 7; 4 was the withdrawn pool's) load with those
fields ignored where they are empty (`DROPPED`); a profile that uses one is refused with one line.
Loading validates the schema; `check_models` refuses a profile made for other models."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import get_args, get_origin, get_type_hints

from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import atomic_write
from dustin_runtime.sparse.config import (
    DRAFT_KV,
    SparseConfig,
    scale_m,
)

SCHEMA_VERSION = 8
MAKE = "make one with `dustin profile --target T --draft D` (it writes runs/profile/<T>-<D>.json)"  # the fix named
READS = (1, 2, 3, 5, 6, 7, 8)  # 1: no held-out figures; 2: no refresh layers; 3-7: fields of dropped features
# A field of a dropped feature (schemas 2-7) -> (its value when unused, the feature): ignored when unused.
DROPPED = {"groups": ([], "layer groups (--max-groups)"), "draft_group": (0, "layer groups (--max-groups)"),
           "score_channels": ([], "score channels (--score-channels)"),
           "refresh_kv_heads": ([], "refresh layers scored by some KV heads (--refresh-head-share)")}


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
    """Retrieval heads, the draft/target budget split, and how well they did on calibration text.

    `m`, `draft_heads`, `target_heads` and `arr` are the one set of every layer (Algorithm 1 on
    the all-layer attention)."""

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
    draft_kv: str = "full"  # what the draft attended while drafting: "full" | "verify-set" (sparse drafting)
    tables: dict[str, str] = field(default_factory=dict)  # name -> file beside the JSON
    heldout: dict = field(default_factory=dict)  # figures on held-out calibration windows
    refresh_layers: tuple[int, ...] = ()  # the dustin policy's refresh layers (one set only; refresh.py)
    refresh_search: dict = field(default_factory=dict)  # how they were chosen: rounds, ppl ratios, held-out
    schema_version: int = SCHEMA_VERSION

    @property
    def has_heads(self) -> bool:
        """Whether Algorithm 1 chose any retrieval head (a search whose first round gained less than
        its epsilon chooses none, and such a profile cannot drive the dustin policy)."""
        return bool(self.draft_heads or self.target_heads)

    def to_sparse_config(self, budget: int | None = None, sinks: int | None = None, window: int | None = None,
                         source: str = "", draft_kv: str | None = None) -> SparseConfig:
        """The runtime's `SparseConfig` at `budget` (default the profile's): the profile's heads and
        aggregation, its sinks/window and draft KV mode unless
        overridden, and m = the calibrated m at that budget, else the profile's m scaled by the
        runtime's one rule (`sparse.scale_m`), clipped to the free rows."""
        budget = self.budget if budget is None else budget
        sinks = self.sinks if sinks is None else sinks
        window = self.window if window is None else window
        free = budget - sinks - window

        def m_at(m: int, m_by_budget: dict[int, int]) -> int:
            got = m_by_budget.get(budget)
            if got is None:
                got = scale_m(m, self.budget - self.sinks - self.window, budget - self.sinks - self.window)
            return max(0, min(free, got))

        def heads(hs):
            return tuple((h.layer, h.kv_head, tuple(h.query_heads)) for h in hs)

        common = dict(budget=budget, sinks=sinks, window=window, aggregation=self.aggregation,
                      draft_kv=draft_kv or self.draft_kv, source=source)
        return SparseConfig(**common, m=m_at(self.m, self.m_by_budget), draft_heads=heads(self.draft_heads),
                            target_heads=heads(self.target_heads))

    def content_hash(self) -> str:
        """sha256 of what Algorithm 1 found and on which data: the JSON without its creation time,
        tool version, commit and run record (command, timings), so profiling again with the same
        settings gives the same hash (resume keys use it)."""
        d = self.to_dict()
        for k in ("created", "tool_version", "git_commit"):
            d.pop(k)
        d["calibration"] = {k: v for k, v in d["calibration"].items() if k != "run"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["m_by_budget"] = {str(k): v for k, v in sorted(self.m_by_budget.items())}
        return {"schema_version": d.pop("schema_version"), **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (a kill leaves the old file or the new one)."""
        return atomic_write(path, self.to_json())


def _build(cls, d: dict, where: str, skip: tuple[str, ...] = ()):
    if not isinstance(d, dict):
        raise DustinError(f"{where}: expected an object")
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - set(d))
    if missing:
        raise DustinError(f"{where}: missing field(s) {', '.join(missing)}")
    kw = {k: v for k, v in d.items() if k in names}
    hints = get_type_hints(cls)
    for k, v in kw.items():
        if k not in skip and not _is(v, hints[k]):
            raise DustinError(f"{where}: field {k} must be {_describe(hints[k])}, got {json.dumps(v)[:40]}")
    return kw


def _is(v, hint) -> bool:
    """Whether a JSON value fits a field's type (bools are not numbers; numbers are finite)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if hint is str:
        return isinstance(v, str)
    if hint is dict or origin is dict:
        return isinstance(v, dict) and (not args or all(_is(x, args[1]) for x in v.values()))
    if origin is tuple:
        return isinstance(v, list)
    return isinstance(v, dict)  # a nested dataclass, built and checked by its own _build


def _describe(hint) -> str:
    if hint in (int, float, str):
        return {int: "an integer", float: "a number", str: "a string"}[hint]
    if hint is dict or get_origin(hint) is dict:
        args = get_args(hint)
        return "an object" + (f" of {_describe(args[1]).split(' ', 1)[1]}s" if args else "")
    return "a list" if get_origin(hint) is tuple else "an object"


def _head(h, where: str) -> HeadChoice:
    if not (isinstance(h, dict) and _is(h.get("layer"), int) and _is(h.get("kv_head"), int)
            and isinstance(h.get("query_heads"), list) and h["query_heads"]
            and all(_is(q, int) for q in h["query_heads"])):
        raise DustinError(f"{where}: each head must be {{\"layer\": int, \"kv_head\": int, "
                          f"\"query_heads\": [int, ...]}}, got {json.dumps(h)[:60]}")
    return HeadChoice(h["layer"], h["kv_head"], tuple(h["query_heads"]))


def _heads(d: dict, key: str, where: str) -> tuple[HeadChoice, ...]:
    if not isinstance(d.get(key), list):
        raise DustinError(f"{where}: field {key} must be a list of heads")
    return tuple(_head(h, f"{where}: {key}") for h in d[key])


def _m_by_budget(mb, where: str) -> dict[int, int]:
    if not isinstance(mb, dict) or not all(re.fullmatch("[0-9]+", k, re.ASCII) and _is(v, int) for k, v in mb.items()):
        raise DustinError(f"{where}: field m_by_budget must map budgets to integers, got {json.dumps(mb)[:40]}")
    return {int(k): v for k, v in mb.items()}


def _check_m(m: int, m_by_budget: dict[int, int], prof: Profile, where: str) -> None:
    if not 0 <= m <= prof.budget - prof.sinks - prof.window:
        raise DustinError(f"{where}: m = {m} is outside [0, budget - sinks - window]")
    bad = [b for b, mb in m_by_budget.items() if not 0 <= mb <= b - prof.sinks - prof.window]
    if bad:
        raise DustinError(f"{where}: m_by_budget[{bad[0]}] is outside [0, budget - sinks - window]")


def profile_from_dict(d: dict, source: str = "profile") -> Profile:
    """Validate and build a `Profile` (schema 1, 2, 3, 5, 6, 7 or 8): field types, ranges and heads inside
    the models' shapes; one clear `DustinError` for anything wrong."""
    if not isinstance(d, dict):
        raise DustinError(f"{source}: not a JSON object")
    version = d.get("schema_version")
    if version not in READS or isinstance(version, bool):
        raise DustinError(f"{source}: schema_version {version!r} is not supported (this dustin reads "
                          f"{', '.join(map(str, READS))}); {MAKE.replace('make one', 'profile the pair again')}")
    for key, (unused, feature) in DROPPED.items():
        if key in d and d[key] != unused:
            raise DustinError(f"{source} uses {feature}, which dustin no longer has (RESULTS.md, tried and dropped, names the "
                              "commit that holds it): profile the pair again without it")
    kw = _build(Profile, d, source, skip=("draft_heads", "target_heads", "m_by_budget", "refresh_layers"))
    kw["target"] = ModelInfo(**_build(ModelInfo, d["target"], f"{source}: target"))
    kw["draft"] = ModelInfo(**_build(ModelInfo, d["draft"], f"{source}: draft"))
    for key in ("draft_heads", "target_heads"):
        kw[key] = _heads(d, key, source)
    kw["m_by_budget"] = _m_by_budget(d["m_by_budget"], source)
    refresh = d.get("refresh_layers", [])
    if not isinstance(refresh, list) or not all(_is(x, int) for x in refresh):
        raise DustinError(f"{source}: field refresh_layers must be a list of layer numbers")
    kw["refresh_layers"] = tuple(refresh)
    prof = Profile(**kw)
    if prof.gamma < 1 or prof.budget < 1 or prof.sinks < 0 or prof.window < 0:
        raise DustinError(f"{source}: gamma {prof.gamma} and budget {prof.budget} must be >= 1, sinks "
                          f"{prof.sinks} and window {prof.window} >= 0")
    if prof.budget < prof.sinks + prof.window:
        raise DustinError(
            f"{source}: budget {prof.budget} is smaller than sinks + window ({prof.sinks} + {prof.window})"
        )
    _check_m(prof.m, prof.m_by_budget, prof, source)
    if prof.aggregation not in ("sum", "max"):
        raise DustinError(f"{source}: aggregation must be 'sum' or 'max', got {prof.aggregation!r}")
    if prof.draft_kv not in DRAFT_KV:
        raise DustinError(f"{source}: draft_kv must be one of {', '.join(DRAFT_KV)}, got {prof.draft_kv!r}")
    for who, info in (("draft", prof.draft), ("target", prof.target)):
        if min(info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) < 1 \
                or info.num_heads % info.num_kv_heads:
            raise DustinError(f"{source}: {who} shape ({info.num_layers} layers, {info.num_heads} heads, "
                              f"{info.num_kv_heads} KV heads, head dim {info.head_dim}) is not a model's")
    r = list(prof.refresh_layers)
    if r and (r != sorted(set(r)) or r[0] < 0 or r[-1] >= prof.target.num_layers):
        raise DustinError(f"{source}: refresh_layers {r} must be distinct target layers (of "
                          f"{prof.target.num_layers}) in ascending order")
    for who, heads, info in (("draft", prof.draft_heads, prof.draft), ("target", prof.target_heads, prof.target)):
        rep = info.num_heads // info.num_kv_heads
        for h in heads:
            if not (0 <= h.layer < info.num_layers and 0 <= h.kv_head < info.num_kv_heads):
                raise DustinError(f"{source}: {who} head {h} is outside the model's {info.num_layers} layers "
                                  f"x {info.num_kv_heads} KV heads")
            if any(q // rep != h.kv_head or q < 0 for q in h.query_heads):
                raise DustinError(f"{source}: {who} head {h}: query heads {list(h.query_heads)} do not all use "
                                  f"KV head {h.kv_head}")
    return prof


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file."""
    path = Path(path)
    if not path.is_file():
        raise DustinError(f"{path}: no such profile file; {MAKE}")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise DustinError(f"{path}: not a readable JSON profile ({type(e).__name__}: {e})") from None
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
                              f"{want.num_heads} heads), not {got.id} ({got.num_layers} layers, {got.num_heads} heads): "
                              f"give this pair's profile, or {MAKE}")
        if want.tokenizer_hash != got.tokenizer_hash:
            raise DustinError(f"{source} was made for a {who} with another tokenizer ({want.id}): give this pair's "
                              f"profile, or {MAKE}")
