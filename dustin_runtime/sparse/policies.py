"""Verification policies behind one interface (`SpecHooks`), built by `make_policy(name, ...)`;
`POLICY_CLASSES` maps each name to its class, whose traits (`Policy`) the planner, the harnesses
and the benches read without building one.

- `full`: lossless speculative decoding, the target attends over the whole cache.
- `dustin`: sinks + window + top-m by the draft lookahead signal + fill to S by the target history
  signal (the profile's heads and m), one set per sequence for every target layer and head.
- `draft-only`: every draft KV head's lookahead signal chooses every free row (m = S - sinks -
  window), as the profiler's baseline of that name.
- `target-only`: every target KV head's history signal chooses every free row (m = 0), likewise.
- `streamingllm`: sinks + the most recent S - sinks rows (the window widened to the budget).
- `quest`: per layer and KV head, sinks + window + whole pages of 16 rows ranked by the upper
  bound of q . k (maxed over the group's query heads and the gamma + 1 queries), same S.
- `oracle`: sinks + window + the top rows of the true mean attention of this very verification
  (a full side pass measures it first). An upper bound for analysis, not a fast path.

In every sparse policy the gamma + 1 new tokens are attended on top of the set (causally), their
K/V land in the full cache, nothing is evicted, and rejected rows are rolled back by length as in
full verification. All policies (`full` included) prefill the last gamma + 1 prompt tokens as their
own chunk, so every policy starts from the same cache. Draft and target must share a tokenizer
(positions align): `pipeline.load_pair` and the profile's tokenizer hashes check it.

Under tensor parallelism (`target.tp`) each rank scores with the target retrieval heads on its own
KV heads (`tp.local_heads`) and the draft's lookahead over its own draft rows; the lookahead
signal is all-gathered and the history summed over ranks: every rank selects the same [B, S] set.
Quest's sets are per KV head already; ARR is averaged over ranks.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dustin_runtime.attention import AttentionBackend, ForwardContext
from dustin_runtime.errors import DustinError
from dustin_runtime.exact import SUFFIX, split_exact
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.model import Transformer
from dustin_runtime.ops import SparseOps, default_ops, kernels
from dustin_runtime.sparse.config import SparseConfig, every_head
from dustin_runtime.sparse.measures import ArrMeter, PairedAcceptance, TrueAttention
from dustin_runtime.sparse.selection import QuestPages, quest_indices, streaming_indices
from dustin_runtime.sparse.signals import DraftLookahead, TargetHistory, normalise_
from dustin_runtime.speculative import SpecHooks
from dustin_runtime.tp import local_heads


class Policy(SpecHooks):
    """A verification policy's traits, class attributes read without building one."""

    name = "policy"
    budgeted = True  # verifies over a set of S context rows (False: the whole cache)
    one_set = True  # one set per sequence, chosen before the pass: the draft can draft over it (verify-set)
    needs_heads = False  # chooses by the config's retrieval heads (a profile's, or --all-heads)
    refreshes = False  # its set can be chosen again at refresh layers inside the pass
    pages = False  # keeps per-page key bounds of every layer and KV head (Quest)


class FullPolicy(Policy):
    """Full verification (lossless). ARR is 1 and the paired measures are trivial by definition."""

    name = "full"
    budgeted = False
    one_set = False

    def __init__(self, measure_arr: bool = False, paired: bool = False):
        self.measure_arr, self.paired = measure_arr, paired
        self.steps = self.accepted = None

    def key(self):
        return None if self.paired else ("full", self.measure_arr)

    def reset(self):
        self.steps = self.accepted = None

    def prefill_tail(self, gamma: int) -> int:
        return gamma + 1

    def after_verify(self, accepted, advance):
        if self.paired:
            live = advance > 0
            self.steps = live.sum() + (0 if self.steps is None else self.steps)
            self.accepted = ((accepted + 1) * live).sum() + (0 if self.accepted is None else self.accepted)

    def summary(self) -> dict:
        out = {"arr": 1.0} if self.measure_arr else {}
        if self.paired and self.steps is not None:
            tau = float(self.accepted) / max(int(self.steps), 1)
            out.update(full_tau=tau, paired_retention=1.0, agree=1.0)
        return out


