"""`dustin bench e2e`: the decoding loop users run, timed end to end per verification policy.

Each policy runs through `generate` / `speculative_generate`, the functions `dustin decode` calls,
with CUDA graphs on, in one process on one GPU: `ar` (vanilla autoregressive decoding), `full`
(standard speculative decoding), `dustin`, `streamingllm`, `quest`; `dustin-vs` and
`streamingllm-vs` draft over the verification set (`--draft-kv verify-set`) instead of the draft's
whole cache; `dustin-r` and `dustin-vs-r` are dustin and dustin-vs with `refresh_layers` (the
verification pass chooses the set again at those target layers, `--refresh-layers`), so one run
times dustin with and without refresh side by side; a name ending in `-x` (dustin-x, dustin-vs-x, ...)
runs it in exact mode (`dustin_runtime.exact`: a full-attention confirmation pass every K = 2 steps, -xK every K;
with random weights the tokens each pass confirms are replayed from `--acceptance SPEC:agree=P`,
each provisional token agreeing with probability P once the earlier ones did; the record adds
`confirm_pass_ms`, the pass's graph alone). With preset shapes
(`--target qwen2.5-7b`) the models have random weights at the real shapes (timings do not depend
on values; the position limit is raised to context + new tokens), the caches hold `context` random
rows, and acceptance is replayed: random weights
accept nothing, so only the accept decision is overridden, by per-step accepted counts drawn from
`geometric:ALPHA` (each draft accepted with probability ALPHA given the earlier ones were,
truncated at gamma) or read from a JSONL of counts a real pair recorded (`dustin decode --json`);
drafting, selection, verification and the cache advance run exactly as in production. With model
checkpoints (a folder, a .gguf, `smollm2`) the prompts are book windows, prefill is real and so is
acceptance.

Per policy: a first call captures the graphs, a second is timed (`ms_per_step`: wall time of the
steps over their number, prefill excluded; `tokens_per_s`: the whole batch). Then every phase
graph is replayed alone (state restored between replays): their sum is the loop's floor,
`graph_phase_sum_ms`. `byte_floor_ms` is the bytes a step must read (weights, KV rows, retrieval
keys) over the copy bandwidth measured in the same run. A sweep over alpha (replayed counts only)
gives tokens/s per policy and alpha, plotted.

With `--tp N` under `torchrun --nproc-per-node N` the target is tensor parallel over N GPUs (random
weights: each rank makes only its shards) and the draft batch-parallel; the phase graphs hold the
collectives, the byte floor is one rank's bytes, and each policy's record adds the collectives of
a step (calls, bytes, and their time replayed alone: `dustin_eval.tp_cost`). Rank 0 writes."""

from __future__ import annotations

import gc
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dustin_runtime.engine import Engine
from dustin_runtime.errors import DustinError
from dustin_runtime.exact import SUFFIX as EXACT
from dustin_runtime.exact import exact_budget, split_exact
from dustin_runtime.generate import cache_capacity, generate
from dustin_runtime.io.files import atomic_path, atomic_write
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import policy_class
from dustin_runtime.speculative import AcceptReplay, speculative_generate

AR = "ar"
SPARSE_DRAFT = "-vs"  # suffix: the policy with sparse drafting (the draft attends the verification set)
REFRESH = "-r"  # suffix (after -vs): dustin with the config's refresh layers
TIMED = ("full", "dustin", "streamingllm", "quest")  # the runtime policies the bench times
_SPARSE_DRAFTED = tuple(p + SPARSE_DRAFT for p in TIMED if policy_class(p).budgeted and policy_class(p).one_set)
POLICIES = (AR, *TIMED, *_SPARSE_DRAFTED)  # the default: every timed policy, with sparse drafting where it can
REFRESH_POLICIES = tuple(p + REFRESH for p in (*TIMED, *_SPARSE_DRAFTED)  # with --refresh-layers only
                         if policy_class(p.removesuffix(SPARSE_DRAFT)).refreshes)
EXACT_POLICIES = tuple(p + EXACT for p in (*TIMED, *_SPARSE_DRAFTED, *REFRESH_POLICIES))  # exact mode (-x, last)
BUDGET = 512  # S of the lossy sparse policies unless --budget is given (the -x policies: `exact_budget`)
AGREE = ":agree="  # --acceptance SPEC:agree=P: the -x policies' replayed per-token agreement (random weights)


