"""Exact mode (greedy): sparse-verified tokens are provisional until a full-attention pass confirms them.

Every `K` speculative steps (and whenever every sequence has reached its EOS or length limit, so
no provisional token is left unconfirmed at the end) one **confirmation pass** runs the target
over each sequence's provisional tokens against the full KV cache, in one forward:

  positions: C = the last confirmed token of a sequence (its KV row may still hold sparse-attention
  values), L = the target cache's length (the provisional `cur` sits at L);
  the pass feeds the tokens at C .. C + T - 1 (T = K (gamma + 1) rows, static; rows past L - 1 are
  padding whose writes lie past the cache length), rewriting rows C .. L - 1 with exact K/V;
  full[t] = argmax of its logits at row t predicts position C + t + 1; the longest prefix a of the
  provisional tokens at C + 1 .. L equal to full[0 .. a - 1] is confirmed; at the first mismatch the
  token at C + a + 1 becomes full[a] (the target's own greedy choice there) and everything after it
  is rolled back: the target cache length, `cur` / `prev`, the draft cache length, the output
  bookkeeping (produced, done, the last output token), the lookup history and the policy's state
  (`SpecHooks.rolled_back`).

Sampling (temperature > 0, one process): the pass applies the rejection rule of speculative sampling
to the provisional tokens, with p = the full pass's distribution (after temperature / top-p) and
r = the distribution each provisional token was drawn from, kept per token (`r` [B, T + 1, V]):
token x_i is kept with probability min(1, p_i(x_i) / r_i(x_i)), the first rejected one is replaced by
a draw from norm(max(0, p_i - r_i)) and everything after it rolled back. Why r_i is known: speculative
sampling against the sparse verifier emits, given the emitted prefix, a draw from the sparse
target's distribution r_i = p_sparse(. | prefix, the step's set), and row i of the sparse pass attends
the set and the new tokens up to i only; so r_i is a function of the prefix and of the set, provided
the set was chosen before the step's drafts exist (`SpecHooks.set_before_drafts`: streamingllm, the
target history alone, full; not dustin's draft lookahead, quest's per-query pages or refresh layers,
which see this step's drafts and would make r_i depend on tokens after i: refused). Given that, the
kept-or-resampled token at each position is a draw from p given the confirmed prefix (the rejection
rule's lemma, applied position by position with independent uniforms), so the output follows the
target's distribution exactly; tests/runtime/test_exact.py checks it with a chi-square test.

The greedy output is then vanilla greedy decoding's: every emitted token is the full-attention argmax of a
prefix whose K/V rows are all exact (prefill is full attention; later rows are rewritten by the
pass that confirmed them). Sparse verification only decides how many tokens a pass confirms (its
agreement with the full pass), never which. The pass is one phase over static buffers (no host
sync; a CUDA graph on CUDA); when it runs is decided on the host from the step count and the loop's
one done check.

Statistics: confirm passes, provisional tokens, and per kind (accepted drafts; the step's correction
or bonus token) the tokens checked (the matched prefix plus the first mismatch) and matched:
`agreement` = matched / checked is the per-token agreement of the sparse and the full greedy choice
(what a replay draws from); `confirmed_share` = matched / provisional."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.sampling import argmax, probs_from_logits, sample

K_MAX = 6  # the confirmation pass's rows grow as K (gamma + 1): 20 rows a sequence is past the verify graph's cliff
DEFAULT_K = 2  # measured best of K = 2, 3, 4 at 7B / 0.5B, 32k, batch 16, H200 (results/speed-exact): 1.10x / 1.03x / 0.95x standard speculative
EXACT_BUDGET = 1024  # S of exact mode unless given (7B / 32k / 16, H200, K = 2: 1.10x / 1.23x / 1.18x standard
# speculative at S = 512 / 1024 / 2048, replaying the embedded pair's agreement: 0.946 (2k) / 0.971 / 0.981 (8k))
SUFFIX = "-x"  # a policy name's suffix for exact mode: -x at DEFAULT_K, -xK at K (dustin-x, dustin-vs-x3, ...)
KINDS = ("draft", "correction")  # an accepted draft; the token the target chose after them (correction or bonus)


@dataclass(frozen=True)
class ExactConfig:
    """Confirm every `k` steps (0: exact mode off)."""

    k: int = 0

    def __post_init__(self):
        if not isinstance(self.k, int) or not 0 <= self.k <= K_MAX:
            raise DustinError(f"--exact takes K from 0 (off) to {K_MAX}, got {self.k!r}")

    @property
    def on(self) -> bool:
        return self.k > 0

    def rows(self, gamma: int) -> int:
        """The confirmation pass's rows a sequence (the provisional tokens of K steps at most)."""
        return self.k * (gamma + 1)


