"""Batched speculative decoding (Leviathan et al. 2023) over static caches.

One step per batch, static shapes, no host sync inside, four phases (each eager or one CUDA
graph, `dustin_runtime.engine`):
  draft:  gamma draft forwards: [prev, cur] (two tokens: prev is the token before cur, whose
          K/V the draft lacks when the last step accepted every draft, since d_gamma is never fed;
          otherwise it is rewritten with the same token), then d_1, .., d_(gamma - 1);
  select: the verification policy's hook (nothing for full verification);
  verify: one target forward over [cur, d_1..d_gamma];
  accept: greedy matching or rejection sampling -> n accepted and the next token per sequence;
          both caches keep cur, d_1..d_n (length += n + 1; the draft's lacks d_gamma's row until the
          next step's first forward); rejected rows are dropped by length.

Under tensor parallelism (`target.tp`, `dustin_runtime.tp`) the target is sharded and the draft
replicated: each rank drafts its rows of the batch over its own draft cache and the drafted tokens
are all-gathered; verification and acceptance run on every rank over its vocabulary columns and
agree (`dustin_runtime.sampling`). A batch that does not divide by the world size is padded with
one-token prompts that make no tokens (no prefill; they ride along in the steps).
"""

from __future__ import annotations

import time

import torch

from dustin_runtime.attention import AttentionBackend, default_backend
from dustin_runtime.engine import Engine, default_engine
from dustin_runtime.errors import MAX_GAMMA, DustinError
from dustin_runtime.exact import ExactConfig, ExactLoop
from dustin_runtime.generate import (
    PREFILL_CHUNK,
    Bookkeeper,
    GenerationResult,
    cache_capacity,
    check_finite,
    check_prompts,
    prefill,
    start_steps,
    use_graphs,
)
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.lookup import ContextLookup, LookupConfig
from dustin_runtime.model import Transformer
from dustin_runtime.sampling import (
    SamplingConfig,
    probs_from_logits,
    sample,
    speculative_accept,
    vocab_shard,
)
from dustin_runtime.sparse.measures import PER_SEQUENCE
from dustin_runtime.stats import DecodeStats, PhaseTimer


class SpecHooks:
    """Where a verification policy plugs into the loop. The default is full verification: the
    target's backend attends over the whole cache and no hook does anything.

    Hooks run inside the loop's phases, so they follow the engine's rules (`dustin_runtime.engine`):
    no host sync, state that outlives a step updated in place. A policy whose `key()` is not None
    can be cached by an engine and run as CUDA graphs: an equal policy in a later call (same key)
    is replaced by the cached one, whose buffers the graphs hold, after its `reset()`."""

    name = "full"
    exact = ExactConfig()  # the policy's exact mode (a policy name with the -x suffix: `exact.split_exact`)
    selects = False  # `before_verify` does work (a selection phase between drafting and verification)

    def key(self) -> tuple | None:
        """What determines the policy's captured work (None: not cacheable, run eagerly)."""
        return (type(self).__name__,) if type(self) is SpecHooks else None

    def target_backend(self, default: AttentionBackend) -> AttentionBackend:
        """The backend for the target's prefill and verification passes."""
        return default

    def draft_backend(self, default: AttentionBackend) -> AttentionBackend:
        """The backend for the draft's prefill and drafting passes."""
        return default

    def setup(self, target_cache: KVCache, draft_cache: KVCache, gamma: int) -> None:
        """Called once when the loop's buffers are built, before the first prefill."""

    def reset(self) -> None:
        """Called at the start of every call (the run statistics start again)."""

    def prefill_tail(self, gamma: int) -> int:
        """How many trailing prompt tokens prefill should process as their own final chunk."""
        return 0

    def after_prefill(self) -> None:
        """Called once after prefill, before the first step (eager)."""

    def before_draft(self) -> None:
        """Called before each drafting phase."""

    def drafted(self, tokens: torch.Tensor) -> None:
        """Called after drafting with this step's verification tokens [B, gamma + 1] (cur, d_1..d_gamma)."""

    def before_verify(self) -> None:
        """Called between drafting and verification (selection happens here)."""

    def after_verify(self, accepted: torch.Tensor, advance: torch.Tensor) -> None:
        """Called after acceptance with n [B] and the committed advance [B] (0 for finished ones)."""

    def set_before_drafts(self) -> bool:
        """Whether the verification set of a step is chosen from what precedes the step's drafts (exact
        sampling needs it: `dustin_runtime.exact`)."""
        return True

    def rolled_back(self, lengths: torch.Tensor) -> None:
        """Exact mode's confirmation pass cut the target cache back to lengths [B] (rows past them
        are gone: a policy drops what it keeps of them). Inside a phase (no host sync)."""

    def shadow_backend(self, default: AttentionBackend) -> AttentionBackend | None:
        """A second draft backend whose drafts of each step the policy wants to see beside the real
        ones (paired drafting: the same context drafted another way), or None (the default). The loop
        drafts with it first (greedy, its cache rows rewritten by the real drafting after it) and hands
        the tokens to `shadow_drafted`."""
        return None

    def shadow_drafted(self, tokens: torch.Tensor) -> None:
        """The shadow drafting's verification tokens [B, gamma + 1] (cur, e_1..e_gamma) of this step."""

    def summary(self) -> dict:
        """Policy-specific statistics added to the run's stats."""
        return {}


