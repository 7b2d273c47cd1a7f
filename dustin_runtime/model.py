"""One decoder for the Llama family (Llama-3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2), gpt-fast style:
fused QKV and gate/up projections, RMSNorm, RoPE, GQA through an attention backend, SwiGLU,
tied or untied LM head. A forward pass processes T new tokens per sequence at per-sequence
positions `cache.lengths[b] + t`, writes their K/V into the static cache and leaves the lengths
alone: the caller commits (advances) or rolls back.

Under tensor parallelism (`tp`, see `dustin_runtime.tp`) each rank builds the layers at its shard's
shapes (`shard_config`): attention by KV heads with wo row parallel, the MLP column then row
parallel, embedding and LM head by vocabulary rows; the partial sums of wo, w2 and the embedding
are all-reduced. `cfg` stays the whole model's config."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dustin_runtime.attention import AttentionBackend, ForwardContext
from dustin_runtime.config import ModelConfig
from dustin_runtime.errors import DustinError
from dustin_runtime.kv_cache import KVCache
from dustin_runtime.ops import kernels
from dustin_runtime.rope import apply_rope, rope_table
from dustin_runtime.tp import TensorParallel, shard_config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


@dataclass
class Rope:
    """What the layers of one forward pass need for RoPE: the cos/sin table for the fused kernel
    path, or the gathered cos/sin [B, 1, T, D] for the reference path."""

    fused: bool
    table: torch.Tensor  # [2, N, D]
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    skinny: bool = False  # the layers' linears through `dustin_kernels.skinny` (few rows, fused path)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None):
        """`cfg`: this rank's shapes (its heads); under TP wo's bias lives on rank 0 only (added once
        by the all-reduce)."""
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.wqkv = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.wo = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias and (tp is None or tp.rank == 0))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def forward(self, x: torch.Tensor, layer: int, rope: Rope, cache: KVCache, backend: AttentionBackend,
                ctx: ForwardContext) -> torch.Tensor:
        """x [B, T, d] -> the attention block's output [B, T, d] (summed over ranks under TP)."""
        o = self.attend_qkv(self.wqkv(x), layer, rope, cache, backend, ctx)  # [B, T, H * D]
        out = self.wo(o)  # [B, T, d]
        return out if self.tp is None else self.tp.all_reduce_(out)

    def attend_qkv(
        self,
        qkv: torch.Tensor,  # [B, T, (H + 2G) * D]: the fused projection's output
        layer: int,
        rope: Rope,
        cache: KVCache,
        backend: AttentionBackend,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """RoPE, the cache write and attention: the heads' outputs [B, T, H * D] before wo."""
        c = self.cfg
        B, T, _ = qkv.shape
        if rope.fused and not c.qk_norm:
            o = backend.attend_qkv(layer, qkv, rope.table, c.num_heads, cache, ctx)  # RoPE inside, where fused
            if o is not None:
                return o.transpose(1, 2).reshape(B, T, c.q_size)
        if rope.fused:
            qn, kn = (self.q_norm.weight, self.k_norm.weight) if c.qk_norm else (None, None)
            q = kernels.rope_qkv_to_cache(qkv, rope.table, ctx.positions, cache.k[layer], cache.v[layer],
                                          c.num_heads, qn, kn, c.rms_eps)  # [B, H, T, D]
        else:
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = q.view(B, T, c.num_heads, c.head_dim)
            k = k.view(B, T, c.num_kv_heads, c.head_dim)
            v = v.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)  # [B, G, T, D]
            if c.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q = apply_rope(q.transpose(1, 2), rope.cos, rope.sin)  # [B, H, T, D]
            k = apply_rope(k.transpose(1, 2), rope.cos, rope.sin)  # [B, G, T, D]
            cache.write(layer, k, v, ctx.positions)
        o = backend.attend(layer, q, cache, ctx)  # [B, H, T, D]
        return o.transpose(1, 2).reshape(B, T, c.q_size)


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None):
        super().__init__()
        self.tp = tp
        self.inter = cfg.intermediate_size
        self.w13 = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # gate | up
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if fused:
            out = self.w2(kernels.swiglu(self.w13(x)))
        else:
            gate, up = self.w13(x).split([self.inter, self.inter], dim=-1)
            out = self.w2(F.silu(gate) * up)
        return out if self.tp is None else self.tp.all_reduce_(out)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg, tp)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.ffn = FeedForward(cfg, tp)

    def forward(self, x, layer, rope, cache, backend, ctx, pending=None):
        """-> (x, pending): the fused path leaves the MLP's output as a pending residual that the
        next norm adds (one kernel less per layer); the reference path adds it here. On the skinny
        path (a few rows: the layer's linears and SwiGLU through `skinny_linear`) pending and wo's output are
        fp32 partial sums [P, B * T, d] (split-K's slices) that the next norm adds up."""
        if rope.skinny:
            a, f = self.attn, self.ffn
            if pending is None:
                y = kernels.rms_norm(x, self.attn_norm.weight, self.attn_norm.eps)
            else:
                x, y = kernels.add_rms_norm(x, pending, self.attn_norm.weight, self.attn_norm.eps, partials=True)
            qkv = kernels.skinny_linear(y, a.wqkv.weight, bias=a.wqkv.bias)  # [B, T, (H + 2G) D]
            o = a.attend_qkv(qkv, layer, rope, cache, backend, ctx)  # [B, T, H D]
            if a.wo.bias is None:
                h = kernels.skinny_linear(o, a.wo.weight,
                                          parts=kernels.skinny_split(a.wo.weight, x.device))  # [P, B T, d]
            else:
                h = kernels.skinny_linear(o, a.wo.weight, bias=a.wo.bias).view(1, -1, x.shape[-1])
            x, y = kernels.add_rms_norm(x, h, self.ffn_norm.weight, self.ffn_norm.eps, partials=True)
            act = kernels.skinny_linear(y, f.w13.weight, swiglu=True)  # [B, T, I]
            return x, kernels.skinny_linear(act, f.w2.weight, parts=kernels.skinny_split(f.w2.weight, x.device))
        if rope.fused:
            if pending is None:
                y = kernels.rms_norm(x, self.attn_norm.weight, self.attn_norm.eps)
            else:
                x, y = kernels.add_rms_norm(x, pending, self.attn_norm.weight, self.attn_norm.eps)
            h = self.attn(y, layer, rope, cache, backend, ctx)
            x, y = kernels.add_rms_norm(x, h, self.ffn_norm.weight, self.ffn_norm.eps)
            return x, self.ffn(y, fused=True)
        x = x + self.attn(self.attn_norm(x), layer, rope, cache, backend, ctx)
        return x + self.ffn(self.ffn_norm(x)), None


