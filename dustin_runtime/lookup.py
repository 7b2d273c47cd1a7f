"""Context lookup beside the draft model (prompt lookup / n-gram speculation): a draft token can be
copied from the sequence's own history instead of taken from the draft model.

At each draft forward of a step, the lookup searches the sequence's tokens so far (prompt, committed
tokens, this step's drafts) for the most recent earlier occurrence of its last n tokens, longest n
first from `max_ngram` down to `min_ngram`; on a match it proposes the token that followed that
occurrence, and the step's next forwards go on copying the same occurrence (a chunk, as long as the
step drafts). Without a match (or where the copy is outside the common vocabulary) the draft model's
token is taken, and the next forward searches again.
The draft model runs every forward either way (its cache rows and, for dustin, its lookahead
attention are over the tokens actually proposed).

Long-context text quotes itself (names, phrases, repeated lines; a greedy small target repeats its
own output), and the draft model cannot always copy: the lookup costs no weights and one kernel per
draft forward (`dustin_kernels.lookup_draft`). Sampling stays exact: a copied token is a proposal with probability 1 (the draft
distribution of that position is one-hot), so rejection sampling accepts it with probability p(token)
and resamples from the rest of p otherwise.

History layout: `hist[b, pos]` is the token at position pos (the prompt at 0..len - 1; the last
committed token `cur` sits at the target's length L; this step's draft i at L + i, overwritten by what
is committed). Static buffers, no host sync: runs inside the loop's CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dustin_runtime.errors import DustinError


@dataclass(frozen=True)
class LookupConfig:
    """n-gram lengths the lookup matches, longest first."""

    max_ngram: int = 4
    min_ngram: int = 2

    def __post_init__(self):
        from dustin_runtime.ops import kernels

        MAX_NGRAM = kernels.MAX_NGRAM  # noqa: N806 (the kernel's constant)
        lo, hi = self.min_ngram, self.max_ngram
        if not (isinstance(lo, int) and isinstance(hi, int)) or not 1 <= lo <= hi <= MAX_NGRAM:
            raise DustinError(f"draft lookup n-grams must satisfy 1 <= min <= max <= {MAX_NGRAM}, got max {hi}, min {lo}")

    @classmethod
    def parse(cls, text: str) -> LookupConfig:
        """'MAX' or 'MAX:MIN' (MIN defaults to min(2, MAX))."""
        parts = text.strip().split(":")
        try:
            vals = [int(p) for p in parts]
        except ValueError:
            raise DustinError(f"--draft-lookup takes MAX or MAX:MIN n-gram lengths, got {text!r}") from None
        if len(vals) not in (1, 2):
            raise DustinError(f"--draft-lookup takes MAX or MAX:MIN n-gram lengths, got {text!r}")
        return cls(vals[0], vals[1] if len(vals) == 2 else min(2, vals[0]))

    def label(self) -> str:
        return f"{self.max_ngram}:{self.min_ngram}"


class ContextLookup:
    """The token history of a batch and the lookup's state within a step (`ptr`: the history
    position whose token the previous forward copied, -1 when it took the model's)."""

    def __init__(self, cfg: LookupConfig, batch: int, capacity: int, device):
        self.cfg = cfg
        self.hist = torch.full((batch, capacity), -1, dtype=torch.int32, device=device)  # [B, N]
        self.ptr = torch.full((batch,), -1, dtype=torch.long, device=device)  # [B]
        from dustin_runtime.ops import kernels

        self.fn = kernels.lookup_draft if torch.device(device).type == "cuda" else kernels.lookup_draft_ref  # Triton on CUDA
        self.counts = torch.zeros(batch, 2, dtype=torch.int64, device=device)  # drafts copied, made (live rows)
        self.uncounted = torch.zeros_like(self.counts)  # where a shadow drafting's counts go

    def load(self, prompts: list[list[int]]) -> None:
        """The prompts at positions 0.. (eager, once per call); the statistics start again."""
        self.hist.fill_(-1)
        N = self.hist.shape[1]
        for b, p in enumerate(prompts):
            if len(p) > N:
                raise DustinError(f"prompt {b} has {len(p)} tokens, the lookup holds {N}")
            self.hist[b, : len(p)] = torch.tensor(p, dtype=torch.int32)
        self.counts.zero_()

    def begin(self) -> None:
        """Start of a step's drafting: the first forward searches."""
        self.ptr.fill_(-1)

    def write(self, pos: torch.Tensor, tok: torch.Tensor) -> None:
        """hist[b, pos[b]] = tok[b] (pos, tok: [B])."""
        self.hist.scatter_(1, pos.long().view(-1, 1), tok.view(-1, 1).to(torch.int32))

    def draft(self, end: torch.Tensor, model: torch.Tensor, vocab: int, done: torch.Tensor,
              counted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward: the token after position end [B] (the last known one), copied where
        the history repeats (the previous forward's copy goes on, else the longest most recent match)
        and below `vocab`, else the model's [B]; written to the history at end + 1 and counted for
        the live rows (done [B] bool) unless not `counted` (a shadow drafting). Returns (token [B],
        copied [B] bool); one kernel on CUDA (`dustin_kernels.lookup_draft`), its torch twin elsewhere."""
        counts = self.counts if counted else self.uncounted
        return self.fn(self.hist, end, self.ptr, model, done, counts, self.cfg.max_ngram, self.cfg.min_ngram, vocab)

    def summary(self) -> dict:
        copied, made = (int(x) for x in self.counts.sum(0).tolist())
        return {"draft_lookup": self.cfg.label(), "lookup_share": copied / made if made else 0.0, "lookup_drafts": made}