def _common_vocab(target: Transformer, draft: Transformer) -> int:
    return min(target.cfg.vocab_size, draft.cfg.vocab_size)


class AcceptReplay:
    """Replayed acceptance: per-step accepted-draft counts [steps, B] that replace the accept
    decision (drafting, selection, verification and the cache advance run as usual; the token
    after the accepted drafts is the target's, as in a real run). Used to time the loop with
    random weights, which accept nothing, at a realistic acceptance (`dustin bench e2e`)."""

    def __init__(self, counts: torch.Tensor):
        self.counts = counts  # [steps, B] int64 (cpu or device)


@torch.inference_mode()
def check_gamma(gamma: int, prompts: list[list[int]], limit: int) -> None:
    """Refuse a gamma above MAX_GAMMA or above the positions the models have left after a prompt."""
    if gamma > MAX_GAMMA:
        raise DustinError(f"--gamma {gamma} is above {MAX_GAMMA} draft tokens per step")
    longest = max(len(p) for p in prompts)
    if gamma > limit - longest:
        raise DustinError(f"--gamma {gamma} drafts past the models' {limit} positions: a prompt of {longest} tokens "
                          f"leaves {limit - longest}")


def speculative_generate(
    target: Transformer,
    draft: Transformer,
    prompts: list[list[int]],
    max_new_tokens: int | list[int],
    *,
    gamma: int = 4,
    sampling: SamplingConfig = SamplingConfig(),
    eos_ids: tuple[int, ...] = (),
    hooks: SpecHooks | None = None,
    seed: int = 0,
    prefill_chunk: int = PREFILL_CHUNK,
    min_new_tokens: int = 0,
    prefilled: tuple[KVCache, KVCache, int] | int | None = None,
    replay: AcceptReplay | None = None,
    cuda_graphs: bool | None = None,
    engine: Engine | None = None,
    lookup: LookupConfig | None = None,
    exact: ExactConfig = ExactConfig(),
    exact_replay: torch.Tensor | None = None,
) -> GenerationResult:
    """Speculative decoding of a batch of prompts of any lengths with ragged acceptance (EOS ids
    are forbidden before `min_new_tokens` new tokens, in the draft and the target alike).

    `prefilled` = (target cache, draft cache, rows): the first `rows` tokens of every prompt already
    prefilled with the plain backend (shared by several runs); they are copied and prefill goes on
    from there, exactly as if it had started from zero. `prefilled` = rows (an int): the engine's
    own caches (`engine.caches`) already hold them. `replay` overrides the accept decision.
    `lookup`: draft tokens copied from each sequence's history where it repeats (`dustin_runtime.lookup`).
    `exact`: greedy exact mode, a full-attention confirmation pass every K steps (`dustin_runtime.exact`);
    `exact_replay` [passes, B] forces how many provisional tokens each pass confirms (bench e2e).
    On CUDA the phases run as CUDA graphs unless `cuda_graphs` is False or the policy is not
    cacheable (side measurements, traces); `engine` defaults to the model pair's."""
    if gamma < 1:
        raise DustinError("gamma must be >= 1")
    hooks = hooks or SpecHooks()
    exact = exact if exact.on else hooks.exact
    if exact.on and not sampling.greedy and (target.tp is not None or not hooks.set_before_drafts()):
        raise DustinError(f"--exact with sampling needs a verification set chosen before the step's drafts, in one "
                          f"process (full, streamingllm, target-only, dustin without draft heads or refresh "
                          f"layers), not {hooks.name}; or decode greedily")
    if target.device != draft.device:
        raise DustinError("target and draft must be on the same device")
    max_new = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    check_prompts(prompts, max_new, target, extra=gamma + 1)
    check_prompts(prompts, max_new, draft, extra=gamma + 1)
    check_gamma(gamma, prompts, min(target.cfg.max_position_embeddings, draft.cfg.max_position_embeddings))
    tp, asked = target.tp, len(prompts)
    pad = 0 if tp is None else -asked % tp.world
    if pad:  # the draft splits the batch over ranks
        if isinstance(prefilled, tuple):
            raise DustinError(f"a batch of {asked} prefilled sequences does not divide over --tp {tp.world}")
        prompts, max_new = prompts + [prompts[-1][-1:]] * pad, max_new + [0] * pad
    device, B, V = target.device, len(prompts), _common_vocab(target, draft)
    pkey = hooks.key()
    graphs = use_graphs(cuda_graphs, device, pkey is not None)
    if engine is None:
        engine = default_engine(target, draft) if graphs else Engine(target, draft)
    timer = PhaseTimer(device)
    t0 = time.perf_counter()
    tcache, dcache = engine.caches(B, cache_capacity(prompts, max_new, gamma) + exact.rows(gamma), draft=True)
    if lookup is not None and tp is not None:
        raise DustinError("--draft-lookup runs in one process (not under --tp)")
    key = None if pkey is None else ("spec", B, tcache.max_len, gamma, sampling, min_new_tokens,
                                     tuple(sorted(set(eos_ids))), replay is not None, lookup, pkey,
                                     exact, exact_replay is not None)

    def build(st):
        st.objs["hooks"] = hooks
        st.objs["loop"] = _SpecLoop(target, draft, tcache, dcache, hooks, gamma, sampling, eos_ids, min_new_tokens,
                                    st.generator, V, replay is not None, lookup, exact, exact_replay is not None)
        loop = st.objs["loop"]
        book = loop.book
        st.mutable = [tcache.lengths, dcache.lengths, loop.cur, loop.prev, book.produced, book.done, book.step]
        if loop.lookup is not None:
            st.mutable += [loop.lookup.hist, loop.lookup.ptr, loop.lookup.counts]
        if loop.exact is not None:
            st.mutable += loop.exact.mutable

    st = engine.state(key, build, graphs=graphs, sampled=not sampling.greedy)
    hooks, loop = st.objs["hooks"], st.objs["loop"]
    st.generator.manual_seed(seed)
    loop.book.reset(max_new)
    if replay is not None:
        loop.load_replay(replay.counts)
    if loop.lookup is not None:
        loop.lookup.load(prompts)
    hooks.reset()
    start = 0
    if isinstance(prefilled, tuple):  # caches of the whole batch (the draft's: this rank's rows of it)
        start = prefilled[2]
        for dst, src, rows in zip((tcache, dcache), prefilled[:2], (slice(None), loop.rows), strict=True):
            for a, b in zip(dst.k + dst.v, src.k + src.v, strict=True):
                a[:, :, :start].copy_(b[rows, :, :start])
    elif prefilled is not None:
        start = prefilled
    for c in (tcache, dcache):
        c.lengths.fill_(start)
    with timer.phase("prefill"):
        tail = hooks.prefill_tail(gamma)
        prefill(target, tcache, prompts, loop.t_backend, chunk=prefill_chunk, tail=tail, start=start)
        prefill(draft, dcache, prompts[loop.rows], loop.d_backend, chunk=prefill_chunk, tail=tail, start=start)
        hooks.after_prefill()
    loop.cur.copy_(torch.tensor([p[-1] for p in prompts]))
    loop.prev.copy_(torch.tensor([p[-2] if len(p) > 1 else p[-1] for p in prompts]))
    if loop.exact is not None:
        loop.exact.load(prompts, tcache.lengths)
        if exact_replay is not None:
            loop.exact.load_replay(exact_replay)
    steps, since, t_steps = 0, 0, start_steps(device)
    while True:
        if loop.book.all_done():
            if not since:  # exact mode: nothing provisional left (or exact mode off)
                break
            since = exact.k  # every sequence stopped inside the block: confirm now
        elif since < exact.k or not exact.on:
            for phase, fn in loop.phases.items():
                if phase == "accept" and steps == 0:  # the first step's logits, once a call
                    check_finite(loop.step["logits"], target, "the target")
                    check_finite(loop.step["draft_logits"], draft, "the draft")
                with timer.phase("other" if phase == "accept" else phase):
                    st.graphs.run(phase, fn)
            steps, since = steps + 1, since + exact.on
        if exact.on and since >= exact.k:
            with timer.phase("confirm"):
                st.graphs.run("confirm", loop.exact.confirm_phase)
            loop.exact.passes, since = loop.exact.passes + 1, 0
    seconds = {"steps": time.perf_counter() - t_steps}
    tokens, reasons = loop.book.results(max_new)
    seconds.update(timer.totals())
    seconds["total"] = time.perf_counter() - t0
    extra = {k: v[:asked] if k.endswith(PER_SEQUENCE) else v for k, v in hooks.summary().items()}
    if loop.lookup is not None:
        extra.update(loop.lookup.summary())
    if loop.exact is not None:
        extra.update(loop.exact.summary(asked))
    stats = DecodeStats(
        mode="speculative",
        batch=asked,
        prompt_tokens=[len(p) for p in prompts[:asked]],
        new_tokens=[len(t) for t in tokens[:asked]],
        steps=steps,
        gamma=gamma,
        seconds=seconds,
        accepted=[row[:asked] for row in loop.book.accepted_rows(steps)],
        policy=hooks.name,
        extra=extra,
        cuda_graphs=st.graphs.enabled,
        accept_source="replayed" if replay is not None else "model",
    )
    return GenerationResult(tokens[:asked], reasons[:asked], stats)


