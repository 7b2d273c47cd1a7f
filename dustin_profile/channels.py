"""Score channels (`dustin profile --score-channels R`): the R of D key channels per target layer and
KV head that dustin's scorers read (`dustin_runtime.sparse.label_keys`).

A scorer ranks rows by softmax(q . k / sqrt(D)); a channel i moves the ranking by how much q_i k_n,i
varies across the rows n (a shift common to every row cancels in the softmax). Its criterion is
E[q_i^2] summed over the KV head's query heads x Var_n(k_n,i), from the target's queries of the last
`QTAIL` prompt positions and every key of the calibration windows. Measured against Double Sparsity's
E|q_i| E|k_i| and against RoPE channel pairs (probes/probe_label_channels.py, SmolLM2 at 4k, 8 eval
windows x 256, S = 512, refresh 5 and 17): at 16 of 64 channels perplexity ratio 1.0280 (var) vs
1.0337 (abs), whole keys 1.0307; 8 of 64 lost 3% (1.0640)."""

from __future__ import annotations

import torch

from dustin_profile.groundtruth import Recorder
from dustin_runtime.attention import default_backend
from dustin_runtime.errors import DustinError

QTAIL = 256  # calibration queries per window: the prompt's last positions (decode-like, far from the sinks)
CRITERION = "E[q_i^2] over the KV head's query heads x Var_n(k_n,i)"


@torch.inference_mode()
def channel_stats(model, windows: list[list[int]], context: int, prefill_chunk: int = 2048) -> torch.Tensor:
    """The criterion [Lt, G, D] (fp64) summed over windows (each its first `context` tokens)."""
    from dustin_runtime.generate import prefill

    c = model.cfg
    if context < 3:
        raise DustinError(f"score channels need a context of at least 3 tokens, got {context}")
    L, G, D, rep = c.num_layers, c.num_kv_heads, c.head_dim, c.n_rep
    q2 = torch.zeros(L, G, D, dtype=torch.float64)
    kv = torch.zeros(L, G, D, dtype=torch.float64)
    crit = torch.zeros(L, G, D, dtype=torch.float64)
    n, nq = context - 1, queries(context)  # prompt rows written; the queries of the last nq of them
    for w in windows:
        rec = Recorder(default_backend(model.device), L, capture=list(range(n - nq, n)))
        cache = model.allocate_cache(1, context)
        prefill(model, cache, [list(w[:context])], rec, chunk=prefill_chunk, tail=nq)
        for layer in range(L):
            q = rec.q_capture[layer].double()  # [H, nq, D]
            k = cache.k[layer][0, :, :n].double()  # [G, n, D]
            q2[layer] = (q ** 2).mean(1).view(G, rep, D).sum(1).cpu()
            kv[layer] = k.var(1).cpu()
        crit += q2 * kv
        del cache
    return crit


def queries(context: int) -> int:
    """Calibration queries per window: the prompt's last QTAIL positions (half the prompt at most)."""
    return min(QTAIL, (context - 1) // 2)


def choose(crit: torch.Tensor, r: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """[Lt][G][r] the r channels of the largest criterion per layer and KV head, ascending."""
    D = crit.shape[-1]
    if not 1 <= r <= D:
        raise DustinError(f"--score-channels {r}: choose 1..{D} (the target's head dim)")
    top = crit.topk(r, dim=-1).indices.sort(-1).values  # [Lt, G, r]
    return tuple(tuple(tuple(c) for c in layer) for layer in top.tolist())


def kept_share(crit: torch.Tensor, channels) -> float:
    """The criterion's share the chosen channels keep, averaged over layers and KV heads."""
    ch = torch.tensor(channels, dtype=torch.long)
    return float((crit.gather(-1, ch).sum(-1) / crit.sum(-1).clamp_min(1e-300)).mean())
