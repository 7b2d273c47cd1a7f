"""Text in, text out: load a target (and a draft), tokenise prompts, decode, detokenise. The CLI and
the evaluation harnesses call this; it holds no policy of its own (policies arrive as `SpecHooks`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.exact import ExactConfig
from dustin_runtime.generate import generate
from dustin_runtime.loader import (
    Checkpoint,
    load_model,
    parse_dtype,
    read_config,
    resolve_checkpoint,
)
from dustin_runtime.lookup import LookupConfig
from dustin_runtime.memory import check_free, plan_decode
from dustin_runtime.model import Transformer
from dustin_runtime.sampling import SamplingConfig
from dustin_runtime.speculative import SpecHooks, speculative_generate
from dustin_runtime.stats import DecodeStats, join_stats
from dustin_runtime.tokenizer import check_same_vocab, encode, eos_ids, load_tokenizer
from dustin_runtime.tp import TensorParallel


@dataclass
class LoadedModel:
    """A model with its checkpoint and tokenizer."""

    model: Transformer
    ckpt: Checkpoint
    tokenizer: object

    @property
    def model_id(self) -> str:
        return self.ckpt.model_id


def pick_device(device: str | None) -> str:
    """'cuda' when available and not overridden, else 'cpu'; refuses cuda without a GPU."""
    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):  # 'cpu:x', 'cuda:abc', ''
        d = None
    if d is None or d.type not in ("cpu", "cuda") or (d.type == "cpu" and d.index not in (None, 0)):
        raise DustinError(f"unknown device {device!r}; use cpu, cuda or cuda:N")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise DustinError(f"device {device!r} asked for, but no CUDA GPU is visible")
    if d.index is not None and d.type == "cuda" and d.index >= torch.cuda.device_count():
        raise DustinError(f"device {device!r}: only {torch.cuda.device_count()} CUDA GPU(s) are visible")
    return device


def pick_dtype(dtype: str | None, device: str) -> torch.dtype:
    """bf16 on CUDA and fp32 on CPU unless given."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return parse_dtype(dtype)


def load(spec: str, *, dtype: torch.dtype, device: str, tp: TensorParallel | None = None) -> LoadedModel:
    """Resolve, load (under `tp`: this rank's shard) and attach the tokenizer of one checkpoint; on
    CUDA the model runs its fused Triton layer ops (`Transformer.use_kernels`)."""
    model, ckpt = load_model(spec, dtype=dtype, device=device, tp=tp)
    if model.device.type == "cuda":
        model.use_kernels()
    return LoadedModel(model, ckpt, load_tokenizer(ckpt))