class _TargetBackend(AttentionBackend):
    """Full attention for prefill (the tail feeds the policy's history), the policy's sparse
    attention for verification passes."""

    def __init__(self, policy: SparsePolicy, default: AttentionBackend):
        self.policy, self.default = policy, default

    def begin(self, ctx: ForwardContext) -> None:
        self.default.begin(ctx)

    def attend(self, layer, q, cache, ctx):
        if ctx.phase == "verify":
            return self.policy.verify_attend(layer, q, cache, ctx)
        out = self.default.attend(layer, q, cache, ctx)
        if ctx.phase == "prefill" and ctx.final:
            self.policy.observe_prefill_tail(layer, q, cache, ctx)
        return out

    def end(self, ctx: ForwardContext) -> None:
        if ctx.phase == "verify":
            self.policy.join()
        self.default.end(ctx)


class _DraftBackend(AttentionBackend):
    """The draft's attention while drafting: the default backend over its whole cache, or (sparse
    drafting) `sparse_verify_attention` over the policy's draft set; the queries of the lookahead's
    retrieval heads are stashed."""

    def __init__(self, policy: SparsePolicy, default: AttentionBackend):
        self.policy, self.default = policy, default
        self.slot = -1
        policy.drafting = self

    def begin(self, ctx):
        self.default.begin(ctx)
        if ctx.phase == "draft":
            self.slot += 1  # the forward's index in this step's drafting (`SparsePolicy.before_draft` resets it)
            if self.policy.draft_set is not None:
                self.policy.draft_set.drafted(ctx.start, self.policy.tcache.lengths[self.policy.rows])

    def attend(self, layer, q, cache, ctx):
        p = self.policy
        if ctx.phase == "draft" and p.draft_set is not None:
            out = p.ops.sparse_verify_attention(q, cache.k[layer], cache.v[layer], p.draft_set.idx, ctx.start)
        else:
            out = self.default.attend(layer, q, cache, ctx)
        if ctx.phase == "draft":
            p.observe_draft(layer, q, self.slot)
        return out

    def attend_qkv(self, layer, qkv, rope, num_heads, cache, ctx):
        """Sparse drafting on CUDA: RoPE, the cache write and the attention over the draft set in one
        kernel (`sparse_verify_attention_rope`); the RoPE'd queries it writes feed the lookahead."""
        p = self.policy
        k, v = cache.k[layer], cache.v[layer]
        if ctx.phase != "draft" or p.draft_set is None or not p.ops.triton or qkv.dtype != k.dtype:
            return None
        out, q = kernels.sparse_verify_attention_rope(qkv, rope, k, v, p.draft_set.idx, ctx.start, num_heads)
        p.observe_draft(layer, q, self.slot)
        return out

    def end(self, ctx):
        if ctx.phase == "draft":
            self.policy.join()
        self.default.end(ctx)


class DraftSet:
    """What the draft attends while drafting with `draft_kv="verify-set"`, one [B, S + 2 gamma + 1]
    int32 row set per sequence (-1 = none): the latest verification set (chosen at context L0),
    the rows committed since ([L0, min(L, start)), at most gamma + 1) and this step's drafts already
    written ([L, start) at a forward from row `start`; the forward's own tokens are the kernel's new
    tokens: the first forward of a step starts at L - 1, its [prev, cur])."""

    def __init__(self, batch: int, budget: int, gamma: int, device):
        self.S, self.W, self.gamma = budget, gamma + 1, gamma
        self.idx = torch.full((batch, budget + 2 * gamma + 1), -1, dtype=torch.int32, device=device)
        self.set_lens = torch.zeros(batch, dtype=torch.int32, device=device)  # L0 of the latest set
        self.j = torch.arange(max(self.W, gamma), dtype=torch.int32, device=device)

    def chosen(self, indices: torch.Tensor, lens: torch.Tensor) -> None:
        """A verification set indices [B, S] was chosen at context lengths lens [B]."""
        self.idx[:, : self.S].copy_(indices)
        self.set_lens.copy_(lens)

    def cut(self, lens: torch.Tensor) -> None:
        """Drop the set's rows at or past lens [B] (a rollback; its rows since L0 follow the lengths)."""
        self.idx[:, : self.S].masked_fill_(self.idx[:, : self.S] >= lens.view(-1, 1), -1)
        torch.minimum(self.set_lens, lens, out=self.set_lens)

    def drafted(self, start: torch.Tensor, lens: torch.Tensor) -> None:
        """Before a draft forward at rows start [B] of a step at context lengths lens [B]."""
        W, g = self.W, self.gamma
        since = self.set_lens.view(-1, 1) + self.j[:W]  # [B, W]
        upto = torch.minimum(lens, start).view(-1, 1)  # rows from `start` on are the forward's own
        self.idx[:, self.S: self.S + W].copy_(torch.where(since < upto, since, -1))
        mine = lens.view(-1, 1) + self.j[:g]  # [B, gamma]
        self.idx[:, self.S + W:].copy_(torch.where(mine < start.view(-1, 1), mine, -1))


