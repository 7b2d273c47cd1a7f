"""Ground truth of one calibration window: the target's true verification attention, the draft's
lookahead signals and the target's history signals, recorded through an attention backend (the
model code is untouched; no N x N matrix: prefill is chunked, a verification pass is M x N).

Per window, both models prefill the window's first `max(L)` tokens once. Then for each
verification position L (largest first, so a pass only overwrites rows no later pass reads):
- the draft drafts gamma tokens greedily from the context [0, L) and `cur` = token L, as in
  `speculative_generate` (gamma forwards, phase "draft"; its cache here already holds [0, L), so
  the first forward is cur alone): its queries at the first gamma verification positions (cur,
  d_1, .., d_(gamma - 1)) give the draft lookahead signal of every draft KV head;
- the target verifies [cur, d_1..d_gamma] (phase "verify"): the recorder computes its exact
  attention over the context plus the new tokens, every layer and head, and keeps per layer the
  context attention A of `dustin_runtime.sparse.recovery` (each query's context attention renormalised,
  mean over heads and queries) and Quest's ARR.
The verification tokens are therefore the draft's own greedy drafts, as at run time (with
`verify_tokens="text"` they are the true continuation instead: teacher forcing). With
`draft_set=(budget, sinks, window)` the draft drafts as with `draft_kv="verify-set"` at run time:
over a verification set of that size (sinks, window and the rest by the target history of every
target KV head, the set the runtime would have chosen at L from the target alone), the rows since
and its own drafts.
The target history signal of position L comes from the previous verification pass, taken as the
gamma + 1 true tokens before L (all accepted): the target's queries at [L - gamma - 1, L),
captured during prefill, softmax over that pass's context [0, L - gamma - 1).
Under tensor parallelism (a target sharded by KV heads, the draft replicated) each rank records its
KV heads: the per-layer attention and Quest's ARR are averaged over ranks (each a mean over equally
many heads) and the target's signals all-gathered, so every rank holds one process's record."""

from __future__ import annotations

import math

import torch

from dustin_profile.baselines import quest_masses
from dustin_profile.candidates import kv_head_signals
from dustin_runtime.attention import AttentionBackend, ForwardContext, default_backend
from dustin_runtime.errors import DustinError
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.model import Transformer
from dustin_runtime.sparse.recovery import context_attention

PAGE = 16  # Quest's page size


class _ThroughSet(AttentionBackend):
    """The draft's attention while drafting over a `DraftSet` (sparse drafting); `base` otherwise."""

    def __init__(self, base: AttentionBackend, ops, draft_set):
        self.base, self.ops, self.set = base, ops, draft_set
        self.lens: torch.Tensor | None = None  # [1] context rows L of the pass being drafted

    def begin(self, ctx):
        if ctx.phase == "draft":
            self.set.drafted(ctx.start, self.lens)

    def attend(self, layer, q, cache, ctx):
        if ctx.phase == "draft":
            return self.ops.sparse_verify_attention(q, cache.k[layer], cache.v[layer], self.set.idx, ctx.start)
        return self.base.attend(layer, q, cache, ctx)