def load_pair(
    target: str, draft: str | None, *, dtype: torch.dtype, device: str, tp: TensorParallel | None = None,
    draft_vocab: str | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Target and optional draft; refuses a draft whose vocabulary differs from the target's. Under
    tensor parallelism (`tp`) the target is sharded and the draft replicated on every rank. With
    `draft_vocab` ('PATH:K', `dustin_runtime.draft_vocab`) the draft's head keeps K tokens (and EOS)."""
    if draft_vocab is not None and draft is None:
        raise DustinError("--draft-vocab restricts the draft's head: give --draft too")
    if draft_vocab is not None:
        from dustin_runtime.draft_vocab import parse_spec

        parse_spec(draft_vocab)  # a malformed spec is refused before any model loads
    shapes = [read_config(resolve_checkpoint(s)) if s else None for s in (target, draft)]
    check_free(plan_decode(*shapes, tp=1 if tp is None else tp.world, dtype_bytes=dtype.itemsize), device, tp)
    t = load(target, dtype=dtype, device=device, tp=tp)
    if draft is None:
        return t, None
    d = load(draft, dtype=dtype, device=device)
    check_same_vocab(t.tokenizer, d.tokenizer, t.model_id, d.model_id)
    if draft_vocab is not None:
        from dustin_runtime.draft_vocab import subset_for

        keep = eos_ids(d.tokenizer, d.model.cfg.eos_token_ids)
        d.model.restrict_head(subset_for(draft_vocab, d.model.cfg.vocab_size, d.tokenizer, keep))
    return t, d


@dataclass(frozen=True)
class PromptSpec:
    """One prompt of a batch and its own new-token limit."""

    text: str
    max_new_tokens: int


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise DustinError(f"{path}: no such file" + (" (a folder)" if path.is_dir() else ""))
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DustinError(f"{path}: {what} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise DustinError(f"{path}: unreadable ({e.strerror or e})") from None


DEFAULT_PROMPT = "Speculative decoding lets a small draft model propose tokens that a large target model"


def read_prompts(prompt: str | None, prompts: Path | None, max_new_tokens: int) -> list[PromptSpec]:
    """Prompts from --prompt, or --prompts FILE (a .jsonl file: {"prompt": str, "max_new_tokens":
    int?} per line, a batch; any other file: its whole text, one prompt), or the default prompt."""
    if prompt is not None and prompts is not None:
        raise DustinError("give --prompt or --prompts, not both")
    if prompts is None:
        return [PromptSpec(DEFAULT_PROMPT if prompt is None else prompt, max_new_tokens)]
    if prompts.suffix != ".jsonl":
        return [PromptSpec(_read_text(prompts, "the prompt file"), max_new_tokens)]
    batch_file = prompts
    out = []
    for i, line in enumerate(_read_text(batch_file, "the batch file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
            raise DustinError(f"{batch_file}:{i}: expected a JSON object with a \"prompt\" string")
        n = rec.get("max_new_tokens", max_new_tokens)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise DustinError(f"{batch_file}:{i}: max_new_tokens must be a positive integer, got {n!r}")
        out.append(PromptSpec(rec["prompt"], n))
    if not out:
        raise DustinError(f"{batch_file}: no prompts")
    return out


@dataclass
class DecodeOutput:
    """Per-sequence tokens and text, and the run's statistics."""

    prompt_tokens: list[list[int]]
    tokens: list[list[int]]
    texts: list[str]
    finish_reasons: list[str]
    stats: DecodeStats
    meta: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The JSON record `dustin decode --json` prints."""
        return {
            "tokens": self.tokens,
            "text": self.texts,
            "finish_reasons": self.finish_reasons,
            "stats": self.stats.to_dict(),
            **self.meta,
        }


def batch_plan(target: LoadedModel, draft: LoadedModel | None, ids: list[list[int]], max_new: list[int], *,
               gamma: int, exact: ExactConfig = ExactConfig()):
    """batch -> the memory plan of decoding that many of these prompts together (`memory.plan_decode_batch`
    at the longest prompt and the most new tokens)."""
    from dustin_runtime.memory import plan_decode_batch

    model = target.model
    g = gamma if draft is not None else 0
    rows = max(map(len, ids)) + max(max_new) + 2 * (g + 1) + 1 + (exact.rows(g) if draft is not None else 0)

    def plan_at(b: int):
        return plan_decode_batch(model.cfg, None if draft is None else draft.model.cfg, batch=b, rows=rows,
                                 prompt=max(map(len, ids)), gamma=g, tp=1 if model.tp is None else model.tp.world,
                                 dtype_bytes=model.dtype.itemsize)

    return plan_at


def batch_size(target: LoadedModel, draft: LoadedModel | None, ids: list[list[int]], max_new: list[int], *,
               gamma: int, exact: ExactConfig = ExactConfig(), memory: int | None = None) -> int:
    """How many prompts decode together: the largest batch whose plan (`batch_plan`) fits `memory`
    bytes (default: what the device has free beside the loaded models; host memory on CPU); under
    tensor parallelism every rank takes the smallest rank's."""
    from dustin_runtime.memory import decode_batch_size, host_free_bytes, torch_device_name

    model = target.model
    cuda = model.device.type == "cuda"
    if memory is None:
        memory = int(torch.cuda.mem_get_info(model.device)[0]) if cuda else host_free_bytes()
    size = decode_batch_size(batch_plan(target, draft, ids, max_new, gamma=gamma, exact=exact), len(ids), memory,
                             torch_device_name(str(model.device)) if cuda else "the host")
    if model.tp is not None:  # the same batches on every rank
        size = -int(model.tp.all_reduce_(torch.tensor([-size], device=model.device), "max").item())
    return size


def decode(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: list[PromptSpec],
    *,
    gamma: int = 4,
    sampling: SamplingConfig = SamplingConfig(),
    chat: bool = False,
    seed: int = 0,
    hooks: SpecHooks | None = None,
    cuda_graphs: bool | None = None,
    lookup: LookupConfig | None = None,
    exact: ExactConfig = ExactConfig(),
    memory: int | None = None,
) -> DecodeOutput:
    """Decode a batch of text prompts: autoregressive without a draft, speculative with one (the
    steps as CUDA graphs on CUDA unless `cuda_graphs` is False). Prompts go through in consecutive
    batches that fit `memory` bytes (`batch_size`); greedy output is the same whatever the split,
    batch i samples with seed + i (one batch: `seed`, as before)."""
    if gamma < 1:
        raise DustinError(f"gamma (draft tokens per step) must be >= 1, got {gamma}")
    bad = [p.max_new_tokens for p in prompts if p.max_new_tokens < 1]
    if bad:
        raise DustinError(f"max new tokens must be >= 1, got {bad[0]}")
    tok = target.tokenizer
    ids = [encode(tok, p.text, chat=chat) for p in prompts]
    max_new = [p.max_new_tokens for p in prompts]
    eos = eos_ids(tok, target.model.cfg.eos_token_ids)
    if draft is None and hooks is not None:
        raise DustinError("a verification policy needs a draft (--draft)")
    size = batch_size(target, draft, ids, max_new, gamma=gamma, exact=exact, memory=memory)
    parts = []
    for i, lo in enumerate(range(0, len(ids), size)):
        part, new = ids[lo:lo + size], max_new[lo:lo + size]
        if draft is None:
            parts.append(generate(target.model, part, new, sampling=sampling, eos_ids=eos, seed=seed + i,
                                  cuda_graphs=cuda_graphs))
        else:
            parts.append(speculative_generate(
                target.model, draft.model, part, new, gamma=gamma, sampling=sampling, eos_ids=eos, hooks=hooks,
                seed=seed + i, cuda_graphs=cuda_graphs, lookup=lookup, exact=exact))
    tokens = [t for r in parts for t in r.tokens]
    reasons = [f for r in parts for f in r.finish_reasons]
    texts = [tok.decode(t, skip_special_tokens=True) for t in tokens]
    meta = {
        "target": target.model_id,
        "draft": draft.model_id if draft else None,
        "draft_head_tokens": None if draft is None or draft.model.head_ids is None else int(draft.model.head_ids.numel()),
        "device": str(target.model.device),
        "tp": 1 if target.model.tp is None else target.model.tp.world,
        "dtype": str(target.model.dtype).removeprefix("torch."),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "draft_lookup": None if lookup is None else lookup.label(),
        "batch_size": size,
        "batches": len(parts),
    }
    return DecodeOutput(ids, tokens, texts, reasons, join_stats([r.stats for r in parts]), meta)