def _plain_exact(name: str) -> str:
    """-xK read as -x: the K is checked by `ExactConfig`."""
    base, exact = split_exact(name)
    return base + EXACT if exact.on else base


def split_policy(name: str) -> tuple[str, bool, bool]:
    """A bench policy name -> (the runtime policy, drafts over the verification set, refreshes); the
    exact-mode suffix (`EXACT`, last) is read by `split_exact`."""
    name = split_exact(name)[0]
    refresh = name.endswith(REFRESH)
    name = name.removesuffix(REFRESH)
    sparse_draft = name.endswith(SPARSE_DRAFT)
    return name.removesuffix(SPARSE_DRAFT), sparse_draft, refresh


def preset_shape(name: str):
    """The ModelConfig of a preset shape name (random weights), else None (a checkpoint)."""
    from dustin_runtime.presets import ALIASES, PRESETS, preset

    return preset(name) if name.lower() in set(PRESETS) | set(ALIASES) else None


@dataclass(frozen=True)
class E2EConfig:
    """What to run (see the module docstring)."""

    target: str = "qwen2.5-7b"  # a preset shape (random weights) or a checkpoint
    draft: str | None = None  # default: the preset's usual draft
    batch: int = 16
    context: int = 32768
    gamma: int = 4
    budget: int | None = None  # S of every sparse policy; None: BUDGET, the -x policies `exact_budget` (1024)
    policies: tuple[str, ...] = POLICIES
    acceptance: str = "geometric:0.8"
    new_tokens: int = 64
    srh: int = 4  # target retrieval KV heads of the dustin policy (over 2 layers)
    draft_srh: int = 2  # draft retrieval KV heads (its lookahead signal)
    m: int = 112  # rows of the set chosen by the draft's lookahead (of budget - sinks - window)
    sinks: int = 4
    window: int = 64
    alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    phase_reps: int = 20
    seed: int = 0
    tp: int = 1  # tensor-parallel ranks (GPUs), started by torchrun
    refresh_layers: tuple[int, ...] = ()  # target layers of the -r policies' refresh
    draft_vocab: str | None = None  # the draft's head over a vocabulary subset: K (random weights) or PATH:K
    draft_lookup: str | None = None  # context lookup beside the draft (MAX[:MIN]), every speculative policy

    def budget_of(self, policy: str) -> int:
        """The budget S `policy` runs at: the given one, else what `dustin decode` would use (exact mode's
        default for a -x policy, BUDGET for the others)."""
        if self.budget is not None:
            return self.budget
        return exact_budget(None) if split_exact(policy)[1].on else BUDGET

    def lookup(self):
        """The parsed `draft_lookup` (a LookupConfig), or None."""
        from dustin_runtime.lookup import LookupConfig

        return None if self.draft_lookup is None else LookupConfig.parse(self.draft_lookup)

    def check(self) -> None:
        known = POLICIES + REFRESH_POLICIES + EXACT_POLICIES
        bad = [p for p in self.policies if _plain_exact(p) not in known]
        if bad:
            raise DustinError(f"unknown policies {', '.join(bad)}; choose from {', '.join(known)}")
        if not self.policies:
            raise DustinError("give at least one policy")
        refreshed = [p for p in self.policies if split_policy(p)[2]]
        if refreshed and not self.refresh_layers:
            raise DustinError(f"policy {refreshed[0]} chooses the set again at refresh layers: give --refresh-layers")
        if self.refresh_layers and not refreshed:
            raise DustinError("--refresh-layers applies to the -r policies (dustin-r, dustin-vs-r), none of which "
                              "is among the policies")
        shape = preset_shape(self.target)
        exact = [p for p in self.policies if split_exact(p)[1].on]
        if exact and shape is not None and split_agreement(self.acceptance)[1] is None:
            raise DustinError(f"policy {exact[0]} on random weights replays the sparse and full passes' agreement: "
                              f"give it with the acceptance, e.g. --acceptance {self.acceptance}{AGREE}0.97")
        if self.draft_vocab is not None:
            from dustin_runtime.draft_vocab import parse_spec

            path, _ = parse_spec(self.draft_vocab)
            if shape is None and path is None:
                raise DustinError("--draft-vocab with checkpoints: give PATH:K (a token-counts file, `dustin "
                                  "profile vocab`); K alone is for preset shapes with random weights")
        self.lookup()  # a bad --draft-lookup is refused here, before any GPU work
        if shape is not None and self.refresh_layers and self.refresh_layers[-1] >= shape.num_layers:
            raise DustinError(f"refresh layer {self.refresh_layers[-1]} is past the target's {shape.num_layers} "
                              f"layers (0..{shape.num_layers - 1}, {self.target})")
        for name, v in (("batch", self.batch), ("gamma", self.gamma), ("new tokens", self.new_tokens),
                        ("phase reps", self.phase_reps)):
            if v < 1:
                raise DustinError(f"{name} must be >= 1, got {v}")
        if self.context < 2 * (self.gamma + 2):
            raise DustinError(f"context {self.context} is too short for gamma {self.gamma}: use --context >= "
                              f"{2 * (self.gamma + 2)}")
        if any(not 0.0 <= a <= 1.0 for a in self.alphas):
            raise DustinError(f"alphas must lie in [0, 1], got {list(self.alphas)}")
        for budget in sorted({self.budget_of(p) for p in self.policies}):
            SparseConfig(budget=budget, sinks=self.sinks, window=self.window, m=self.m,  # refuses bad sets
                         refresh_layers=self.refresh_layers)  # and refresh layers out of order