def exact_budget(profile_budget: int | None) -> int:
    """Exact mode's default budget S: EXACT_BUDGET, or the profile's where that is larger (a larger set
    costs little and buys agreement: fewer rollbacks)."""
    return max(EXACT_BUDGET, profile_budget or 0)


def split_exact(name: str) -> tuple[str, ExactConfig]:
    """A policy name -> (the plain policy's name, its exact mode: K = DEFAULT_K with the -x suffix,
    K with -xK, else off)."""
    head, sep, k = name.rpartition(SUFFIX)
    if sep and head and (k == "" or k.isdigit()):
        if k and not 1 <= int(k) <= K_MAX:
            raise DustinError(f"policy {name}: exact mode confirms every K = 1 ... {K_MAX} steps ({SUFFIX} is K = "
                              f"{DEFAULT_K})")
        return head, ExactConfig(int(k) if k else DEFAULT_K)
    return name, ExactConfig()


class ExactLoop:
    """The confirmation pass of one `_SpecLoop` (`loop`) and its buffers: the token at every
    position of each sequence (`hist` [B, N]), the kind of each provisional token (`kind` [B, N]),
    the confirmed position C (`confirmed` [B]), each sequence's first new position minus one
    (`base` [B]: produced = C - base) and the counters [B, 2 kinds, 2 (checked, matched)]."""

    def __init__(self, cfg: ExactConfig, loop, backend, device, replayed: bool = False):
        B, N = loop.tcache.batch, loop.tcache.max_len + 1
        self.cfg, self.loop, self.backend = cfg, loop, backend
        self.T = cfg.rows(loop.gamma)
        self.hist = torch.zeros(B, N, dtype=torch.long, device=device)  # [B, N]
        self.kind = torch.zeros(B, N, dtype=torch.long, device=device)  # [B, N] 0 draft, 1 correction
        self.trash = N - 1
        self.confirmed = torch.zeros(B, dtype=torch.long, device=device)  # [B] C
        self.base = torch.zeros(B, dtype=torch.long, device=device)  # [B]
        self.counts = torch.zeros(B, len(KINDS), 2, dtype=torch.long, device=device)  # checked, matched
        self.provisional = torch.zeros(B, dtype=torch.long, device=device)  # [B] tokens a pass found
        self.j = torch.arange(max(self.T, loop.gamma + 1), device=device)
        self.passes = 0
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # the pass's index (replay rows)
        self.replay = (torch.zeros(loop.book.accepted.shape[0], B, dtype=torch.long, device=device)
                       if replayed else None)  # [passes, B] forced matched counts (bench e2e)
        self.r = None  # sampling: [B, T + 1, V] the distribution each provisional token was drawn from
        if not loop.sampling.greedy:
            self.r = torch.zeros(B, self.T + 1, loop.V, dtype=torch.float32, device=device)

    @property
    def mutable(self) -> list[torch.Tensor]:
        return [self.hist, self.kind, self.confirmed, self.base, self.counts, self.provisional, self.step] + (
            [] if self.r is None else [self.r])

    def load(self, prompts: list[list[int]], lengths: torch.Tensor) -> None:
        """A call's prompts at positions 0.. and C = the cache length after prefill (eager)."""
        self.hist.zero_()
        for b, p in enumerate(prompts):
            self.hist[b, : len(p)] = torch.tensor(p, dtype=torch.long)
        self.confirmed.copy_(lengths)
        self.base.copy_(lengths)
        self.counts.zero_()
        self.provisional.zero_()
        self.step.zero_()
        self.passes = 0

    def load_replay(self, matched: torch.Tensor) -> None:
        """Forced matched counts [passes, B] for bench e2e (random weights agree on nothing): a pass
        confirms min(count, provisional) tokens; the last row repeats (eager, before the loop)."""
        n = self.replay.shape[0]
        c = matched.to(self.replay.device, torch.long).clamp_min(0)[:n]
        self.replay[: c.shape[0]].copy_(c)
        self.replay[c.shape[0]:].copy_(c[-1:].expand(n - c.shape[0], -1))

    def record(self, emitted: torch.Tensor, n: torch.Tensor, advance: torch.Tensor, lens: torch.Tensor,
               logits: torch.Tensor | None = None) -> None:
        """A step's tokens emitted [B, W] (n [B] accepted drafts, advance [B] tokens kept) at
        positions lens + 1 .. (lens [B]: the cache length before the advance); sampling: the sparse
        pass's logits [B, W, V], whose distributions the emitted tokens follow (module docstring)."""
        W = emitted.shape[1]
        j = self.j[:W].view(1, W)
        kept = j < advance.view(-1, 1)
        pos = torch.where(kept, lens.long().view(-1, 1) + 1 + j, self.trash)  # [B, W]
        self.hist.scatter_(1, pos, emitted)
        self.kind.scatter_(1, pos, (j >= n.view(-1, 1)).long().expand_as(pos))
        if self.r is not None:
            slot = torch.where(kept, pos - self.confirmed.view(-1, 1) - 1, self.T).clamp(0, self.T)  # [B, W]
            r = probs_from_logits(logits, self.loop.sampling)
            self.r.scatter_(1, slot.unsqueeze(-1).expand(-1, -1, r.shape[-1]), r)

    def confirm_phase(self) -> None:
        """The confirmation pass (module docstring): confirm, correct, roll back."""
        loop, T = self.loop, self.T
        tcache, book = loop.tcache, loop.book
        C, L = self.confirmed, tcache.lengths.long()
        pos = (C.view(-1, 1) + self.j[:T]).clamp_max(self.trash - 1)  # [B, T] positions fed
        tcache.set_lengths(C.to(torch.int32))
        book.produced.copy_(C - self.base)  # the early-stop mask counts from the confirmed tokens
        logits = loop.target(self.hist.gather(1, pos), tcache, self.backend, phase="verify", local_vocab=True)
        logits = logits[..., : loop.V] if loop.shard is None else loop.shard.cut(logits)
        logits = book.mask_early_stops(logits, eos=loop.eos)
        nprov = L - C  # [B] provisional tokens at C + 1 .. L
        checkable = self.j[:T].view(1, T) < nprov.view(-1, 1)  # [B, T]
        x = self.hist.gather(1, pos + 1)  # [B, T] the provisional tokens the rows check
        if self.r is None:
            full = argmax(logits, loop.shard)  # [B, T]
            match = (full == x) & checkable
        else:
            full, match = self._rejection(logits, x, checkable)
        a = match.long().cumprod(1).sum(1)  # [B] the matched prefix
        if self.replay is not None:  # forced (bench e2e): this pass's row of the replayed counts
            a = torch.minimum(self.replay.index_select(0, self.step.clamp_max(self.replay.shape[0] - 1)).view(-1), nprov)
        self.step += 1
        miss = a < nprov
        new = C + a + miss.long()  # [B] the new confirmed position
        if self.r is not None:  # the residual's draw at the first rejection
            full = self._resample(logits, a.clamp_max(T - 1))
        fix = full.gather(1, a.clamp_max(T - 1).view(-1, 1)).view(-1)
        at = new.view(-1, 1)
        self.hist.scatter_(1, at, torch.where(miss, fix, self.hist.gather(1, at).view(-1)).view(-1, 1))
        self._count(checkable, a, miss, pos)
        self.provisional += nprov
        self.confirmed.copy_(new)
        tcache.set_lengths(new.to(torch.int32))
        if self.r is not None:  # the next block's provisional tokens start after the new C
            self.r.zero_()
        loop.dcache.set_lengths(tcache.lengths[loop.rows])
        loop.cur.copy_(self.hist.gather(1, at).view(-1))
        loop.prev.copy_(self.hist.gather(1, (new - 1).clamp_min(0).view(-1, 1)).view(-1))
        self._rewind_book(new)
        if loop.lookup is not None:
            loop.lookup.write(tcache.lengths, loop.cur)
        loop.hooks.rolled_back(tcache.lengths)

    def _rejection(self, logits, x, checkable) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampling: (full [B, T] placeholder tokens, kept [B, T]): x_t kept with probability
        min(1, p_t(x_t) / r_t(x_t)) (u r <= p, no division)."""
        from dustin_runtime.sampling import pick

        T = x.shape[1]
        self._p = probs_from_logits(logits, self.loop.sampling)  # [B, T, V]
        p_x, r_x = pick(self._p, x), pick(self.r[:, :T], x)
        u = torch.rand(x.shape, device=x.device, generator=self.loop.gen)
        return x, (u * r_x <= p_x) & checkable

    def _resample(self, logits, at: torch.Tensor) -> torch.Tensor:
        """[B, 1] a draw from norm(max(0, p - r)) at row `at` [B] (p where the residual is empty)."""
        V = self._p.shape[-1]
        idx = at.view(-1, 1, 1).expand(-1, 1, V)
        p, r = self._p.gather(1, idx).squeeze(1), self.r.gather(1, idx).squeeze(1)  # [B, V]
        res = (p - r).clamp_min(0.0)
        mass = res.sum(-1, keepdim=True)
        res = torch.where(mass > 0, res / mass.clamp_min(1e-30), p)
        return sample(res, self.loop.gen).view(-1, 1).expand(-1, self.T).contiguous()

    def _count(self, checkable, a, miss, pos) -> None:
        """Checked (the matched prefix and the first mismatch) and matched tokens per kind."""
        T = checkable.shape[1]
        j = self.j[:T].view(1, T)
        kind = self.kind.gather(1, pos + 1)  # [B, T] the kind of the provisional token each row checks
        checked = (j < (a + miss.long()).view(-1, 1)) & checkable
        matched = j < a.view(-1, 1)
        for i in range(len(KINDS)):
            self.counts[:, i, 0] += (checked & (kind == i)).sum(1)
            self.counts[:, i, 1] += (matched & (kind == i)).sum(1)

    def _rewind_book(self, new: torch.Tensor) -> None:
        """produced, the last output token and done from the confirmed position."""
        book = self.loop.book
        produced = new - self.base
        book.produced.copy_(produced)
        last = torch.where(produced > 0, produced - 1, book.trash).view(-1, 1)
        book.out.scatter_(1, last, self.loop.cur.view(-1, 1))
        cols = torch.arange(book.out.shape[1], device=book.out.device).view(1, -1)
        eos = (torch.isin(book.out, book.eos) & (cols < produced.view(-1, 1))).any(1)
        book.done.copy_(eos | (produced >= book.max_new))

    def summary(self, rows: int) -> dict:
        """The run's exact-mode statistics (the first `rows` sequences: the asked batch)."""
        c = self.counts[:rows].sum(0).tolist()  # [kinds][checked, matched]
        prov = int(self.provisional[:rows].sum())
        checked, matched = sum(k[0] for k in c), sum(k[1] for k in c)
        out = {"exact_k": self.cfg.k, "confirm_passes": self.passes, "provisional_tokens": prov,
               "checked_tokens": checked, "agreement": matched / checked if checked else 1.0,
               "confirmed_share": matched / prov if prov else 1.0}
        for name, (ch, m) in zip(KINDS, c, strict=True):
            out[f"agreement_{name}"] = m / ch if ch else 1.0
            out[f"checked_{name}"] = ch
        per = self.counts[:rows].tolist()  # [B][kinds][checked, matched]: intervals over the sequences
        for i, name in enumerate(("checked", "matched")):
            out[f"exact_{name}_per_sequence"] = [sum(k[i] for k in seq) for seq in per]
            for j, kind in enumerate(KINDS):
                out[f"exact_{name}_{kind}_per_sequence"] = [seq[j][i] for seq in per]
        return out

