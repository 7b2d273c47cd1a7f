"""The seam between the evaluation harnesses and the runtime: greedy batch generation.

The harnesses build token-id prompts and score what comes back; `RuntimeGenerator` runs them
through the runtime (speculative decoding through a verification policy, or greedy autoregressive
decoding without a draft). Anything with its `generate` method can stand in (the tests script one).
Prompt i gets at most `max_new_tokens[i]` new tokens; a prompt stops after the first new token whose
id is in `eos_ids` (shared by the batch), but never before `min_new_tokens` new tokens (the LongBench
protocol uses 1 on samsum, whose stop set includes the newline token). Prompts are complete: special
tokens and chat formatting are already in the ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dustin_runtime.generate import generate
from dustin_runtime.model import Transformer
from dustin_runtime.speculative import SpecHooks, speculative_generate

HooksFactory = Callable[[], SpecHooks | None]


@dataclass(frozen=True)
class Completion:
    """One prompt's output.

    tokens: the new token ids (prompt excluded), in order; when an id of `eos_ids` ended the
        generation it is the last one, as Hugging Face `generate` returns it.
    text: the decoded text when the generator decodes itself; None lets the harness decode
        `tokens` with `skip_special_tokens=True` (the LongBench rule).
    stats: per-prompt numbers the harness records and averages (e.g. `accept_len`, `steps`,
        `time_s`); JSON-serialisable values only.
    """

    tokens: list[int]
    text: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


def result_text(result: Completion, tokenizer) -> str:
    """The result's text, or its tokens decoded without special tokens."""
    if result.text is not None:
        return result.text
    return tokenizer.decode(list(result.tokens), skip_special_tokens=True)


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
    ) -> list[Completion]:
        out: list[Completion] = []
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
                out.append(Completion(list(toks), None, stats))
        return out