# ---------------------------------------------------------------- replayed acceptance


def geometric_counts(alpha: float, gamma: int, steps: int, batch: int, seed: int) -> torch.Tensor:
    """[steps, batch] accepted counts: each draft accepted with probability alpha once the earlier
    ones were, truncated at gamma (P(n >= k) = alpha^k for k <= gamma)."""
    g = torch.Generator().manual_seed(seed)
    ok = torch.rand(steps, batch, gamma, generator=g, dtype=torch.float64) < alpha
    return ok.long().cumprod(-1).sum(-1)


def recorded_counts(path: Path, gamma: int, steps: int, batch: int) -> torch.Tensor:
    """[steps, batch] counts from a JSONL of `dustin decode --json` records (stats.accepted
    [steps][B], -1 = finished) or {"accepted": [[...]]} lines: sequence b of the bench replays
    the recorded sequence b mod R, cycling over its steps."""
    if not path.is_file():
        raise DustinError(f"--acceptance {path}: no such file")
    streams = []
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            stats = rec.get("stats", rec)
            rows = stats["accepted"]
            g = stats.get("gamma")
            cols = list(zip(*rows, strict=True)) if rows else []
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
            raise DustinError(f"{path}:{i}: expected a `dustin decode --json` record (stats.accepted)") from None
        if g is not None and g != gamma:
            raise DustinError(f"{path}:{i}: counts recorded at gamma {g}, the bench runs gamma {gamma}")
        for col in cols:
            seq = [int(a) for a in col if int(a) >= 0]
            if any(a > gamma for a in seq):
                raise DustinError(f"{path}:{i}: an accepted count exceeds gamma {gamma}")
            if seq:
                streams.append(seq)
    if not streams:
        raise DustinError(f"{path}: no accepted counts in it")
    out = torch.zeros(steps, batch, dtype=torch.long)
    for b in range(batch):
        s = streams[b % len(streams)]
        out[:, b] = torch.tensor([s[t % len(s)] for t in range(steps)])
    return out


def split_agreement(spec: str) -> tuple[str, float | None]:
    """An --acceptance spec -> (the acceptance part, the agreement P of a trailing `:agree=P` or None)."""
    if AGREE not in spec:
        return spec, None
    head, _, value = spec.rpartition(AGREE)
    try:
        agree = float(value)
    except ValueError:
        agree = float("nan")
    if not 0.0 <= agree <= 1.0:
        raise DustinError(f"--acceptance {spec!r}: the agreement P of {AGREE}P must be a number in [0, 1]")
    return head, agree


def agreement_counts(spec: str, rows: int, passes: int, batch: int, seed: int) -> torch.Tensor | None:
    """[passes, batch] tokens each confirmation pass confirms: every provisional token agrees with
    probability P once the earlier ones did (the spec's `:agree=P`; None without it), truncated at the
    pass's `rows`."""
    agree = split_agreement(spec)[1]
    return None if agree is None else geometric_counts(agree, rows, passes, batch, seed + 1)