class _SpecLoop:
    """The phases of one speculative step over static buffers (see the module docstring). Under
    tensor parallelism the draft runs this rank's `rows` of the batch and the target's logits hold
    its vocabulary columns (`shard`)."""

    def __init__(self, target, draft, tcache, dcache, hooks, gamma, sampling, eos_ids, min_new, generator, V,
                 replayed: bool, lookup: LookupConfig | None = None, exact: ExactConfig = ExactConfig(),
                 exact_replayed: bool = False):
        device, B = target.device, tcache.batch
        self.target, self.draft, self.tcache, self.dcache, self.hooks = target, draft, tcache, dcache, hooks
        self.gamma, self.sampling, self.gen, self.V = gamma, sampling, generator, V
        self.tp, self.shard = target.tp, vocab_shard(target, V)
        self.drows = None if self.tp is None else self.tp.rows(B)  # the draft's rows (None: all)
        self.rows = self.drows or slice(None)
        self.eos = None if self.shard is None else self.shard.columns(sorted(set(eos_ids))).to(device)
        hooks.setup(tcache, dcache, gamma)  # first: the backends a policy wraps depend on its setup
        base = default_backend(device)
        self.t_backend, self.d_backend = hooks.target_backend(base), hooks.draft_backend(base)
        self.shadow = hooks.shadow_backend(base)
        if self.shadow is not None and (not sampling.greedy or self.tp is not None):
            raise DustinError("paired drafting (a shadow draft beside the real one) needs greedy decoding in one "
                              "process")
        steps = tcache.max_len * max(exact.k, 1) + exact.k  # exact mode: a pass confirms one token at least
        self.book = Bookkeeper(B, tcache.max_len, gamma + 1, eos_ids, device, min_new, steps=steps)
        self.cur = torch.zeros(B, dtype=torch.long, device=device)  # [B] the last committed token
        self.prev = torch.zeros(B, dtype=torch.long, device=device)  # [B] the token before it (cur at length 0)
        self.replay = torch.zeros(steps + 1, B, dtype=torch.long, device=device) if replayed else None
        self.lookup = None if lookup is None else ContextLookup(lookup, B, tcache.max_len + gamma + 2, device)
        self.exact = ExactLoop(exact, self, base, device, exact_replayed) if exact.on else None
        self.step: dict[str, torch.Tensor] = {}  # values passed between the phases of one step
        self.phases = {"draft": self.draft_phase, "select": hooks.before_verify, "verify": self.verify_phase,
                       "accept": self.accept_phase}
        if not hooks.selects:  # nothing to run between drafting and verification (and no empty graph)
            del self.phases["select"]

    def load_replay(self, counts: torch.Tensor) -> None:
        """Replayed accepted counts [steps, B] for this call (clamped to [0, gamma]; the last row
        repeats if the call runs longer)."""
        n = self.replay.shape[0]
        c = counts.to(self.replay.device, torch.long).clamp(0, self.gamma)[:n]
        self.replay[: c.shape[0]].copy_(c)
        self.replay[c.shape[0]:].copy_(c[-1:].expand(n - c.shape[0], -1))

    def draft_phase(self) -> None:
        """gamma draft forwards, the first over [prev, cur] from length L - 1 (module docstring), with
        the token choice of each; the draft's cache ends at L + gamma (d_gamma is never fed). A shadow
        drafting (`SpecHooks.shadow_backend`) runs first over the same rows, which the real one rewrites."""
        if self.shadow is not None:
            e, _ = self._draft(self.shadow, shadow=True)
            self.hooks.shadow_drafted(torch.cat([self.cur.view(-1, 1), e], dim=1))
        self.hooks.before_draft()
        d, qs = self._draft(self.d_backend)
        self.step.update(d=d, vt=torch.cat([self.cur.view(-1, 1), d], dim=1),  # [B, gamma + 1]
                         q=torch.stack(qs, dim=1) if qs else None)
        self.hooks.drafted(self.step["vt"])

    def _draft(self, backend: AttentionBackend, shadow: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The gamma forwards through `backend`: drafts [B, gamma] and, when sampling, their
        distributions (one [b, V] per draft); a `shadow` drafting is left out of the lookup's counts."""
        L = self.tcache.lengths[self.rows]  # [b] committed rows (cur sits at L)
        self.dcache.set_lengths((L - 1).clamp_min(0))  # at L = 0 (a one-token prompt): [cur, cur] from 0
        tok = torch.stack([self.prev[self.rows], self.cur[self.rows]], dim=1)  # [b, 2]
        drafted, qs = [], []
        if self.lookup is not None:
            self.lookup.begin()
        for i in range(self.gamma):
            logits = self.draft(tok, self.dcache, backend, phase="draft", logits="last")[..., : self.V]
            logits = self.book.mask_early_stops(logits, offset=i, rows=self.drows)[:, -1]
            if i == 0:
                self.dcache.set_lengths(L + 1)
            else:
                self.dcache.advance(1)
            if self.sampling.greedy:
                nxt = logits.argmax(-1)
            else:
                q = probs_from_logits(logits, self.sampling)
                nxt = sample(q, self.gen, rows=self.drows, batch=self.tcache.batch)
            if self.lookup is not None:  # a copy from the sequence's history where it repeats (one-hot q)
                nxt, hit = self.lookup.draft(L + i, nxt, self.V, self.book.done, counted=not shadow)
                if not self.sampling.greedy:
                    q = torch.where(hit.view(-1, 1), torch.nn.functional.one_hot(nxt, q.shape[-1]).to(q.dtype), q)
            if not self.sampling.greedy:
                qs.append(q)
            drafted.append(nxt)
            tok = nxt.view(-1, 1)
        d = torch.stack(drafted, dim=1)  # [B, gamma] (under TP: this rank's rows, then all of them)
        if not shadow:
            self.step["draft_logits"] = logits  # [b, V] the last draft's (checked on the first step)
        if self.tp is not None:
            d = self.tp.gather_rows(d)
        return d, qs

    def verify_phase(self) -> None:
        logits = self.target(self.step["vt"], self.tcache, self.t_backend, phase="verify", local_vocab=True)
        logits = logits[..., : self.V] if self.shard is None else self.shard.cut(logits)
        self.step["logits"] = self.book.mask_early_stops(logits, eos=self.eos)  # [B, gamma + 1, V]

    def accept_phase(self) -> None:
        """Acceptance, emission and the ragged advance of both caches."""
        d = self.step["d"]
        forced = None if self.replay is None else self.replay.index_select(0, self.book.step).view(-1)
        n, nxt = speculative_accept(d, self.step["q"], self.step["logits"], self.sampling, self.gen, forced=forced,
                                    shard=self.shard, rows=self.drows)
        emitted = torch.cat([d, torch.zeros_like(nxt).view(-1, 1)], dim=1)
        emitted.scatter_(1, n.view(-1, 1), nxt.view(-1, 1))  # [B, gamma + 1]
        advance = self.book.emit(emitted, n + 1)
        if self.exact is not None:  # provisional until a confirmation pass
            self.exact.record(emitted, n, advance, self.tcache.lengths, self.step["logits"])
        self.tcache.advance(advance.to(torch.int32))
        self.dcache.set_lengths(self.tcache.lengths[self.rows])
        live = advance > 0
        self.prev.copy_(torch.where(live, self.step["vt"].gather(1, n.view(-1, 1)).view(-1), self.prev))
        self.cur.copy_(torch.where(live, nxt, self.cur))
        if self.lookup is not None:  # cur sits at the new length (the accepted drafts are already in place)
            self.lookup.write(self.tcache.lengths, self.cur)
        self.hooks.after_verify(n, advance)
