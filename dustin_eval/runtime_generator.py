"""`Generator` (dustin_eval.generator) over the runtime: greedy speculative decoding through a
verification policy, or greedy autoregressive decoding without a draft."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dustin_runtime.generate import generate
from dustin_runtime.model import Transformer
from dustin_runtime.speculative import SpecHooks, speculative_generate

from .generator import GenerationResult

HooksFactory = Callable[[], SpecHooks | None]


class RuntimeGenerator:
    """Greedy generation in batches of `batch_size`; per-prompt stats carry the accepted length."""

    def __init__(
        self,
        target: Transformer,
        draft: Transformer | None,
        *,
        gamma: int = 4,
        hooks_factory: HooksFactory | None = None,
        batch_size: int = 1,
    ):
        self.target, self.draft, self.gamma = target, draft, gamma
        self.hooks_factory = hooks_factory
        self.batch_size = batch_size

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        eos_ids: Sequence[int],
        min_new_tokens: int = 0,
    ) -> list[GenerationResult]:
        out: list[GenerationResult] = []
        for i in range(0, len(prompts), self.batch_size):
            ps = [list(p) for p in prompts[i : i + self.batch_size]]
            mx = list(max_new_tokens[i : i + self.batch_size])
            if self.draft is None:
                res = generate(self.target, ps, mx, eos_ids=tuple(eos_ids), min_new_tokens=min_new_tokens)
            else:
                hooks = self.hooks_factory() if self.hooks_factory is not None else None
                res = speculative_generate(
                    self.target, self.draft, ps, mx, gamma=self.gamma, eos_ids=tuple(eos_ids),
                    hooks=hooks, min_new_tokens=min_new_tokens,
                )
            s = res.stats
            per_seq = s.accepted_per_sequence()
            for b, toks in enumerate(res.tokens):
                steps = sum(1 for row in s.accepted if row[b] >= 0)
                stats = {"steps": steps, "batch_seconds": s.seconds.get("total", 0.0)}
                if s.mode == "speculative":
                    stats["accept_len"] = per_seq[b]
                    stats.update({k: v for k, v in s.extra.items() if isinstance(v, (int, float))})
                out.append(GenerationResult(list(toks), None, stats))
        return out