def replay_counts(spec: str, gamma: int, steps: int, batch: int, seed: int) -> torch.Tensor:
    """The counts of an --acceptance spec: `geometric:ALPHA` or a JSONL path (a trailing `:agree=P`
    is the agreement's, `agreement_counts`)."""
    spec = split_agreement(spec)[0]
    if spec.startswith("geometric:"):
        try:
            alpha = float(spec.split(":", 1)[1])
        except ValueError:
            alpha = float("nan")
        if not 0.0 <= alpha <= 1.0:
            raise DustinError(f"--acceptance {spec!r}: ALPHA must be a number in [0, 1]")
        return geometric_counts(alpha, gamma, steps, batch, seed)
    return recorded_counts(Path(spec), gamma, steps, batch)


# ---------------------------------------------------------------- models and prompts


@dataclass
class Pair:
    target: torch.nn.Module
    draft: torch.nn.Module
    target_id: str
    draft_id: str
    random: bool  # random weights at preset shapes (replayed acceptance)
    prompts: list[list[int]]
    eos: tuple[int, ...] = ()


def load_pair(cfg: E2EConfig, tp=None) -> Pair:
    """Random-weight models at preset shapes, or checkpoints with book-window prompts (under `tp`
    the target sharded, the draft replicated)."""
    from dustin_runtime.loader import read_config, resolve_checkpoint
    from dustin_runtime.memory import check_free, plan_bench
    from dustin_runtime.presets import default_draft, preset

    shape = preset_shape(cfg.target)
    if shape is None and cfg.draft is None:
        raise DustinError("with a target checkpoint, give --draft too")
    tshape, dshape = (shape, preset(cfg.draft or default_draft(cfg.target))) if shape is not None else \
        (read_config(resolve_checkpoint(s)) for s in (cfg.target, cfg.draft))
    check_free(plan_bench(tshape, dshape, context=cfg.context + cfg.new_tokens, batch=cfg.batch,
                          tp=1 if tp is None else tp.world, gamma=cfg.gamma), "cuda", tp)  # before any weight
    if shape is not None:
        from dustin_runtime.loader import random_model

        dname = cfg.draft or default_draft(cfg.target)
        rows = cfg.context + cfg.new_tokens + 2 * (cfg.gamma + 1) + 1  # positions the run reaches
        tcfg, dcfg = (replace(c, max_position_embeddings=max(c.max_position_embeddings, rows))
                      for c in (shape, preset(dname)))
        t = random_model(tcfg, dtype=torch.bfloat16, device="cuda", seed=cfg.seed, tp=tp).use_kernels()
        d = random_model(dcfg, dtype=torch.bfloat16, device="cuda", seed=cfg.seed + 1).use_kernels()
        if cfg.draft_vocab is not None:
            from dustin_runtime.draft_vocab import subset_for

            d.restrict_head(subset_for(cfg.draft_vocab, dcfg.vocab_size))
        g = torch.Generator().manual_seed(cfg.seed)
        vocab = min(tcfg.vocab_size, dcfg.vocab_size)
        prompts = torch.randint(0, vocab, (cfg.batch, cfg.context), generator=g).tolist()
        return Pair(t, d, f"{cfg.target} (random weights)", f"{dname} (random weights)", True, prompts)
    from dustin_eval.corpus import gutenberg_split, read_filler
    from dustin_runtime.pipeline import load_pair as load_checkpoints
    from dustin_runtime.tokenizer import eos_ids

    tgt, drf = load_checkpoints(cfg.target, cfg.draft, dtype=torch.bfloat16, device="cuda", tp=tp,
                                draft_vocab=cfg.draft_vocab)
    tgt.model.use_kernels(), drf.model.use_kernels()
    ids = tgt.tokenizer(read_filler(gutenberg_split("eval"), max_books=cfg.batch + 2),
                        add_special_tokens=False)["input_ids"]
    if len(ids) < cfg.batch * cfg.context:
        raise DustinError(f"the eval books hold {len(ids)} tokens, fewer than batch x context: use a smaller "
                          "--batch or --context")
    prompts = [ids[b * cfg.context:(b + 1) * cfg.context] for b in range(cfg.batch)]
    return Pair(tgt.model, drf.model, tgt.model_id, drf.model_id, False, prompts,
                tuple(eos_ids(tgt.tokenizer, tgt.model.cfg.eos_token_ids)))


