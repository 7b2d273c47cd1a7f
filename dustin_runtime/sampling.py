"""Sampling without host syncs: temperature / top-p distributions, draws through exponential noise
(argmax of p / E, E ~ Exp(1), is a draw from p), greedy as temperature 0, and the acceptance rule
of speculative decoding (greedy matching, or exact rejection sampling, Leviathan et al. 2023).

Under tensor parallelism the target's logits are split by vocabulary columns (`VocabShard`); every
function here then reduces over ranks without gathering the logits: an argmax is each rank's max
and index, all-gathered ([P, ...] small); a softmax takes its normaliser from each rank's max and
sum; rejection sampling sums p(d) over ranks and gathers the draft's distribution at one position
per sequence. Noise is drawn at the shape of the whole batch and vocabulary on every rank (the same
generator state everywhere) and sliced, so each rank draws what one process would: the output is
exactly the target's distribution, and the same tokens as one process up to float rounding. Top-p
needs the sorted whole distribution: there the logits are gathered."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.tp import TensorParallel


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_p 1.0 keeps the whole distribution."""

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self):
        t, p = self.temperature, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise DustinError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:  # NaN fails too
            raise DustinError(f"top-p must be in (0, 1] (1 keeps the whole distribution), got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True, eq=False)
class VocabShard:
    """The vocabulary columns a rank's logits hold, [start, start + width) of the `limit` columns in
    use (the target/draft common vocabulary), each rank `size` columns of the target's."""

    start: int
    width: int
    size: int
    limit: int
    tp: TensorParallel

    def cut(self, logits: torch.Tensor) -> torch.Tensor:
        """A rank's logits [..., size] -> its columns in use [..., width]."""
        return logits[..., : self.width]

    def columns(self, ids) -> torch.Tensor:
        """Local columns of the token ids this rank holds ([k] int64, k = 0 when it holds none)."""
        return torch.tensor([i - self.start for i in ids if self.start <= i < self.start + self.width],
                            dtype=torch.long)

    def gather(self, x: torch.Tensor, fill: float) -> torch.Tensor:
        """Every rank's columns [..., width] (or all its [..., size]) -> the whole [..., limit]
        (all-gather; `fill` pads)."""
        pad = torch.nn.functional.pad(x[..., : self.width], (0, self.size - self.width), value=fill)
        return self.tp.all_gather(pad).movedim(0, -2).reshape(*x.shape[:-1], -1)[..., : self.limit]


def vocab_shard(model, limit: int) -> VocabShard | None:
    """The vocabulary shard of a tensor-parallel model's logits for the first `limit` token ids
    (None in one process); refuses a rank left without any of them."""
    tp = getattr(model, "tp", None)
    if tp is None:
        return None
    size = model.shard.vocab_size
    width = min(max(limit - model.vocab_start, 0), size)
    if width < 1:
        raise DustinError(f"the common vocabulary ({limit} ids) ends before rank {tp.rank}'s share of the target's "
                          f"({model.vocab_start}..): use a smaller --tp")
    return VocabShard(model.vocab_start, width, size, limit, tp)


def argmax(x: torch.Tensor, shard: VocabShard | None = None) -> torch.Tensor:
    """x [..., V] -> [...] int64 token ids of the largest entry (the first of equal ones); with a
    shard, over every rank's columns (one all-gather of each rank's max and its index)."""
    if shard is None:
        return x.argmax(-1)
    val, idx = x.max(-1)
    both = torch.stack([val.double(), (idx + shard.start).double()])  # [2, ...]: exact in fp64
    every = shard.tp.all_gather(both)  # [P, 2, ...]
    best = every[:, 0].argmax(0, keepdim=True)  # the lowest rank among equal maxima
    return every[:, 1].gather(0, best).squeeze(0).long()


def _softmax(z: torch.Tensor, shard: VocabShard | None) -> torch.Tensor:
    """softmax over the last dim; with a shard, over every rank's columns (the normaliser from each
    rank's max and sum of exponentials: one all-gather of [P, 2, ...])."""
    if shard is None:
        return torch.softmax(z, dim=-1)
    m = z.amax(-1)
    s = torch.exp(z - m.unsqueeze(-1)).sum(-1)
    every = shard.tp.all_gather(torch.stack([m, s]))  # [P, 2, ...]
    top = every[:, 0].amax(0)
    total = (every[:, 1] * torch.exp(every[:, 0] - top)).sum(0)
    return torch.exp(z - top.unsqueeze(-1)) / total.unsqueeze(-1)


def pick(probs: torch.Tensor, tokens: torch.Tensor, shard: VocabShard | None = None) -> torch.Tensor:
    """probs [..., V] at tokens [...] -> [...] (with a shard: the owning rank's entry, summed over ranks)."""
    if shard is None:
        return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    local = tokens - shard.start
    mine = (local >= 0) & (local < shard.width)
    got = probs.gather(-1, torch.where(mine, local, 0).unsqueeze(-1)).squeeze(-1)
    return shard.tp.all_reduce_(torch.where(mine, got, 0.0))


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig, shard: VocabShard | None = None) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (float32) after temperature and top-p. Greedy gives
    the one-hot of the argmax, so greedy decoding is the temperature -> 0 limit of the same code.
    With a shard: this rank's columns of the whole vocabulary's distribution."""
    logits = logits.float()
    if cfg.greedy:
        if shard is None:
            return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        local = (argmax(logits, shard) - shard.start).unsqueeze(-1)
        mine = (local >= 0) & (local < shard.width)
        return torch.zeros_like(logits).scatter_(-1, torch.where(mine, local, 0), mine.float())
    if shard is not None and cfg.top_p < 1.0:  # the nucleus needs the whole sorted distribution
        whole = probs_from_logits(shard.gather(logits, float("-inf")), cfg)
        return whole[..., shard.start: shard.start + shard.width]
    probs = _softmax(logits / cfg.temperature, shard)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # the smallest prefix with mass >= top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, shard: VocabShard | None = None,
           rows: slice | None = None, batch: int | None = None) -> torch.Tensor:
    """One draw per row of probs [..., V] -> [...] int64; no host sync. The noise is drawn at the
    shape of the whole draw and sliced: probs may hold rows `rows` of a batch of `batch` (a rank's
    draft rows) and a shard's columns of the vocabulary, and still get one process's draw."""
    shape, index = list(probs.shape), [slice(None)] * probs.dim()
    if rows is not None:
        shape[0], index[0] = batch, rows
    if shard is not None:
        shape[-1], index[-1] = shard.limit, slice(shard.start, shard.start + shard.width)
    noise = torch.empty(shape, dtype=probs.dtype, device=probs.device).exponential_(1.0, generator=generator)
    return argmax(probs / noise[tuple(index)], shard)


def next_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
               shard: VocabShard | None = None) -> torch.Tensor:
    """logits [B, V] -> tokens [B]: argmax when greedy, else a draw from the adjusted distribution."""
    if cfg.greedy:
        return argmax(logits, shard)
    return sample(probs_from_logits(logits, cfg, shard), generator, shard)


def speculative_accept(
    draft_tokens: torch.Tensor,  # [B, K] the drafted tokens d_1..d_K
    draft_probs: torch.Tensor | None,  # [B, K, V] q_i(.) each d_i was drawn from (None if greedy)
    target_logits: torch.Tensor,  # [B, K + 1, V] target logits at positions of cur, d_1..d_K
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    forced: torch.Tensor | None = None,  # [B] accepted counts that replace the decision (replay)
    shard: VocabShard | None = None,  # tensor parallel: the target logits hold this rank's columns
    rows: slice | None = None,  # tensor parallel: draft_probs holds these rows of the batch
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted-prefix lengths n [B] (0..K) and the next token [B]: the target's correction at the
    first rejection, or its bonus token after K accepts. With `forced`, n is forced and the next
    token is the target's at n as above (the random draws of a real decision are still made, so
    forcing the counts a real run found reproduces that run).

    Greedy: d_i is accepted while it equals the target's argmax, so the output equals greedy
    decoding of the target. Sampling: d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)),
    a rejection resamples from norm(max(0, p - q)); the output is distributed exactly as the
    target's samples. Under tensor parallelism (`shard`, `rows`) the same computation runs on the
    ranks' columns: p(d) summed over ranks, q(d) and q at the first rejection gathered from the
    draft's rows, the residual's mass summed, its draw an argmax over ranks."""
    B, K = draft_tokens.shape
    if cfg.greedy:
        t = argmax(target_logits, shard)  # [B, K + 1]
        ok = (t[:, :K] == draft_tokens).int()
        n = ok.cumprod(dim=1).sum(dim=1) if forced is None else forced  # [B]
        return n, t.gather(1, n.view(B, 1)).squeeze(1)
    tp = None if shard is None else shard.tp
    mine = slice(None) if rows is None else rows
    p = probs_from_logits(target_logits, cfg, shard)  # [B, K + 1, V]
    p_d = pick(p[:, :K], draft_tokens, shard)  # [B, K]
    q_d = pick(draft_probs, draft_tokens[mine])  # [B, K] (this rank's rows under TP)
    if tp is not None:
        q_d = tp.gather_rows(q_d)
    u = torch.rand(B, K, device=p.device, generator=generator)
    ok = (u * q_d <= p_d).int()  # u <= p / q without dividing by q
    n = ok.cumprod(dim=1).sum(dim=1) if forced is None else forced  # [B]
    p_n = p.gather(1, n.view(B, 1, 1).expand(B, 1, p.shape[-1])).squeeze(1)  # [B, V]
    q_pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)  # [B, K + 1, V]
    n_mine = n[mine]
    q_n = q_pad.gather(1, n_mine.view(-1, 1, 1).expand(-1, 1, q_pad.shape[-1])).squeeze(1)  # zero after K accepts
    if tp is not None:  # the draft's rows -> every row, this rank's columns
        q_n = tp.gather_rows(q_n)[:, shard.start: shard.start + shard.width]
    residual = (p_n - q_n).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    if tp is not None:
        tp.all_reduce_(mass)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)  # p == q: residual is p
    return n, sample(residual, generator, shard)