class Transformer(nn.Module):
    """The decoder. `forward` returns logits [B, T', V] (float32) for T' = T, 1 or no positions.
    With `tp`, this rank's shard of it (`shard`: its shapes; vocabulary rows [vocab_start,
    vocab_start + shard.vocab_size))."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel | None = None):
        super().__init__()
        self.cfg, self.tp = cfg, tp
        self.shard = local = shard_config(cfg, tp)
        self.vocab_start = 0 if tp is None else tp.rank * local.vocab_size
        self.vocab_rows = min(local.vocab_size, cfg.vocab_size - self.vocab_start)  # the rest: padding
        # given its (uninitialised) weight: Embedding's own normal_ init imports torch._dynamo (~1.5 s of start-up)
        self.embed = nn.Embedding(local.vocab_size, cfg.hidden_size, _weight=torch.empty(local.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(Block(local, tp) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, local.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.register_buffer("rope", torch.empty(2, 0, cfg.head_dim), persistent=False)
        self.fused = False  # fused Triton layer ops (set by `use_kernels`; CUDA only)
        self.skinny = False  # and the linears of forwards of <= skinny.ROUTE_ROWS rows fused with them
        self.head_ids: torch.Tensor | None = None  # [V'] int64: the LM head's vocabulary subset (restrict_head)
        self.head_w: torch.Tensor | None = None  # [V', d]: its rows of the LM head

    def use_kernels(self, on: bool = True) -> Transformer:
        """Run norms, SwiGLU and RoPE + cache writes through the fused Triton kernels; forwards of
        few rows (a draft's decode steps) also run their linears through `skinny_linear`, with the
        norms and SwiGLU inside (one process only: under TP the partial sums are all-reduced)."""
        runnable = self.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
        d = self.cfg.head_dim
        self.fused = on and runnable and d >= 8 and d & (d - 1) == 0
        self.skinny = self.fused and self.tp is None and self.dtype in (torch.bfloat16, torch.float16,
                                                                        torch.float32)
        return self

    def restrict_head(self, ids: torch.Tensor | None) -> Transformer:
        """Compute logits only for the tokens `ids` (sorted, distinct; FR-Spec's frequency-ranked
        subset, for a draft): the others get -inf, i.e. probability zero, so speculative sampling
        stays exact (the target's rejection step corrects any draft distribution). The head then reads
        V' rows instead of V. `None` restores the whole head. One process only (a draft is replicated)."""
        if ids is None:
            self.head_ids = self.head_w = None
            return self
        if self.tp is not None:
            raise DustinError("a vocabulary-subset head needs an unsharded model (the draft)")
        ids = torch.unique(torch.as_tensor(ids, dtype=torch.long))  # sorted, distinct
        V = self.cfg.vocab_size
        if ids.numel() == 0 or ids[0] < 0 or ids[-1] >= V:
            raise DustinError(f"a vocabulary subset takes 1..{V} token ids in [0, {V}), got {ids.tolist()[:3]}"
                              f"{'...' if ids.numel() > 3 else ''} ({ids.numel()} ids)")
        self.head_ids = ids.to(self.device)
        self.head_w = self.lm_head.weight.detach()[self.head_ids].contiguous()
        return self

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """LM head of normed hidden states h [..., d] -> float32 logits [..., V] (this rank's columns);
        with a vocabulary subset, -inf outside it."""
        if self.head_ids is None:
            out = self.lm_head(h).float()
            if self.vocab_rows < self.shard.vocab_size:  # padded rows of the last rank's share: never chosen
                out[..., self.vocab_rows:] = float("-inf")
            return out
        sub = F.linear(h, self.head_w).float()  # [..., V']
        out = torch.full((*sub.shape[:-1], self.shard.vocab_size), float("-inf"), dtype=torch.float32,
                         device=sub.device)
        return out.index_copy_(-1, self.head_ids, sub)

    def weight_bytes_read(self) -> int:
        """Bytes of weights one decode forward reads (byte floors): every parameter but the embedding
        table (a forward gathers a few of its rows), plus the LM head's rows (its vocabulary subset's
        when restricted; a tied head is the embedding table, read whole)."""
        head = self.head_w if self.head_w is not None else self.lm_head.weight
        skip = {id(self.embed.weight), id(self.lm_head.weight)}
        rest = sum(p.numel() * p.element_size() for p in self.parameters() if id(p) not in skip)
        return rest + head.numel() * head.element_size()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def setup_rope(self, max_len: int) -> None:
        """Build the cos/sin table for positions [0, max_len) on the model's device."""
        if self.rope.shape[1] < max_len:
            self.rope = rope_table(self.cfg, max_len, self.device)

    def allocate_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """An empty static cache for this model (this rank's KV heads; and a RoPE table long enough)."""
        self.setup_rope(max_len)
        return KVCache.allocate(self.shard, batch, max_len, dtype=dtype or self.dtype, device=self.device)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> [B, T, d]; under TP a lookup in this rank's rows, summed over ranks."""
        if self.tp is None:
            return self.embed(tokens)
        ids = tokens - self.vocab_start
        mine = (ids >= 0) & (ids < self.shard.vocab_size)  # [B, T]
        x = self.embed(torch.where(mine, ids, 0))
        return self.tp.all_reduce_(torch.where(mine.unsqueeze(-1), x, 0))

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits columns [..., V'/P] -> the whole vocabulary's [..., V] (all-gather;
        the padding past V dropped)."""
        if self.tp is None:
            return logits
        parts = self.tp.all_gather(logits)  # [P, ..., V'/P]
        return parts.movedim(0, -2).reshape(*logits.shape[:-1], -1)[..., : self.cfg.vocab_size]

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] int64
        cache: KVCache,
        backend: AttentionBackend,
        *,
        phase: str = "decode",
        logits: str = "all",  # "all" | "last" | "none"
        kv_len: int | None = None,
        rows: tuple[int, int] | None = None,
        final: bool = False,
        local_vocab: bool = False,
    ) -> torch.Tensor | None:
        """Under TP the logits are gathered over ranks unless `local_vocab`: then this rank's
        columns [vocab_start, vocab_start + V/P) only (the decoding loops reduce over them)."""
        B, T = tokens.shape
        start = cache.lengths.clone()  # [B] int32
        positions = start.view(B, 1).long() + torch.arange(T, device=tokens.device)  # [B, T]
        if self.fused:
            rope = Rope(True, self.rope, skinny=self.skinny and B * T <= kernels.ROUTE_ROWS)
        else:
            rope = Rope(False, self.rope, self.rope[0][positions].unsqueeze(1), self.rope[1][positions].unsqueeze(1))
        ctx = ForwardContext(start, positions, T, phase, kv_len, rows, final)
        backend.begin(ctx)
        x, pending = self.embed_tokens(tokens), None  # [B, T, d]
        for i, block in enumerate(self.layers):
            x, pending = block(x, i, rope, cache, backend, ctx, pending)
        backend.end(ctx)
        if logits == "none":
            return None
        if rope.skinny:  # pending: partial sums [P, B T, d]

            if logits == "last" and T > 1:
                x, pending = x[:, -1:], pending.view(pending.shape[0], B, T, -1)[:, :, -1]
            out = self.logits(kernels.add_rms_norm(x, pending, self.norm.weight, self.norm.eps, partials=True)[1])
            return out if local_vocab else self.gather_vocab(out)
        if logits == "last":
            x, pending = x[:, -1:], None if pending is None else pending[:, -1:]
        if pending is not None:
            out = self.logits(kernels.add_rms_norm(x, pending, self.norm.weight, self.norm.eps)[1])
        else:
            out = self.logits(self.norm(x))
        return out if local_vocab else self.gather_vocab(out)
