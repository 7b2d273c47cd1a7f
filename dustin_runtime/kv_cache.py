"""Static KV cache: preallocated per-layer [B, G, N_max, D] tensors and per-sequence lengths.

Writes go to per-sequence positions with `scatter_` (no host sync, no allocation beyond a view),
so a decode or verify step over this cache can be captured in a CUDA graph. Rolling back a
sequence is setting its length: rows past the length are garbage that the next write overwrites.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dustin_runtime.config import ModelConfig


@dataclass
class KVCache:
    """K and V per layer plus `lengths` [B] int32: the number of valid rows of each sequence."""

    k: list[torch.Tensor]  # per layer [B, G, N_max, D]
    v: list[torch.Tensor]  # per layer [B, G, N_max, D]
    lengths: torch.Tensor  # [B] int32

    @classmethod
    def allocate(
        cls,
        cfg: ModelConfig,
        batch: int,
        max_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> KVCache:
        """Zero-length cache for `batch` sequences of up to `max_len` tokens each."""
        shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        return cls(k, v, torch.zeros(batch, dtype=torch.int32, device=device))

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def num_layers(self) -> int:
        return len(self.k)

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, positions: torch.Tensor) -> None:
        """Store k_new/v_new [B, G, T, D] at rows positions [B, T] of each sequence."""
        B, G, T, D = k_new.shape
        idx = positions.to(torch.int64).view(B, 1, T, 1).expand(B, G, T, D)
        self.k[layer].scatter_(2, idx, k_new.to(self.k[layer].dtype))
        self.v[layer].scatter_(2, idx, v_new.to(self.v[layer].dtype))

    def advance(self, n: torch.Tensor | int) -> None:
        """Add n (int or [B]) to the lengths, in place."""
        self.lengths.add_(n)

    def set_lengths(self, lengths: torch.Tensor) -> None:
        """Set all lengths in place (rollback or commit), keeping the tensor's address."""
        self.lengths.copy_(lengths)

    def rows(self, start: int, stop: int) -> KVCache:
        """A view of sequences [start, stop) as a smaller cache (no copy): used by prefill."""
        return KVCache(
            [t[start:stop] for t in self.k],
            [t[start:stop] for t in self.v],
            self.lengths[start:stop],
        )

    def sequence(self, b: int) -> KVCache:
        """A view of sequence b as a batch-1 cache (no copy)."""
        return self.rows(b, b + 1)
