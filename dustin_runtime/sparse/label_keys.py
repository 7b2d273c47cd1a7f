"""Label keys: the retrieval scorers read r of the D key channels, from a packed copy.

Every target scorer of dustin (the retrieval heads' history and the refresh layers) ranks the
context by softmax(q . k / sqrt(D)) over every row: a pass over the keys of the KV heads it uses,
bytes-bound. A few channels carry most of q . k's spread across keys (Double Sparsity, Yang et al.
2024), so the scorers may use q_c . k_c / sqrt(D) over a profile's channels c (r of D per layer and
KV head, chosen offline: `dustin_profile.channels`). The channels of the scored layers' keys live
packed in a "label" cache [B, G, N_max, r] per layer beside the KV cache (r / D of those layers' key
bytes), so a scorer reads r / D of the bytes it read before.

The label rows follow the KV cache: the rows a verification pass writes are copied at that layer
before it is scored (`write`), and after a prefill the prompt's rows (`fill`). Rows past a sequence's
length are never read (the scorers stop at the length), so rejected drafts need no rollback: the
next pass writes those positions again."""

from __future__ import annotations

import math

import torch


class LabelKeys:
    """The label cache of `layers` for channels [Lt, G, r] (this rank's KV heads)."""

    def __init__(self, channels: torch.Tensor, layers: list[int], batch: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        L, G, r = channels.shape
        self.r, self.head_dim = r, head_dim
        self.scale = 1.0 / math.sqrt(head_dim)  # the model's softmax scale, not 1 / sqrt(r)
        self.ch = {layer: channels[layer].to(device=device, dtype=torch.long).contiguous() for layer in layers}  # [G, r]
        self.k = {layer: torch.zeros(batch, G, max_len, r, dtype=dtype, device=device) for layer in layers}

    def __contains__(self, layer: int) -> bool:
        return layer in self.k

    def write(self, layer: int, k_cache: torch.Tensor, positions: torch.Tensor) -> None:
        """Copy the channels of the rows at positions [B, T] (int64) of k_cache [B, G, N_max, D]."""
        ch, lab = self.ch[layer], self.k[layer]
        B, T = positions.shape
        G, r = ch.shape
        pos = positions.view(B, 1, T, 1)
        rows = k_cache.gather(2, pos.expand(B, G, T, k_cache.shape[3]))  # [B, G, T, D]
        lab.scatter_(2, pos.expand(B, G, T, r), rows.gather(3, ch.view(1, G, 1, r).expand(B, G, T, r)))

    def fill(self, layer: int, k_cache: torch.Tensor, rows: tuple[int, int] | None = None) -> None:
        """Copy the channels of every row of k_cache [b, G, N_max, D] (the batch rows `rows` of the cache)."""
        ch = self.ch[layer]
        lab = self.k[layer] if rows is None else self.k[layer][rows[0]: rows[1]]
        b, G, N, _ = k_cache.shape
        n = min(N, lab.shape[2])
        lab[:, :, :n].copy_(k_cache[:, :, :n].gather(3, ch.view(1, G, 1, -1).expand(b, G, n, self.r)))

    def head_channels(self, layer: int, kv: torch.Tensor) -> torch.Tensor:
        """The channels [Hs, r] of query heads using KV heads kv [Hs] (a scorer's, computed once)."""
        return self.ch[layer].index_select(0, kv.long()).contiguous()

    @staticmethod
    def queries(q: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """q [B, Hs, M, D] -> the channels idx [Hs, r] (`head_channels`) of each head: [B, Hs, M, r]."""
        B, Hs, M, _ = q.shape
        r = idx.shape[1]
        return q.gather(3, idx.view(1, Hs, 1, r).expand(B, Hs, M, r))
