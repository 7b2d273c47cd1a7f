"""The one gateway to `dustin_kernels`: every other module of the runtime, the profiler and the
evaluations reaches the kernels through here (only `dustin_eval.bench_attention`, which benchmarks
them, imports them directly).

- `SparseOps`: the sparse-verification ops the policies call, the Triton launchers on CUDA and
  their pure-torch `_ref` versions elsewhere; both write into caller-owned buffers, so a policy's
  per-step work allocates nothing but temporaries.
- `kernels`: every other kernel (the model's fused layer kernels, the full-cache verification
  attention, the lookup draft) by name, imported on first use (Triton loads with the first kernel,
  not with the runtime)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

# name -> the dustin_kernels module that defines it
_WHERE = {
    "rope_qkv_to_cache": "layer_ops", "swiglu": "layer_ops", "rms_norm": "layer_ops", "add_rms_norm": "layer_ops",
    "skinny_linear": "skinny", "skinny_split": "skinny", "ROUTE_ROWS": "skinny",
    "full_verify_attention": "verify_attention", "sparse_verify_attention_rope": "verify_attention",
    "lookup_draft": "lookup", "MAX_NGRAM": "lookup", "lookup_draft_ref": "reference",
    "srh_scores": "srh_scores", "srh_scores_ref": "reference", "select_indices": "select",
    "select_indices_ref": "reference",
}


class _Kernels:
    """`kernels.NAME`: the kernel (or constant) NAME of `dustin_kernels`, imported on first use and
    then a plain attribute (no import on the hot path)."""

    def __getattr__(self, name: str):
        if name not in _WHERE:
            raise AttributeError(f"dustin_kernels has no {name!r} reached through dustin_runtime.ops")
        value = getattr(importlib.import_module(f"dustin_kernels.{_WHERE[name]}"), name)
        setattr(self, name, value)
        return value


kernels = _Kernels()


@dataclass(frozen=True)
class SparseOps:
    """srh_scores / select_indices / sparse_verify_attention with one calling convention."""

    triton: bool

    def srh_scores(
        self,
        q: torch.Tensor,  # [B, Hs, M, D]
        kv_heads: torch.Tensor,  # [Hs] int32
        k_cache: torch.Tensor,  # [B, G, N_max, D]
        cache_lens: torch.Tensor,  # [B] int32
        out: torch.Tensor,  # [B, N_max] fp32
        *,
        reduce: str,
        accumulate: bool,
        counters: str = "srh",
        sms: int | None = None,
    ) -> torch.Tensor:
        """Softmax mass of the heads' queries over [0, cache_lens) into `out` (added or maxed
        into it with `accumulate`; entries >= cache_lens are 0 without it). `counters`: the kernel's
        ticket namespace (a call that may run beside another on a second stream takes its own). `sms`: the
        kernels' grids sized for that many SMs (a scoring beside other work; Triton only)."""
        if self.triton:
            from dustin_kernels import srh_scores

            return srh_scores(q, kv_heads, k_cache, cache_lens, reduce=reduce, out=out, accumulate=accumulate,
                              counters=counters, sms=sms)
        from dustin_kernels import srh_scores_ref

        return out.copy_(srh_scores_ref(q, kv_heads, k_cache, cache_lens, reduce=reduce, out=out,
                                        accumulate=accumulate))

    def select_indices(
        self,
        primary: torch.Tensor,  # [R, N_max] fp32
        secondary: torch.Tensor | None,  # [R, N_max] fp32
        cache_lens: torch.Tensor,  # [R] int32
        out: torch.Tensor,  # [R, budget] int32
        *,
        sinks: int,
        window: int,
        m: int,
    ) -> torch.Tensor:
        """Sinks + window + top-m of primary + fill by secondary into `out` (sorted, -1 padded)."""
        budget = out.shape[1]
        if self.triton:
            from dustin_kernels import select_indices

            return select_indices(primary, secondary, cache_lens, budget=budget, sinks=sinks, window=window,
                                  m=m, out=out)
        from dustin_kernels import select_indices_ref

        return out.copy_(select_indices_ref(primary, secondary, cache_lens, budget=budget, sinks=sinks,
                                            window=window, m=m))

    def sparse_verify_attention(
        self,
        q: torch.Tensor,  # [B, H, M, D]
        k_cache: torch.Tensor,  # [B, G, N_max, D]
        v_cache: torch.Tensor,
        indices: torch.Tensor,  # [B, S] or [B, G, S] int32, -1 padded
        cache_lens: torch.Tensor,  # [B] int32: the new tokens sit at rows cache_lens + j
    ) -> torch.Tensor:
        """Attention of the M new queries over the indexed rows plus the new tokens: [B, H, M, D]
        in q's dtype."""
        if self.triton:
            from dustin_kernels import sparse_verify_attention

            return sparse_verify_attention(q, k_cache, v_cache, indices, cache_lens)
        from dustin_kernels import sparse_verify_attention_ref

        return sparse_verify_attention_ref(q, k_cache, v_cache, indices, cache_lens).to(q.dtype)


def default_ops(device: torch.device | str) -> SparseOps:
    """Triton kernels on CUDA, the torch references elsewhere."""
    return SparseOps(triton=torch.device(device).type == "cuda")