class SparsePolicy(Policy):
    """Base of the sparse policies: the [B, S] index buffer, the sparse verification backend and
    the optional side measurements (`measure_arr`: ARR; `paired`: what full verification accepts
    on the same drafts), both from one full side pass per step (`arr.TrueAttention`). Subclasses
    fill `self.indices` in `select` (or per layer in `layer_indices`). With `layer_sets` the layers
    attend different sets and ARR is measured layer by layer. `trace`, when a list, receives
    (layer or None, lengths, indices) copies of every set chosen (a test hook): once per step for
    one set, once per layer otherwise."""

    name = "sparse"
    needs_true_attention = False  # the oracle ranks by it

    def __init__(self, cfg: SparseConfig, target: Transformer, draft: Transformer, *, measure_arr: bool = False,
                 paired: bool = False, ops: SparseOps | None = None):
        cfg.check_models(target.cfg, draft.cfg)
        self.cfg, self.target, self.draft = cfg, target, draft
        self.ops = ops or default_ops(target.device)
        self.measure_arr, self.paired = measure_arr, paired
        self.meter: ArrMeter | None = None
        self.pairs: PairedAcceptance | None = None
        self.trace: list | None = None
        self.vocab = min(target.cfg.vocab_size, draft.cfg.vocab_size)
        self.draft_set: DraftSet | None = None
        self.layer_sets = not self.one_set  # the layers attend different sets
        self.drafting: _DraftBackend | None = None  # the draft backend, once built
        self.shadow_tokens: torch.Tensor | None = None  # this step's shadow drafts (paired drafting)
        self.tp = target.tp
        if cfg.draft_kv == "verify-set" and not self.one_set:
            raise DustinError(f"policy {self.name} chooses a set per layer and KV head: the draft cannot draft "
                              f"over it (use --draft-kv full)")

    def key(self):
        """Cacheable (and run as CUDA graphs) unless a side pass or a trace needs the host."""
        if self.measure_arr or self.paired or self.needs_true_attention or self.trace is not None:
            return None
        return (self.name, self.cfg)

    def setup(self, target_cache: KVCache, draft_cache: KVCache, gamma: int) -> None:
        self.tcache, self.dcache, self.gamma = target_cache, draft_cache, gamma
        B, dev = target_cache.batch, target_cache.lengths.device
        self.rows = slice(None) if self.tp is None else self.tp.rows(B)  # the draft's rows of the batch
        self.indices = torch.full((B, self.cfg.budget), -1, dtype=torch.int32, device=dev)  # [B, S]
        self.meter = ArrMeter(B, target_cache.num_layers, dev, self.tp) if self.measure_arr else None
        self.pairs = PairedAcceptance(B, dev) if self.paired else None
        self.true = None
        if self.measure_arr or self.paired or self.needs_true_attention:
            self.true = TrueAttention(B, target_cache.max_len, target_cache.num_layers, target_cache.k[0].shape[1],
                                      dev, per_layer=self.measure_arr and self.layer_sets)
        self.allocate(B, target_cache.max_len, dev)
        if self.cfg.draft_kv == "verify-set":
            self.draft_set = DraftSet(draft_cache.batch, self.cfg.budget, gamma, dev)

    @property
    def selects(self) -> bool:
        return self.one_set or self.true is not None

    def allocate(self, batch: int, max_len: int, device) -> None:
        """Buffers of a subclass (built once; reused by every call of a cached policy)."""

    def reset(self) -> None:
        self.shadow_tokens = None
        if self.meter is not None:
            self.meter.reset()
        if self.pairs is not None:
            self.pairs.reset()

    def prefill_tail(self, gamma: int) -> int:
        return gamma + 1

    def target_backend(self, default: AttentionBackend) -> AttentionBackend:
        return _TargetBackend(self, default)

    def draft_backend(self, default: AttentionBackend) -> AttentionBackend:
        return _DraftBackend(self, default) if self.draft_set is not None else default

    def before_draft(self) -> None:
        if self.drafting is not None:
            self.drafting.slot = -1

    def after_prefill(self) -> None:
        if self.draft_set is not None:  # the first step drafts over a set chosen from the prefill's signals,
            lens = (self.tcache.lengths - 1).clamp_min(0)  # over [0, L - 1): its first forward starts at L - 1
            self.select(lens)
            self.draft_set.chosen(self.indices[self.rows], lens[self.rows])

    def drafted(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def rolled_back(self, lengths: torch.Tensor) -> None:
        """The draft set keeps no row past the new lengths (exact mode's confirmation pass)."""
        if self.draft_set is not None:
            self.draft_set.cut(lengths[self.rows])

    def shadow_backend(self, default: AttentionBackend) -> AttentionBackend | None:
        """Paired drafting: with `paired` and sparse drafting, each step is also drafted over the
        draft's whole cache (the plain backend), and full verification of those drafts is measured."""
        return default if self.paired and self.draft_set is not None and self.tp is None else None

    def shadow_drafted(self, tokens: torch.Tensor) -> None:
        self.shadow_tokens = tokens

    def before_verify(self) -> None:
        if self.pairs is not None and self.shadow_tokens is not None:  # first: the true pass below is the one kept
            logits = self.target(self.shadow_tokens, self.tcache, self.true, phase="verify", logits="all")
            self.pairs.measure_shadow(logits[..., : self.vocab], self.shadow_tokens)
        if self.true is not None:  # full verification on the side (its K/V rows are rewritten by the sparse pass)
            logits = self.target(self.tokens, self.tcache, self.true, phase="verify",
                                 logits="all" if self.pairs is not None else "none")
            if self.pairs is not None:
                self.pairs.measure(logits[..., : self.vocab], self.tokens)
        if self.one_set:
            self.select(self.tcache.lengths)
            if self.draft_set is not None:
                self.draft_set.chosen(self.indices[self.rows], self.tcache.lengths[self.rows])
            if self.trace is not None and not self.layer_sets:
                self.trace.append((None, self.tcache.lengths.clone(), self.indices.clone()))
        if self.meter is not None:
            if self.layer_sets:
                self.meter.begin_layers()
            else:
                self.meter.shared(self.true, self.indices)

    def select(self, lens: torch.Tensor) -> None:
        """Fill self.indices [B, S] (or every set of `layer_indices`) for context lengths lens [B] int32."""
        raise NotImplementedError

    def observe_prefill_tail(self, layer: int, q: torch.Tensor, cache: KVCache, ctx: ForwardContext) -> None:
        """The prefill's last chunk at one layer (q: [b, H, gamma + 1, D] for rows ctx.rows)."""

    def observe_verify(self, layer: int, q: torch.Tensor, cache: KVCache, ctx: ForwardContext) -> None:
        """A verification pass at one layer, before its attention."""

    def observe_draft(self, layer: int, q: torch.Tensor, slot: int) -> None:
        """A draft forward at one layer (q [B, H, T, D]; `slot`: the forward's index in the step)."""

    def join(self) -> None:
        """End of a draft forward or a verification pass: work the policy left on a side stream is
        done before what follows."""

    def layer_indices(self, layer: int, q: torch.Tensor, cache: KVCache, ctx: ForwardContext) -> torch.Tensor:
        """The set this layer attends: [B, S] shared, or [B, G, S] per KV head."""
        return self.indices

    def verify_attend(self, layer: int, q: torch.Tensor, cache: KVCache, ctx: ForwardContext) -> torch.Tensor:
        self.observe_verify(layer, q, cache, ctx)
        idx = self.layer_indices(layer, q, cache, ctx)
        out = self.ops.sparse_verify_attention(q, cache.k[layer], cache.v[layer], idx, ctx.start)
        if self.layer_sets:
            if self.meter is not None:
                self.meter.layer(self.true, layer, idx)
            if self.trace is not None:
                self.trace.append((layer, ctx.start.clone(), idx.clone()))
        return out

    def after_verify(self, accepted: torch.Tensor, advance: torch.Tensor) -> None:
        if self.meter is not None:
            self.meter.commit(advance > 0)
        if self.pairs is not None:
            self.pairs.commit(accepted, advance > 0)

    def summary(self) -> dict:
        c = self.cfg
        out = {"budget": c.budget, "sinks": c.sinks, "window": c.window, "draft_kv": c.draft_kv}
        if self.meter is not None:
            out.update(self.meter.summary())
        if self.pairs is not None:
            out.update(self.pairs.summary())
        return out


class SetSignals:
    """The signals and set of `SignalPolicy`: its draft heads' lookahead and its target heads'
    history ([B, N_max] fp32 each, normalised before selection) and its [B, S] set."""

    def __init__(self, policy: SignalPolicy, batch: int, max_len: int, device):
        c, dc, tp = policy.cfg, policy.draft.cfg, policy.tp
        self.m = c.m
        self.use_draft = bool(c.draft_heads) and c.m > 0
        self.use_target = bool(c.target_heads) and c.m < c.free
        self.qbuf: dict[int, torch.Tensor] = {}  # SRH layer -> its queries' buffer (history scored on a side stream)
        self.lookahead_ready = False  # the lookahead was scored (and normalised) during the step's drafting
        self.draft_score = torch.zeros(batch, max_len, dtype=torch.float32, device=device)  # [B, N_max]
        self.history = torch.zeros(batch, max_len, dtype=torch.float32, device=device)  # [B, N_max]
        self.indices = torch.full((batch, c.budget), -1, dtype=torch.int32, device=device)  # [B, S]
        self.draft_rows = self.draft_score  # the lookahead of the draft's rows (TP: a rank's, then gathered)
        if tp is not None:
            self.draft_rows = torch.zeros(policy.dcache.batch, max_len, dtype=torch.float32, device=device)
        self.lookahead = (DraftLookahead(c.draft_heads, policy.dcache.batch, policy.gamma, dc.head_dim,
                                         policy.dcache.k[0].dtype, device, c.aggregation, policy.ops)
                          if self.use_draft else None)
        heads = local_heads(c.target_heads, tp, policy.target.cfg)
        self.target_signal = (TargetHistory(heads, device, c.aggregation, policy.ops)
                              if self.use_target else None)

    def select(self, policy: SignalPolicy, lens: torch.Tensor) -> None:
        """The set for context lengths lens [B]: sinks + window + top-m by the lookahead +
        the rest by the history (one signal alone chooses every free row)."""
        c, tp = policy.cfg, policy.tp
        if self.lookahead is not None:
            if not self.lookahead_ready:  # (scored by the last draft forward on the side stream otherwise)
                normalise_(self.lookahead.score(policy.dcache.k, lens[policy.rows], self.draft_rows))
            self.lookahead_ready = False
            if tp is not None:  # every rank's draft rows -> the whole batch
                tp.gather_rows(self.draft_rows, out=self.draft_score)
        if self.target_signal is not None:
            if tp is not None:  # the heads of every rank: one reduction of [B, N]
                if not self.target_signal.layers:
                    self.history.zero_()  # a rank without retrieval heads adds nothing
                tp.all_reduce_(self.history, op=c.aggregation)
            normalise_(self.history)
        if self.use_draft and self.use_target:
            primary, secondary, m = self.draft_score, self.history, self.m
        else:
            primary, secondary, m = (self.draft_score if self.use_draft else self.history), None, c.free
        policy.ops.select_indices(primary, secondary, lens, self.indices, sinks=c.sinks, window=c.window, m=m)


class SignalPolicy(SparsePolicy):
    """dustin / draft-only / target-only: retrieval-head signals and `select_indices` (`SetSignals`),
    one set per sequence, chosen again at the refresh layers inside the pass."""

    def __init__(self, cfg: SparseConfig, target: Transformer, draft: Transformer, **kw):
        super().__init__(self.config(cfg, target, draft), target, draft, **kw)
        self.layer_sets = bool(self.cfg.refresh_layers)

    @staticmethod
    def config(cfg: SparseConfig, target: Transformer, draft: Transformer) -> SparseConfig:
        """The config this policy runs with (a subclass may set its own heads and m)."""
        return cfg

    def allocate(self, batch, max_len, device):
        self.sig = sig = SetSignals(self, batch, max_len, device)
        self.lookaheads = [sig.lookahead] if sig.lookahead is not None else []
        self.indices, self.draft_score, self.history, self.m = sig.indices, sig.draft_score, sig.history, sig.m
        t = self.target.cfg
        self.refresh = {}  # refresh layer -> the scorer of its KV heads (every one, or the profile's; this rank's)
        for layer, heads in self.cfg.refresh_heads(t).items():
            self.refresh[layer] = TargetHistory(local_heads(heads, self.tp, t), device, self.cfg.aggregation, self.ops)
        self.current = (torch.zeros(batch, max_len, dtype=torch.float32, device=device)  # [B, N_max]
                        if self.refresh else None)
        # With a side stream (CUDA, one process) a pass's history (the next step's signal) is deferred: the
        # pass stashes its retrieval heads' queries (qbuf) and context lengths, and the next step's
        # drafting scores them on the side stream (`before_draft`), beside the draft's small kernels.
        scored = sig.target_signal is not None
        self.side = self._side_stream(device) if scored or self.lookaheads else None
        self.forked = self.holding = False
        self.deferred = scored and self.side is not None
        if self.deferred:
            sig.qbuf = {layer: torch.zeros(batch, lh.query.numel(), self.gamma + 1, t.head_dim,
                                           dtype=self.target.dtype, device=device)
                        for layer, lh in sig.target_signal.layers.items()}  # [B, Hs, gamma + 1, D]
        self.hist_lens = torch.zeros(batch, dtype=torch.int32, device=device) if self.deferred else None

    def _side_stream(self, device) -> torch.cuda.Stream | None:
        """The stream the signals are scored on beside the main one: CUDA with the Triton kernels, one
        process (None: in line)."""
        ok = self.ops.triton and self.tp is None and torch.device(device).type == "cuda"
        return torch.cuda.Stream(device) if ok else None

    def draft_backend(self, default: AttentionBackend) -> AttentionBackend:
        return _DraftBackend(self, default) if self.lookaheads or self.draft_set is not None else default

    def reset(self):
        super().reset()
        for look in self.lookaheads:  # a cached policy starts as a fresh one would
            for q in look.q.values():
                q.zero_()
        self.sig.lookahead_ready = False

    def observe_prefill_tail(self, layer, q, cache, ctx):
        b0, b1 = ctx.rows
        g = self.sig
        if g.target_signal is not None:  # scored now (the first set may be chosen before drafting) and,
            g.target_signal.score(layer, q, cache.k[layer], ctx.start, g.history[b0:b1])
            if self.deferred:  # deferred, scored again by the first drafting (the same result)
                self._stash(layer, q, ctx.start, (b0, b1))

    def observe_draft(self, layer, q, slot):
        """Stash the lookahead's queries; in the step's last draft forward (every query in), score each
        retrieval layer on the side stream as soon as its queries are, beside the rest of the forward."""
        g = self.sig
        look = g.lookahead
        if look is None or layer not in look.layers:
            return
        look.stash(layer, q, slot)
        if self.side is not None and slot == self.gamma - 1 and q.shape[0] == g.draft_rows.shape[0]:
            g.lookahead_ready = look.score_layer(layer, self.dcache.k[layer], self.tcache.lengths,
                                                 g.draft_rows, self.side)
            self.forked = True

    def observe_verify(self, layer, q, cache, ctx):
        g = self.sig  # this pass's set is chosen: the buffers become next step's history
        if self.deferred:  # scored while the next step drafts (`before_draft`)
            self._stash(layer, q, ctx.start)
        elif g.target_signal is not None:
            g.target_signal.score(layer, q, cache.k[layer], ctx.start, g.history)
        scorer = self.refresh.get(layer)
        if scorer is not None:  # the set again, from this layer's current queries: this and later layers attend it
            c = self.cfg
            if not scorer.score(layer, q, cache.k[layer], ctx.start, self.current):
                self.current.zero_()  # a rank without this layer's refresh heads adds nothing (TP)
            if self.tp is not None:
                self.tp.all_reduce_(self.current, op=c.aggregation)
            self.ops.select_indices(normalise_(self.current), None, ctx.start, self.indices, sinks=c.sinks,
                                    window=c.window, m=c.free)

    def _stash(self, layer: int, q: torch.Tensor, start: torch.Tensor, rows: tuple[int, int] | None = None) -> None:
        """A pass's retrieval queries at `layer` (rows [b0, b1) of the batch, where given) into the
        buffers, and its context lengths once per pass, for the next `before_draft`."""
        g = self.sig
        if layer not in g.qbuf:
            return
        g.target_signal.stash(layer, q, g.qbuf[layer], rows)
        if layer == g.target_signal.first:
            (self.hist_lens if rows is None else self.hist_lens[rows[0]: rows[1]]).copy_(start)

    def before_draft(self):
        super().before_draft()
        if self.deferred:  # the last pass's history, on the side stream while this step drafts
            self.side.wait_stream(torch.cuda.current_stream(self.side.device))
            with torch.cuda.stream(self.side):
                g = self.sig
                g.target_signal.score_stashed(g.qbuf, self.tcache.k, self.hist_lens, g.history)
            self.forked = self.holding = True  # joined once the step's drafts are in (`drafted`)

    def drafted(self, tokens):
        super().drafted(tokens)
        self.holding = False
        self.join()

    def set_before_drafts(self):
        c = self.cfg  # the lookahead attends this step's drafts; a refresh layer, their queries
        return not (c.draft_heads and c.m > 0) and not c.refresh_layers

    def rolled_back(self, lengths):
        super().rolled_back(lengths)
        if self.hist_lens is not None:  # the deferred history scores the kept rows only
            torch.minimum(self.hist_lens, lengths, out=self.hist_lens)

    def join(self):
        if self.forked and not self.holding:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
            self.forked = False

    def select(self, lens):
        self.sig.select(self, lens)

    def summary(self):
        out = {**super().summary(), "m": self.m}
        if self.cfg.refresh_layers:
            out["refresh_layers"] = list(self.cfg.refresh_layers)
        return out


class DustinPolicy(SignalPolicy):
    """dustin: the config's retrieval heads and m (a profile's, or every head with --all-heads)."""

    name = "dustin"
    needs_heads = True
    refreshes = True

    @staticmethod
    def config(cfg, target, draft):
        if (cfg.m > 0 and not cfg.draft_heads) or (cfg.m < cfg.free and not cfg.target_heads):
            raise DustinError("policy dustin needs retrieval heads: give --profile (the pair's profile); "
                              "`dustin profile --target T --draft D` makes one")
        return cfg


class DraftOnlyPolicy(SignalPolicy):
    """Every draft KV head's lookahead chooses every free row (the profiler's baseline of that name)."""

    name = "draft-only"

    @staticmethod
    def config(cfg, target, draft):
        return replace(cfg, m=cfg.free, draft_heads=every_head(draft.cfg), target_heads=())


class TargetOnlyPolicy(SignalPolicy):
    """Every target KV head's history chooses every free row (the profiler's baseline of that name)."""

    name = "target-only"

    @staticmethod
    def config(cfg, target, draft):
        return replace(cfg, m=0, draft_heads=(), target_heads=every_head(target.cfg))


class StreamingPolicy(SparsePolicy):
    """StreamingLLM: attention sinks plus the most recent S - sinks rows."""

    name = "streamingllm"

    def select(self, lens):
        streaming_indices(lens, self.cfg.sinks, self.indices)


class QuestPolicy(SparsePolicy):
    """Quest at token budget S: per layer and KV head ([B, G, S] sets), page size cfg.page_size."""

    name = "quest"
    one_set = False
    pages = True

    def set_before_drafts(self):
        return False  # the pages are ranked by this pass's queries, the drafts' included

    def after_prefill(self):
        for layer in range(self.target.cfg.num_layers):  # every page; the steps then update the last ones
            self.pages.refresh(layer, self.tcache.k[layer], self.tcache.lengths, full=True)

    def allocate(self, batch, max_len, device):
        t, G = self.target.cfg, self.tcache.k[0].shape[1]  # this rank's KV heads under TP
        self.pages = QuestPages(t.num_layers, batch, G, max_len, t.head_dim, self.cfg.page_size,
                                self.gamma + 1, self.tcache.k[0].dtype, device)
        self.group_indices = torch.full((batch * G, self.cfg.budget), -1, dtype=torch.int32,
                                        device=device)  # [B * G, S]

    def layer_indices(self, layer, q, cache, ctx):
        c = self.cfg
        self.pages.refresh(layer, cache.k[layer], ctx.start)
        return quest_indices(self.pages.bounds(layer, q), ctx.start, c.page_size, cache.max_len, c.sinks, c.window,
                             self.ops, self.group_indices)

    def summary(self):
        return {**super().summary(), "page": self.cfg.page_size}


class OraclePolicy(SparsePolicy):
    """Sinks + window + the top rows of the true attention of the current verification, averaged
    over every layer, head and query: a full side pass of the target over the drafted tokens
    measures it, then the sparse pass runs. Analysis only (two target passes per step)."""

    name = "oracle"
    needs_true_attention = True

    def set_before_drafts(self):
        return False

    def select(self, lens):
        c, ctx = self.cfg, self.true.ctx
        if self.tp is not None:  # the mean over every rank's heads
            ctx = self.tp.all_reduce_(ctx.clone()).div_(self.tp.world)
        self.ops.select_indices(ctx, None, lens, self.indices, sinks=c.sinks, window=c.window, m=c.free)


POLICY_CLASSES: dict[str, type[Policy]] = {c.name: c for c in (
    FullPolicy, DustinPolicy, DraftOnlyPolicy, TargetOnlyPolicy, StreamingPolicy, QuestPolicy, OraclePolicy)}


def policy_class(name: str) -> type[Policy]:
    """The class of a policy name (its traits; with the -x suffix, the plain policy's: exact mode is
    a way to run it), or one clear error naming the known ones."""
    base = split_exact(name)[0]
    if base not in POLICY_CLASSES:
        raise DustinError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_CLASSES)} (each with "
                          f"{SUFFIX} for exact mode)")
    return POLICY_CLASSES[base]


