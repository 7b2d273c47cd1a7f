"""Tensor parallelism over a `torch.distributed` process group (NCCL on CUDA, gloo on CPU), one
process per GPU, started by `torchrun` (see the README's multi-GPU section).

Layout (Megatron / gpt-fast), rank r of P:
- target attention split by KV heads: rank r holds KV heads [r G/P, (r + 1) G/P), their query heads,
  their rows of wqkv (q | k | v, each by head) and of the KV cache; wo is row parallel (its columns
  of those heads) and its output is summed over ranks (one all-reduce);
- the MLP column then row parallel: rank r holds rows [r I/P, (r + 1) I/P) of gate and up (w13) and
  those columns of down (w2), one all-reduce;
- the embedding and the LM head split by vocabulary rows: an embedding lookup is a masked local
  lookup plus one all-reduce; each rank's logits are its vocabulary columns, and greedy choice and
  sampling reduce over ranks with [B, T]-sized collectives (`dustin_runtime.sampling`);
- the draft is replicated and runs batch-parallel: rank r drafts sequences [r B/P, (r + 1) B/P)
  over its own draft cache; the drafted tokens and the draft's lookahead signal are all-gathered.

Every rank runs the same loop over the same host-side control flow, so collectives match up, and
each rank computes the same accept decision from the same gathered values. Each rank keeps its own
retrieval heads; the target-history vector [B, N] is summed over ranks, so every rank selects the
same [B, S] verification set, the one a single process selects.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError
from dustin_runtime.launch import launch, launch_rank, launched, rendezvous  # noqa: F401 (launch_rank, launched: callers')
from dustin_runtime.sparse.config import Head

if TYPE_CHECKING:  # torch loads with the first tensor-parallel call, not with the CLI
    import torch


@dataclass(eq=False)
class TensorParallel:
    """This process's place in a tensor-parallel group: `rank` of `world`, the process group
    (None: the default group). While `record`
    is a list, every collective appends (kind, elements, dtype) to it (what a step sends)."""

    rank: int
    world: int
    group: Any = None
    record: list | None = None

    def span(self, n: int) -> tuple[int, int]:
        """This rank's [start, stop) of n items split evenly (n divisible by world)."""
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def rows(self, batch: int) -> slice:
        """The sequences this rank drafts: rows [r B/P, (r + 1) B/P) of a batch of B."""
        return slice(*self.span(batch))

    def all_reduce_(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or max) `t` over ranks, in place."""
        import torch.distributed as dist

        if self.record is not None:
            self.record.append(("all_reduce", t.numel(), t.dtype))
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` stacked: [world, *t.shape]."""
        if self.record is not None:
            self.record.append(("all_gather", t.numel(), t.dtype))
        out = t.new_empty(self.world * t.numel())
        _gather_into(out, t.contiguous().view(-1), self.group)
        return out.view(self.world, *t.shape)

    def gather_rows(self, t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's rows of a batch-parallel tensor t [B/P, ...] -> [B, ...] (into `out`)."""
        if self.record is not None:
            self.record.append(("all_gather", t.numel(), t.dtype))
        if out is None:
            out = t.new_empty(self.world * t.shape[0], *t.shape[1:])
        _gather_into(out.view(-1), t.contiguous().view(-1), self.group)
        return out

    def share(self, obj: Any) -> Any:
        """Collective: rank 0's `obj` (any picklable value) on every rank, so every rank takes rank 0's
        decision (e.g. the profile's refresh search, `dustin_profile.run`)."""
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def agree(self, error: str | None) -> None:
        """Collective: raise the same `DustinError` on every rank when any rank has an error (the
        lowest failing rank's, naming the rank when it is not rank 0, which prints), so no rank
        waits for a failed one."""
        import torch.distributed as dist

        errors: list[str | None] = [None] * self.world
        dist.all_gather_object(errors, error, group=self.group)
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            r, e = failed[0]
            raise DustinError(e if r == 0 else f"rank {r} of {self.world}: {e}")


def _gather_into(out: torch.Tensor, t: torch.Tensor, group) -> None:
    """all_gather_into_tensor (named all_gather_single from torch 2.13 on)."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, t, group=group)


def shard_config(cfg: ModelConfig, tp: TensorParallel | None) -> ModelConfig:
    """The shapes one rank holds: heads, KV heads and MLP width divided by the world size, and the
    vocabulary padded to a multiple of it (ceil(V / P) rows each; the last rank's rows past V are
    zeros whose logits are -inf, never chosen or sampled, as vLLM pads). Refuses, in one line, a
    world size that does not divide the heads or the MLP, or leaves a rank no vocabulary row."""
    if tp is None:
        return cfg
    P = tp.world
    if cfg.num_kv_heads % P:
        raise DustinError(f"--tp {P} does not divide the {cfg.num_kv_heads} KV heads of {cfg.name or cfg.arch} "
                          f"(attention is split by KV heads): use a --tp that divides {cfg.num_kv_heads}")
    if cfg.intermediate_size % P:
        raise DustinError(f"--tp {P} does not divide the MLP width (intermediate_size) {cfg.intermediate_size} "
                          f"of {cfg.name or cfg.arch}: use a --tp that divides it")
    per = padded_vocab(cfg.vocab_size, P) // P
    if (P - 1) * per >= cfg.vocab_size:
        raise DustinError(f"--tp {P} leaves a rank no row of the vocabulary of {cfg.vocab_size}: use a smaller --tp")
    return replace(cfg, num_heads=cfg.num_heads // P, num_kv_heads=cfg.num_kv_heads // P,
                   intermediate_size=cfg.intermediate_size // P, vocab_size=per)


def padded_vocab(vocab: int, world: int) -> int:
    """The vocabulary rounded up to a multiple of the world size (the rows every rank's share covers)."""
    return -(-vocab // world) * world


def local_heads(heads: tuple[Head, ...], tp: TensorParallel | None, cfg: ModelConfig,
                rank: int | None = None) -> tuple[Head, ...]:
    """The retrieval heads (layer, kv_head, query_heads) on a rank's KV heads (this rank's unless
    `rank`), renumbered to its shard: KV head g - g0, query head h - g0 * n_rep."""
    if tp is None:
        return heads
    r = tp.rank if rank is None else rank
    per = cfg.num_kv_heads // tp.world
    g0 = r * per
    return tuple((layer, g - g0, tuple(h - g0 * cfg.n_rep for h in qh)) for layer, g, qh in heads
                 if g0 <= g < g0 + per)


def check_gpus(world: int, local_world: int, visible: int) -> None:
    """Refuse more processes on this machine than GPUs it shows (one GPU per rank)."""
    if local_world > visible:
        raise DustinError(f"--tp {world} puts {local_world} processes on this machine, which shows {visible} "
                          f"GPU{'s' if visible != 1 else ''} (one GPU per rank)")


def start(tp: int | None, device: str) -> TensorParallel | None:
    """Join the process group that torchrun set up (NCCL on CUDA, with NVLink multicast off; gloo
    on CPU) and, on CUDA, make this rank's GPU the current device. `tp` None takes the launcher's
    world size; without a launcher `--tp 1` (or None) is a plain single process (None returned)
    and a larger `--tp` is refused with the command to run."""
    if tp is not None and tp < 1:
        raise DustinError(f"--tp must be >= 1, got {tp}")
    at = launch()
    if at is None:
        if tp is not None and tp > 1:
            raise DustinError(f"--tp {tp} runs one process per GPU: start it with "
                              f"`torchrun --nproc-per-node {tp} -m dustin.cli ... --tp {tp}`")
        return None
    world, rank = at.world, at.rank
    if tp is not None and tp != world:
        raise DustinError(f"--tp {tp}, but the launcher started {world} process{'es' if world != 1 else ''} "
                          f"(WORLD_SIZE={world}): give --nproc-per-node {tp}")
    import torch
    import torch.distributed as dist

    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        check_gpus(world, at.local_world, torch.cuda.device_count())
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # no NVLink SHARP / multicast objects
        local = torch.device("cuda", at.local_rank)
        torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=local, store=rendezvous(at), rank=rank, world_size=world)
    elif not dist.is_initialized():
        dist.init_process_group("gloo", store=rendezvous(at), rank=rank, world_size=world)
    return TensorParallel(rank, world, None)


def finish() -> None:
    """Leave the process group (at the end of a command)."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