class Recorder(AttentionBackend):
    """Wraps a backend. Prefill: keeps the queries at the `capture` positions. Draft steps: keeps
    each step's queries. Verification: computes the exact attention itself (fp32) and records,
    per layer, the context attention A [L] (`recovery.context_attention`) and Quest's ARR at each
    budget."""

    def __init__(self, base: AttentionBackend, num_layers: int, capture: list[int] = (),
                 quest_budgets: tuple[int, ...] = (), page: int = PAGE, quest_sinks: int = 0,
                 quest_window: int = 0, tp=None):
        self.base, self.tp = base, tp  # tp: the target's `TensorParallel` (its heads are this rank's)
        self.capture = sorted(capture)
        self.slot = {p: i for i, p in enumerate(self.capture)}
        self.quest_budgets = tuple(quest_budgets)
        self.quest_sinks, self.quest_window = quest_sinks, quest_window
        self.page = page
        self.q_capture: list[torch.Tensor | None] = [None] * num_layers  # [H, K, D] each
        self.reset_steps()

    def begin(self, ctx: ForwardContext) -> None:
        self.base.begin(ctx)

    def reset_steps(self) -> None:
        n = len(self.q_capture)
        self.q_steps: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.layer_attn: list[torch.Tensor | None] = [None] * n  # [L] fp32
        self.quest = torch.zeros(n, len(self.quest_budgets))

    def attend(self, layer: int, q: torch.Tensor, cache: KVCache, ctx: ForwardContext) -> torch.Tensor:
        if ctx.phase == "verify":
            return self._verify(layer, q, cache, ctx)
        out = self.base.attend(layer, q, cache, ctx)
        if ctx.phase == "prefill" and self.capture:
            start = ctx.kv_len - ctx.num_new
            hits = [p for p in self.capture if start <= p < ctx.kv_len]
            if hits:
                if self.q_capture[layer] is None:
                    H, D = q.shape[1], q.shape[3]
                    self.q_capture[layer] = q.new_zeros(H, len(self.capture), D)
                slots = torch.tensor([self.slot[p] for p in hits], device=q.device)
                self.q_capture[layer][:, slots] = q[0, :, torch.tensor(hits, device=q.device) - start]
        elif ctx.phase == "draft":
            self.q_steps[layer].append(q[0, :, 0])  # [H, D]
        return out

    def _verify(self, layer, q, cache, ctx):
        _, H, M, D = q.shape
        L = int(ctx.start[0])
        k = cache.k[layer][0, :, : L + M].float()  # [G, L + M, D]
        v = cache.v[layer][0, :, : L + M].float()
        G = k.shape[0]
        qf = q[0].float().view(G, H // G, M, D)
        s = torch.einsum("grmd,gnd->grmn", qf, k) * (1.0 / math.sqrt(D))  # [G, r, M, L + M]
        j = torch.arange(M, device=q.device)
        s[..., L:] = s[..., L:].masked_fill(j.view(1, M) > j.view(M, 1), float("-inf"))
        p = torch.softmax(s, dim=-1)
        out = torch.einsum("grmn,gnd->grmd", p, v).reshape(1, H, M, D)
        self.layer_attn[layer] = self._mean(context_attention(p.reshape(-1, L + M), L)[:L])
        if self.quest_budgets:
            share = p[..., :L] / p[..., :L].sum(-1, keepdim=True)  # [G, r, M, L]: each query's context share
            self.quest[layer] = self._mean(quest_masses(qf, k[:, :L], share, self.quest_budgets, self.page,
                                                        sinks=self.quest_sinks, window=self.quest_window)).cpu()
        return out.to(q.dtype)


    def _mean(self, x: torch.Tensor) -> torch.Tensor:
        """A mean over this rank's heads -> over every head (ranks hold equally many)."""
        return x if self.tp is None else self.tp.all_reduce_(x.contiguous()) / self.tp.world


def _prefill(model: Transformer, cache: KVCache, ids: list[int], backend, chunk: int) -> None:
    t = torch.tensor([ids], dtype=torch.long, device=model.device)
    n = t.shape[1]
    for s in range(0, n, chunk):
        stop = min(s + chunk, n)
        model(t[:, s:stop], cache, backend, phase="prefill", logits="none", kv_len=stop, rows=(0, 1),
              final=stop == n)
        cache.advance(stop - s)


@torch.inference_mode()
def record_window(
    target: Transformer,
    draft: Transformer,
    tokens: list[int] | tuple[int, ...],
    positions: list[int],
    *,
    gamma: int,
    quest_budgets: tuple[int, ...] = (),
    verify_tokens: str = "draft",
    prefill_chunk: int = 2048,
    draft_set: tuple[int, int, int] | None = None,
    sinks: int = 0,
    window: int = 0,
) -> dict[str, torch.Tensor]:
    """Record one window (see the module docstring). Returns CPU tensors, P = len(positions),
    N = max(positions), padded with zeros past each pass's L:
    lengths [P]; attn [P, N] (A of `recovery.context_attention`: mean over target layers, heads,
    queries); layer_attn [P, Lt, N] fp16; quest [P, Lt, len(quest_budgets)];
    draft [Cd, P, N] and target [Ct, P, N] candidate signals (by layer, then KV head);
    drafted [P, gamma]; accepted [P] (drafts the target's greedy choice accepts). `sinks` and
    `window` are those of the Quest sets (the profile's)."""
    if verify_tokens not in ("draft", "text"):
        raise DustinError(f"verify tokens must be 'draft' or 'text', not {verify_tokens!r}")
    M = gamma + 1
    order = sorted(positions, reverse=True)
    N = order[0]
    if len(tokens) < N + M or order[-1] < 2 * M:
        raise DustinError(f"window of {len(tokens)} tokens is too short for positions {positions}")
    device = target.device
    V = min(target.cfg.vocab_size, draft.cfg.vocab_size)
    tokens = list(tokens)
    # target: prefill, keeping the history queries [L - M, L) of every position
    capture = sorted({p - M + j for p in order for j in range(M)})
    trec = Recorder(default_backend(device), target.cfg.num_layers, capture, quest_budgets, quest_sinks=sinks,
                    quest_window=window, tp=target.tp)
    tcache = target.allocate_cache(1, N + M)
    _prefill(target, tcache, tokens[:N], trec, prefill_chunk)
    slots = torch.tensor([[trec.slot[p - M + j] for j in range(M)] for p in order], device=device)  # [P, M]
    hist_lens = torch.tensor([p - M for p in order], dtype=torch.int32, device=device)
    tsig = []
    for layer in range(target.cfg.num_layers):
        qh = trec.q_capture[layer][:, slots].transpose(0, 1)  # [P, H, M, D]
        sig = kv_head_signals(qh, tcache.k[layer], hist_lens)[..., :N].float()  # [G (this rank's), P, N]
        if target.tp is not None:  # every KV head's, in order (rank r holds heads [r G/W, (r + 1) G/W))
            sig = target.tp.all_gather(sig).flatten(0, 1)
        tsig.append(sig.cpu())
    # draft: prefill once; per position draft gamma tokens and keep its queries
    through = None
    if draft_set is not None:
        from dustin_runtime.ops import default_ops
        from dustin_runtime.sparse.policies import DraftSet

        ops, (budget, sinks, window) = default_ops(device), draft_set
        through = _ThroughSet(default_backend(device), ops, DraftSet(1, budget, gamma, device))
        history = torch.cat(tsig, dim=0).sum(0).to(device)  # [P, N]: every target KV head
        chosen = torch.full((1, budget), -1, dtype=torch.int32, device=device)
    drec = Recorder(through or default_backend(device), draft.cfg.num_layers)
    dcache = draft.allocate_cache(1, N + M)
    _prefill(draft, dcache, tokens[:N], drec.base, prefill_chunk)
    P, Lt = len(order), target.cfg.num_layers
    out = {
        "lengths": torch.tensor(order),
        "attn": torch.zeros(P, N),
        "layer_attn": torch.zeros(P, Lt, N, dtype=torch.float16),
        "quest": torch.zeros(P, Lt, len(quest_budgets)),
        "drafted": torch.zeros(P, gamma, dtype=torch.long),
        "accepted": torch.zeros(P, dtype=torch.long),
    }
    dsig = [torch.zeros(draft.cfg.num_kv_heads, P, N) for _ in range(draft.cfg.num_layers)]
    for i, L in enumerate(order):
        drec.reset_steps()
        lens = torch.tensor([L], dtype=torch.int32, device=device)
        dcache.set_lengths(lens)
        if through is not None:
            pad = torch.zeros(1, max(0, dcache.max_len - N), device=device)
            hist = torch.cat([history[i: i + 1], pad], dim=1)  # [1, N_max]
            ops.select_indices(hist, None, lens, chosen, sinks=sinks, window=window, m=budget - sinks - window)
            through.set.chosen(chosen, lens)
            through.lens = lens
        tok = torch.tensor([[tokens[L]]], device=device)
        drafted = []
        for j in range(gamma):
            dl = draft(tok, dcache, drec, phase="draft", logits="last")
            dcache.advance(1)
            p = torch.softmax(dl[:, -1, :V].float(), dim=-1)  # [1, V]
            tok = (torch.tensor([[tokens[L + j + 1]]], device=device) if verify_tokens == "text"
                   else p.argmax(-1, keepdim=True))
            drafted.append(tok)
        for layer in range(draft.cfg.num_layers):
            qd = torch.stack(drec.q_steps[layer], dim=1).unsqueeze(0)  # [1, H, gamma, D]
            dsig[layer][:, i] = kv_head_signals(qd, dcache.k[layer][:, :, :N], lens)[:, 0].float().cpu()
        d = torch.cat(drafted, dim=1)  # [1, gamma]
        vt = torch.cat([torch.tensor([[tokens[L]]], device=device), d], dim=1)
        trec.reset_steps()
        tcache.set_lengths(torch.tensor([L], dtype=torch.int32, device=device))
        tlogits = target(vt, tcache, trec, phase="verify")[0, :, :V]  # [M, V]
        la = torch.stack(trec.layer_attn).float()  # [Lt, L]
        out["attn"][i, :L] = la.mean(0).cpu()
        out["layer_attn"][i, :, :L] = la.half().cpu()
        out["quest"][i] = trec.quest
        out["drafted"][i] = d[0].cpu()
        match = (tlogits[:gamma].argmax(-1) == d[0]).long()
        out["accepted"][i] = int(match.cumprod(0).sum())
    out["draft"] = torch.cat(dsig, dim=0)  # [Cd, P, N]
    out["target"] = torch.cat(tsig, dim=0)  # [Ct, P, N]
    return out