def make_policy(
    name: str,
    cfg: SparseConfig | None,
    *,
    target: Transformer,
    draft: Transformer,
    measure_arr: bool = False,
    paired: bool = False,
    ops: SparseOps | None = None,
) -> SpecHooks:
    """The hooks of one policy (names in `POLICY_CLASSES`). `cfg` gives the budget, sinks and
    window and, for dustin, the retrieval heads and m (a profile, or `SparseConfig.all_heads`);
    draft-only / target-only use every KV head of their model; `full` needs no config.
    `measure_arr` adds ARR to the run's stats; `paired` adds what full verification accepts on the
    same drafts (greedy; one more full target pass per step). A name with the -x suffix runs the
    policy in exact mode (`dustin_runtime.exact`: its output is the target's greedy output)."""
    cls = policy_class(name)
    if not cls.budgeted:
        if cfg is not None and cfg.draft_kv != "full":
            raise DustinError("full verification has no verification set to draft over: use --draft-kv full")
        hooks = cls(measure_arr, paired)
    elif cfg is None:
        raise DustinError(f"policy {name} needs a budget (--budget)")
    else:
        hooks = cls(cfg, target, draft, measure_arr=measure_arr, paired=paired, ops=ops)
    if name != cls.name:
        hooks.name, hooks.exact = name, split_exact(name)[1]
    return hooks
