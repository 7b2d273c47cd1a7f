"""The policy runs of an evaluation or a decode, planned before any model loads: each policy at each
budget, its `SparseConfig` once the pair is loaded (a profile's heads and m, every head, or none),
the hooks factory the harnesses call, and what identifies a run in a resume key."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dustin_profile.artifact import (
    MAKE,
    Profile,
    check_models,
    config_hash,
    load_profile,
    model_info,
)
from dustin_runtime.errors import MAX_TOKENS, DustinError
from dustin_runtime.sparse.config import DEFAULT_SINKS, DEFAULT_WINDOW, DRAFT_KV, SparseConfig
from dustin_runtime.sparse.policies import policy_class

DEFAULT_BUDGET = 512


@dataclass(frozen=True)
class PolicyRun:
    """One policy at one budget (budget None for full verification)."""

    policy: str
    budget: int | None

    @property
    def label(self) -> str:
        return self.policy if self.budget is None else f"{self.policy}@{self.budget}"


@dataclass(frozen=True)
class LoadedProfile:
    """A validated profile with where it came from, its file's sha256 (provenance) and its content
    hash (resume keys: the same profiling run made again hashes the same)."""

    profile: Profile
    path: str
    sha256: str
    content: str


def read_profile(path: str | Path) -> LoadedProfile:
    """Load and validate a profile JSON once (it is shared by every run of a command)."""
    prof = load_profile(path)
    return LoadedProfile(prof, str(path), hashlib.sha256(Path(path).read_bytes()).hexdigest(), prof.content_hash())


@dataclass(frozen=True)
class SparsePlan:
    """--policy / --profile / --budget / --sinks / --window / --all-heads of one run, checked; `config`
    turns it into the SparseConfig of the loaded pair (None for full)."""

    policy: str
    budget: int | None
    sinks: int
    window: int
    profile: LoadedProfile | None = None
    all_heads: bool = False
    draft_kv: str | None = None  # None: the profile's (else "full")
    refresh_layers: tuple[int, ...] = ()  # dustin: layers re-selecting the set inside the verification pass

    def config(self, target, draft, infos=None) -> SparseConfig | None:
        """The SparseConfig for the loaded target/draft (`pipeline.LoadedModel`s), the profile checked
        against them (`infos`: their `ModelInfo`s when already computed)."""
        cls = policy_class(self.policy)
        if not cls.budgeted:
            return None
        kv = self.draft_kv if cls.one_set else "full"  # sets per layer and KV head: no draft set
        if self.profile is not None:
            p = self.profile
            infos = infos or (model_identity(target, info=True), model_identity(draft, info=True))
            check_models(p.profile, *infos, p.path)
            cfg = p.profile.to_sparse_config(self.budget, self.sinks, self.window, source=p.path,
                                             draft_kv=kv)
        elif self.all_heads:
            cfg = replace(SparseConfig.all_heads(target.model.cfg, draft.model.cfg, self.budget, sinks=self.sinks,
                                                 window=self.window), draft_kv=kv or "full")
        else:
            cfg = SparseConfig(budget=self.budget, sinks=self.sinks, window=self.window, draft_kv=kv or "full")
        if self.refresh_layers:
            cfg = replace(cfg, refresh_layers=self.refresh_layers)
        cfg.check_models(target.model.cfg, draft.model.cfg)
        return cfg

    def key(self, cfg: SparseConfig | None) -> dict:
        """The settings of this run that change its results (for resume keys)."""
        if cfg is None:
            return {"policy": self.policy}
        # fields at their defaults are left out: keys of records made before they existed hold
        sparse = {k: v for k, v in asdict(cfg).items()
                  if k != "source" and not (k == "refresh_layers" and not v)}
        return {"policy": self.policy, "sparse": sparse, "all_heads": self.all_heads,
                "profile": self.profile.content if self.profile else None}


def plan_sparse(policy: str, profile: LoadedProfile | str | Path | None, budget: int | None, sinks: int | None,
                window: int | None, all_heads: bool = False, draft_kv: str | None = None,
                refresh_layers: Sequence[int] | None = None) -> SparsePlan:
    """Check one run before any model loads: a known policy, retrieval heads where it needs them
    (a profile that holds some, or --all-heads), budget >= sinks + window, and a draft KV mode the
    policy can draft over; refresh layers only for dustin. Sinks, window and budget
    default to the profile's, else 4, 64 and 512; draft_kv to the profile's, else full; refresh
    layers (None) to the profile's for dustin, else none (`()` turns the profile's off)."""
    if profile is not None and not isinstance(profile, LoadedProfile):
        profile = read_profile(profile)
    cls = policy_class(policy)  # refuses an unknown name
    if refresh_layers is None and profile is not None and cls.refreshes:
        refresh_layers = profile.profile.refresh_layers
    refresh_layers = tuple(refresh_layers or ())
    if refresh_layers and not cls.refreshes:
        raise DustinError(f"--refresh-layers: policy {policy} has no set to choose again inside the verification "
                          "pass (only dustin does)")
    if draft_kv is not None and draft_kv not in DRAFT_KV:
        raise DustinError(f"--draft-kv {draft_kv!r}: choose one of {', '.join(DRAFT_KV)}")
    prof = profile.profile if profile else None
    if cls.needs_heads and prof is None and not all_heads:
        raise DustinError(f"policy {policy} needs retrieval heads: give --profile (the pair's profile); without one, "
                          f"{MAKE}")
    sinks = sinks if sinks is not None else prof.sinks if prof else DEFAULT_SINKS
    window = window if window is not None else prof.window if prof else DEFAULT_WINDOW
    if draft_kv == "verify-set" and not cls.one_set:
        raise DustinError(f"--draft-kv verify-set: policy {policy} has no one verification set per sequence to "
                          "draft over (use dustin, draft-only, target-only, streamingllm or oracle)")
    if not cls.budgeted:
        return SparsePlan(policy, None, sinks, window, profile, all_heads)
    budget = budget if budget is not None else prof.budget if prof else DEFAULT_BUDGET
    cfg = SparseConfig(budget=budget, sinks=sinks, window=window,  # refuses budget < sinks + window
                       refresh_layers=refresh_layers)  # and refresh layers out of order
    if cls.needs_heads and prof is not None:
        cfg = prof.to_sparse_config(budget, sinks, window)
        missing = [who for who, need, heads in (("draft", cfg.m > 0, cfg.draft_heads),
                                                ("target", cfg.m < cfg.free, cfg.target_heads)) if need and not heads]
        if missing and not prof.has_heads:
            raise DustinError(f"{profile.path} holds no retrieval heads for policy {policy}: Algorithm 1 chose none "
                              "that raised ARR enough; profile again with more --windows (or --retrieval-windows)")
        if missing:
            raise DustinError(f"{profile.path} holds no {missing[0]} retrieval heads, but at budget "
                              f"{budget} its m leaves rows of the {cfg.free} free ones to the {missing[0]} signal")
    return SparsePlan(policy, budget, sinks, window, profile, all_heads, draft_kv, refresh_layers)


def plan_runs(policies: Sequence[str], budgets: Sequence[int], profile: str | Path | None, sinks: int | None,
              window: int | None, all_heads: bool = False, draft_kv: str | None = None,
              refresh_layers: Sequence[int] | None = None) -> dict[PolicyRun, SparsePlan]:
    """Every policy at every budget (full once, without a budget), each checked before any model
    loads; the profile is read once; refresh layers apply to the dustin runs (None: the profile's)."""
    if not policies:
        raise DustinError("no policy given")
    classes = {p: policy_class(p) for p in policies}
    if refresh_layers and not any(c.refreshes for c in classes.values()):
        raise DustinError("--refresh-layers applies to policy dustin, which is not among the policies")
    loaded = read_profile(profile) if profile is not None else None
    runs = [PolicyRun(p, b if classes[p].budgeted else None)
            for p in policies for b in (budgets if classes[p].budgeted else [None])]
    if not runs:
        raise DustinError("no budget given")
    return {r: plan_sparse(r.policy, loaded, r.budget, sinks, window, all_heads,
                           draft_kv if classes[r.policy].one_set else None,
                           refresh_layers if classes[r.policy].refreshes else ()) for r in dict.fromkeys(runs)}


def sparse_configs(plans: dict, target, draft) -> dict:
    """Every plan's SparseConfig for the loaded pair (keys kept: runs, or budgets)."""
    infos = None
    if any(p.profile is not None and p.budget is not None for p in plans.values()):
        infos = (model_identity(target, info=True), model_identity(draft, info=True))
    return {r: p.config(target, draft, infos) for r, p in plans.items()}


def hooks_factory(configs: dict[PolicyRun, SparseConfig | None], target, draft,
                  measure_arr: bool = False) -> Callable[[PolicyRun], object]:
    """`make(run)` -> fresh `SpecHooks` of that run (a policy holds per-decode state)."""
    from dustin_runtime.sparse.policies import make_policy

    def make(run: PolicyRun):
        return make_policy(run.policy, configs[run], target=target.model, draft=draft.model, measure_arr=measure_arr)

    return make


def runs_key(plans: dict[PolicyRun, SparsePlan], configs: dict[PolicyRun, SparseConfig | None]) -> dict:
    """label -> the settings of that run, for the "runs" part of a resume key."""
    return {r.label: plans[r].key(configs[r]) for r in plans}


def model_identity(m, info: bool = False):
    """A loaded model's identity: id, config and tokenizer hashes and a weights fingerprint (a dict
    for resume keys), or with `info` the profile's `ModelInfo` of it."""
    from dustin_runtime.tokenizer import vocab_hash

    if info:
        return model_info(m.model_id, m.model.cfg, vocab_hash(m.tokenizer))
    out = {"id": m.model_id, "config": config_hash(m.model.cfg), "tokenizer": vocab_hash(m.tokenizer),
           "weights": m.ckpt.weights_fingerprint()}
    if m.model.head_ids is not None:  # a vocabulary-subset head (--draft-vocab): which tokens it keeps
        import hashlib

        ids = m.model.head_ids.cpu().numpy().astype("int64").tobytes()
        out["head_subset"] = {"tokens": int(m.model.head_ids.numel()), "sha256": hashlib.sha256(ids).hexdigest()[:16]}
    return out


def run_identity(target, draft) -> dict:
    """The models, dtype and device of a run (every harness's resume key starts with these)."""
    return {"target": model_identity(target), "draft": model_identity(draft) if draft is not None else None,
            "dtype": str(target.model.dtype).removeprefix("torch."), "device": str(target.model.device)}


def parse_ints(text: str, option: str, minimum: int = 1, maximum: int = MAX_TOKENS) -> list[int]:
    """A comma-separated list of integers in [minimum, maximum], or one clear error naming the option."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DustinError(f"{option} {text!r}: expected comma-separated integers") from None
    if not vals:
        raise DustinError(f"{option}: give at least one value")
    bad = [v for v in vals if v < minimum]
    if bad:
        raise DustinError(f"{option}: {bad[0]} is below {minimum}")
    big = [v for v in vals if v > maximum]
    if big:
        raise DustinError(f"{option}: {big[0]} is above {maximum}")
    return vals


def parse_names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_policies(text: str) -> list[str]:
    """--policy: comma-separated names, or 'all' (every policy)."""
    from dustin_runtime.sparse.policies import POLICY_CLASSES

    return list(POLICY_CLASSES) if text.strip() == "all" else parse_names(text)


def parse_layers(text: str) -> tuple[int, ...] | None:
    """--refresh-layers: None when not given (the profile's), () for 'none', else layer numbers >= 0."""
    if not text.strip():
        return None
    if text.strip().lower() == "none":
        return ()
    return tuple(parse_ints(text, "--refresh-layers", minimum=0))


REPO = Path(__file__).resolve().parents[1]


def pair_profile(profile: str | Path | None, target: str, draft: str, policies: Sequence[str]) -> Path | None:
    """--profile, else where a policy needs retrieval heads the pair's profile: the one `dustin
    profile` wrote by default (runs/profile/<target>-<draft>.json), else the committed one
    (profiles/<target>-<draft>.json, or profiles/<draft>.json as for the embedded pair)."""
    if profile is not None or not any(policy_class(p).needs_heads for p in policies):
        return None if profile is None else Path(profile)
    t, d = Path(target).name, Path(draft).name
    found = [p for p in (Path("runs") / "profile" / f"{t}-{d}.json", REPO / "profiles" / f"{t}-{d}.json",
                         REPO / "profiles" / f"{d}.json") if p.is_file()]
    return found[0] if found else None


def plan_options(policy: str, budget: str, profile, target: str, draft: str, draft_kv: str | None = None,
                 refresh: str = "") -> dict[PolicyRun, SparsePlan]:
    """The runs of --policy x --budget (with --profile, --draft-kv, --refresh-layers as given),
    checked before any model loads."""
    names = parse_policies(policy)
    return plan_runs(names, parse_ints(budget, "--budget"), pair_profile(profile, target, draft, names), None, None,
                     False, draft_kv, parse_layers(refresh))


def plan_decode(policy: str | None, profile, budget: int | None, draft: str | None, draft_kv: str | None,
                refresh: str, draft_lookup: str | None = None, exact: int = 0):
    """`dustin decode`'s one run, checked before any model loads: (the policy, its `SparsePlan`, the
    parsed --draft-lookup or None, the exact mode: --exact K, else the policy's -x suffix, else off).
    The policy defaults to dustin with a profile, else full; one that reads no profile is refused with one."""
    from dustin_runtime.exact import ExactConfig, exact_budget, split_exact
    from dustin_runtime.lookup import LookupConfig

    if exact and draft is None:
        raise DustinError("--exact confirms a draft's speculative tokens: give --draft")
    modes = ExactConfig(exact), split_exact(policy or "")[1]

    lookup = None if draft_lookup is None else LookupConfig.parse(draft_lookup)
    if lookup is not None and draft is None:
        raise DustinError("--draft-lookup drafts beside a draft model: give --draft")
    policy = policy or ("dustin" if profile is not None else "full")
    cls = policy_class(policy)
    if profile is not None and not isinstance(profile, LoadedProfile):
        profile = read_profile(profile)
    if budget is None and (modes[0].on or modes[1].on) and cls.budgeted:  # exact mode: agreement is what S buys
        budget = exact_budget(profile.profile.budget if profile is not None else None)
    if profile is not None and not cls.budgeted:
        raise DustinError(f"--policy {policy} reads no profile: drop --profile, or give a policy that verifies "
                          "over a set (dustin, streamingllm, quest, ...)")
    plan = plan_sparse(policy, profile, budget, None, None, False, draft_kv, parse_layers(refresh))
    if cls.budgeted and draft is None:
        raise DustinError(f"policy {policy} verifies a draft's tokens: give --draft")
    return policy, plan, lookup, modes[0] if modes[0].on else modes[1]


def bind(plans: dict, target, draft, measure_arr: bool, group=None):
    """The hooks factory of the planned runs on the loaded pair, and their resume key (models,
    dtype, device, tensor-parallel world, each run's settings)."""
    configs = sparse_configs(plans, target, draft)
    key = {**run_identity(target, draft), "measure_arr": measure_arr, "runs": runs_key(plans, configs)}
    if group is not None:
        key["tp"] = {"world": group.world}
    return hooks_factory(configs, target, draft, measure_arr), key