def srh_heads(model_cfg, n: int) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """n retrieval KV heads (layer, kv_head, query heads) over 2 layers, at 1/3 and 2/3 depth."""
    layers = (model_cfg.num_layers // 3, (2 * model_cfg.num_layers) // 3)
    out = []
    for j in range(n):
        layer, g = layers[j % 2], (j // 2 * model_cfg.num_kv_heads) // max(1, (n + 1) // 2)
        out.append((layer, g % model_cfg.num_kv_heads, tuple(range(g * model_cfg.n_rep, (g + 1) * model_cfg.n_rep))))
    return tuple(out)


def sparse_config(cfg: E2EConfig, pair: Pair) -> SparseConfig:
    """The dustin set of the bench: `srh` target and `draft_srh` draft retrieval KV heads, m rows by
    the draft's lookahead (the same budget, sinks and window serve streamingllm and quest; `run_e2e`
    gives each policy a config at its `budget_of`)."""
    return SparseConfig(budget=cfg.budget_of(""), sinks=cfg.sinks, window=cfg.window, m=cfg.m,
                        draft_heads=srh_heads(pair.draft.cfg, cfg.draft_srh) if cfg.m else (),
                        target_heads=srh_heads(pair.target.cfg, cfg.srh), source="bench e2e")


# ---------------------------------------------------------------- runs


def _run(pair: Pair, eng: Engine, policy: str, cfg: E2EConfig, scfg: SparseConfig, counts: torch.Tensor | None,
         agree: torch.Tensor | None = None):
    from dustin_runtime.sparse.policies import make_policy

    tail = cfg.gamma + 1
    if policy == AR:
        pre = cfg.context - 1 if pair.random else None
        return generate(pair.target, pair.prompts, cfg.new_tokens, eos_ids=pair.eos, engine=eng, prefilled=pre)
    exact = split_exact(policy)[1]
    policy, sparse_draft, refresh = split_policy(policy)
    if sparse_draft:
        scfg = replace(scfg, draft_kv="verify-set")
    if refresh:
        scfg = replace(scfg, refresh_layers=cfg.refresh_layers)
    hooks = make_policy(policy, scfg if policy_class(policy).budgeted else None, target=pair.target, draft=pair.draft)
    pre = cfg.context - 1 - tail if pair.random else None
    return speculative_generate(pair.target, pair.draft, pair.prompts, cfg.new_tokens, gamma=cfg.gamma, hooks=hooks,
                                eos_ids=pair.eos, engine=eng, prefilled=pre,
                                replay=None if counts is None else AcceptReplay(counts), lookup=cfg.lookup(),
                                exact=exact, exact_replay=agree if exact.on and counts is not None else None)


@torch.inference_mode()
def time_phases(eng: Engine, reps: int) -> dict[str, float]:
    """Median ms of each captured phase graph of the engine's last loop, replayed alone (the
    lengths and bookkeeping a step changes are restored, untimed, before every replay)."""
    from dustin_eval.timing import events_ms

    st = eng.last
    if st is None or not st.graphs.captured:
        return {}
    restore = st.snapshot()
    out = {name: events_ms(graph.replay, reps, setup=restore)["median_ms"] for name, graph in st.graphs.graphs.items()}
    restore()
    return out


def byte_floor(pair: Pair, policy: str, cfg: E2EConfig, scfg: SparseConfig, copy_tbps: float) -> dict:
    """Bytes one step must read at least, and that over the copy bandwidth (ms): weights once per
    forward, the KV rows each attention reads, the retrieval heads' keys, and at each refresh layer
    the keys of every KV head over the context. Under tensor parallelism one rank's bytes: its
    shard of the target, its KV heads, its draft rows (the replicated draft's weights whole), the
    retrieval heads of the rank holding the most."""
    from dustin_runtime.tp import local_heads

    t, d, tp = pair.target.cfg, pair.draft.cfg, pair.target.tp
    P = 1 if tp is None else tp.world
    B, L, M, el, S = cfg.batch, cfg.context, cfg.gamma + 1, 2, cfg.budget_of(policy)
    w_t, w_d = pair.target.weight_bytes_read(), pair.draft.weight_bytes_read()
    kv_row_t = t.kv_bytes_per_token(el) // P  # K and V of one token, all layers, this rank's KV heads
    F = cfg.gamma  # draft forwards per step
    draft_step = F * (w_d + B // P * L * d.kv_bytes_per_token(el))
    if policy == AR:
        target = w_t + B * L * kv_row_t
        return {"bytes": target, "ms": target / (copy_tbps * 1e12) * 1e3}
    exact = split_exact(policy)[1]
    policy, sparse_draft, refresh = split_policy(policy)
    kd = t.head_dim  # key width the target's scorers read
    if sparse_draft:  # the draft reads the set, the commits and its drafts, not its cache
        draft_step = F * (w_d + B // P * (S + 2 * M) * d.kv_bytes_per_token(el))
    cls = policy_class(policy)
    if not cls.budgeted:
        target = w_t + B * L * kv_row_t
    else:
        target = w_t + B * (S + M) * kv_row_t
        if cls.needs_heads:  # each retrieval KV head's keys over the context, target and draft
            srh = max(len(local_heads(scfg.target_heads, tp, t, rank=r)) for r in range(P)) if tp else \
                len(scfg.target_heads)
            target += L * el * (B * srh * kd + B // P * len(scfg.draft_heads) * d.head_dim)
        if refresh:  # the keys of each refresh layer's (local) KV heads
            target += len(cfg.refresh_layers) * B * L * (t.num_kv_heads // P) * kd * el
        if cls.pages:  # min and max key per page of 16, every layer and KV head
            target += B * -(-L // scfg.page_size) * 2 * t.num_layers * t.kv_size // P * el
    if exact.on:  # a confirmation pass every K steps: the weights and every KV row of the context
        target += (w_t + B * L * kv_row_t) / exact.k
    total = draft_step + target
    return {"bytes": total, "ms": total / (copy_tbps * 1e12) * 1e3, "draft_bytes": draft_step,
            "draft_ms": draft_step / (copy_tbps * 1e12) * 1e3}


def _record(policy: str, res, source: str, phases: dict[str, float], floor: dict) -> dict:
    s = res.stats
    steps = max(s.steps, 1)
    per_phase = {k: v / steps * 1e3 for k, v in s.seconds.items() if k in ("draft", "select", "verify", "decode", "other",
                                                                                   "confirm")}
    graph_sum = sum(phases.values())
    return {
        "policy": policy,
        "acceptance_source": source,
        "mean_accepted": s.mean_accepted if s.mode == "speculative" else 0.0,
        "steps": s.steps,
        "new_tokens": sum(s.new_tokens),
        "ms_per_step": s.ms_per_step,
        "tokens_per_s": s.tokens_per_s,
        "phase_ms": per_phase,
        "graph_phase_ms": phases,
        "graph_phase_sum_ms": graph_sum,
        "confirm_pass_ms": phases.get("confirm"),  # exact mode: one confirmation pass (every K steps)
        "loop_over_graph_sum": s.ms_per_step / graph_sum if graph_sum else None,
        "byte_floor_ms": floor["ms"],
        "byte_floor_bytes": floor["bytes"],
        "fraction_of_byte_floor": floor["ms"] / s.ms_per_step if s.ms_per_step else None,
        "draft_phase_of_byte_floor": (floor["draft_ms"] / phases["draft"]) if "draft" in phases and
        "draft_ms" in floor else None,
        "cuda_graphs": s.cuda_graphs,
        "extra": {k: v for k, v in s.extra.items() if not isinstance(v, list)},
    }


def run_e2e(cfg: E2EConfig, command: str, on_record=None, tp=None) -> dict:
    """Every policy of `cfg` on one pair, one cache; returns the result record (`tp`: this rank's
    place in a tensor-parallel run of cfg.tp ranks)."""
    cfg.check()
    if not torch.cuda.is_available():
        raise DustinError("dustin bench e2e needs a CUDA GPU; on CPU, `make demo` checks correctness (the GPU "
                          "speeds measured are in RESULTS.md)")
    from dustin_eval.bench_attention import copy_bandwidth_tbps
    from dustin_eval.tp_cost import step_costs
    from dustin_runtime.io.provenance import environment

    if cfg.batch % (tp.world if tp else 1):
        raise DustinError(f"--batch {cfg.batch} does not divide over --tp {tp.world} (the draft splits the batch)")
    copy = copy_bandwidth_tbps()["tbps"]
    pair = load_pair(cfg, tp)
    eng = Engine(pair.target, pair.draft, graphs=True)
    max_steps = cfg.new_tokens + 1
    if pair.random:  # the caches hold `context` random rows; prefill runs only the last gamma + 1
        extra = max(split_exact(p)[1].rows(cfg.gamma) for p in cfg.policies)  # exact mode's pass
        tc, dc = eng.caches(cfg.batch, cache_capacity(pair.prompts, [cfg.new_tokens] * cfg.batch, cfg.gamma) + extra,
                            draft=True)
        g = torch.Generator(device=pair.target.device).manual_seed(cfg.seed)
        for t in tc.k + tc.v + dc.k + dc.v:
            t.normal_(0.0, 1.0, generator=g)
    source = cfg.acceptance if pair.random else "model"
    counts = replay_counts(cfg.acceptance, cfg.gamma, max_steps, cfg.batch, cfg.seed) if pair.random else None
    rows = max(split_exact(p)[1].rows(cfg.gamma) for p in cfg.policies)
    agree = agreement_counts(cfg.acceptance, rows, max_steps, cfg.batch, cfg.seed) if pair.random and rows else None
    at = {p: replace(cfg, budget=cfg.budget_of(p)) for p in cfg.policies}  # each policy's budget S
    sets = {p: sparse_config(c, pair) for p, c in at.items()}
    records = []
    for policy in cfg.policies:
        for _ in range(2):  # the first call captures the graphs, the second is timed
            res = _run(pair, eng, policy, at[policy], sets[policy], counts, agree)
        rec = _record(policy, res, AR if policy == AR else source, time_phases(eng, cfg.phase_reps),
                      byte_floor(pair, policy, at[policy], sets[policy], copy))
        rec["budget"] = None if policy == AR or not policy_class(split_policy(policy)[0]).budgeted else \
            at[policy].budget
        if tp is not None:
            rec["tp"] = step_costs(eng, tp, cfg.phase_reps)
        records.append(rec)
        if on_record:
            on_record(rec)
    sweep = []
    if pair.random and cfg.alphas:
        for alpha in cfg.alphas:
            c = geometric_counts(alpha, cfg.gamma, max_steps, cfg.batch, cfg.seed)
            for policy in cfg.policies:
                res = _run(pair, eng, policy, at[policy], sets[policy], None if policy == AR else c, agree)
                sweep.append({"alpha": alpha, "policy": policy, "tokens_per_s": res.stats.tokens_per_s,
                              "ms_per_step": res.stats.ms_per_step,
                              "mean_accepted": res.stats.mean_accepted if policy != AR else 0.0})
    by = {r["policy"]: r for r in records}
    summary = {}
    for r in records:
        s = {}
        if AR in by:
            s["speedup_vs_ar"] = r["tokens_per_s"] / by[AR]["tokens_per_s"]
        if "full" in by:
            s["speedup_vs_full"] = r["tokens_per_s"] / by["full"]["tokens_per_s"]
        plain = r["policy"].removesuffix(REFRESH)
        if r["policy"] != plain and plain in by:  # the refresh's cost: with it over without
            s["vs_no_refresh"] = r["tokens_per_s"] / by[plain]["tokens_per_s"]
        summary[r["policy"]] = s
    out = {
        "benchmark": "e2e",
        "config": asdict(cfg),
        "models": {"target": pair.target_id, "draft": pair.draft_id,
                   "target_params": pair.target.cfg.num_params(), "draft_params": pair.draft.cfg.num_params(),
                   "weights": "random (N(0, 0.02)), bf16" if pair.random else "checkpoint, bf16",
                   "draft_head_tokens": None if pair.draft.head_ids is None else int(pair.draft.head_ids.numel())},
        "shapes": {"batch": cfg.batch, "context": cfg.context, "gamma": cfg.gamma, "budget": budget_label(cfg),
                   "new_tokens": cfg.new_tokens, "capacity": eng.tcache.max_len},
        "sparse": {"sinks": cfg.sinks, "window": cfg.window, "m": cfg.m,
                   "target_heads": [list(h[:2]) for h in next(iter(sets.values())).target_heads],
                   "draft_heads": [list(h[:2]) for h in next(iter(sets.values())).draft_heads],
                   "refresh_layers": list(cfg.refresh_layers)},
        "copy_tbps": copy,
        "tp": None if tp is None else {"world": tp.world,
                                       "per_rank_target_params": sum(p.numel() for p in pair.target.parameters()),
                                       "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")},
        "records": records,
        "summary": summary,
        "alpha_sweep": sweep,
        "environment": environment(command),
    }
    del eng, pair
    gc.collect()
    torch.cuda.empty_cache()
    return out


def budget_label(cfg: E2EConfig) -> str:
    """The budgets S of a run's sparse policies: one number, or `-x` policies' apart ("512, -x 1024")."""
    sparse = [p for p in cfg.policies if p != AR and policy_class(split_policy(p)[0]).budgeted]
    lossy = sorted({cfg.budget_of(p) for p in sparse if not split_exact(p)[1].on})
    exact = sorted({cfg.budget_of(p) for p in sparse if split_exact(p)[1].on})
    if not exact or exact == lossy:
        return ", ".join(map(str, lossy or exact)) or "-"
    return ", ".join([*map(str, lossy), *(f"-x {b}" for b in exact)])


def result_path(out_dir: Path, res: dict) -> Path:
    c = res["config"]
    name = c["target"].rstrip("/").split("/")[-1].lower()
    tp = f"-tp{c['tp']}" if c.get("tp", 1) > 1 else ""
    dv = f"-dv{c['draft_vocab'].rpartition(':')[2]}" if c.get("draft_vocab") else ""  # vocabulary-subset draft head
    lk = ""
    if c.get("draft_lookup"):  # context lookup: -lookupMAX-MIN
        from dustin_runtime.lookup import LookupConfig

        lk = "-lookup" + LookupConfig.parse(c["draft_lookup"]).label().replace(":", "-")
    return Path(out_dir) / f"e2e-{name}-{c['context']}-{c['batch']}{tp}{dv}{lk}.json"


def write_result(res: dict, out_dir: Path) -> Path:
    path = atomic_write(result_path(out_dir, res), json.dumps(res, indent=2) + "\n")
    if res["alpha_sweep"]:
        plot_alpha(res, path.with_name(path.stem + "-alpha.png"))
    return path


def plot_alpha(res: dict, path: Path) -> Path:
    """Tokens/s against the replayed per-token acceptance alpha, one line per policy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for policy in res["config"]["policies"]:
        pts = [(r["alpha"], r["tokens_per_s"]) for r in res["alpha_sweep"] if r["policy"] == policy]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=policy)
    c = res["config"]
    ax.set_xlabel("per-token acceptance alpha (replayed)")
    ax.set_ylabel("tokens / s (whole batch)")
    ax.set_title(f"{c['target']}, batch {c['batch']}, context {c['context']}, gamma {c['gamma']}, "
                 f"S {res['shapes']['budget']}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    return path


def configs(batch: str, context: str, alphas: str, policy: str | None, refresh_layers: str, tp: int | None,
            **kw) -> list[E2EConfig]:
    """The runs of `dustin bench e2e`'s options: batch and context lists zipped (or one value
    repeated), the policies (default `POLICIES`), the alpha sweep; every config checked before a GPU
    is touched."""
    from dustin_profile.plan import parse_ints, parse_layers, parse_names
    from dustin_runtime.errors import MAX_COUNT

    if kw.get("draft_lookup") is not None and tp is not None:
        raise DustinError("--draft-lookup runs in one process (not under --tp)")
    batch, context = parse_ints(batch, "--batch", maximum=MAX_COUNT), parse_ints(context, "--context")
    kw.update(policies=tuple(parse_names(policy)) if policy else POLICIES,
              refresh_layers=parse_layers(refresh_layers) or ())
    try:
        al = tuple(float(x) for x in alphas.split(",") if x.strip())
    except ValueError:
        raise DustinError(f"--alphas {alphas!r}: expected comma-separated numbers") from None
    if len(batch) != len(context) and 1 not in (len(batch), len(context)):
        raise DustinError("--batch and --context: give lists of one length (zipped) or one value")
    n = max(len(batch), len(context))
    pairs = zip(list(batch) * n if len(batch) == 1 else batch, list(context) * n if len(context) == 1 else context,
                strict=True)
    out = [E2EConfig(batch=b, context=c, alphas=al, **kw) for b, c in pairs]
    for cfg in out:
        cfg.check()
    return out


def run_all(cfgs: list[E2EConfig], command: str, out_dir: Path, tp=None, on_record=None, on_result=None) -> None:
    """Every run of `configs` (under `tp`: this rank's place in a tensor-parallel run), each written
    to `out_dir` as soon as it is done; `on_result(result, path)` after each."""
    for cfg in cfgs:
        res = run_e2e(replace(cfg, tp=1 if tp is None else tp.world), command, tp=tp, on_record=on_record)
        path = write_result(res, out_dir)
        if on_result is not None:
            on_result(res, path)
