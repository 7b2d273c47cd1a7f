"""Pure-torch references (fp32 math) for every kernel in `dustin_kernels`.

Slow, loop-per-sequence code whose only job is to be obviously right: the tests compare the
Triton launchers against these on random, awkward shapes.
"""

from __future__ import annotations

import math

import torch


def _new_kv(k_cache, v_cache, cache_lens, k_new, v_new, b: int, m: int):
    """The M new tokens' K/V of sequence b as fp32 [G, M, D] (from k_new or cache rows L..L+M-1)."""
    if k_new is not None:
        return k_new[b].float(), v_new[b].float()
    L = int(cache_lens[b])
    return k_cache[b, :, L : L + m].float(), v_cache[b, :, L : L + m].float()


def _attend(q, k, v, allowed, scale):
    """q [G, HG, M, D], k/v [G, T, D], allowed [G, M, T] bool -> [G, HG, M, D] fp32."""
    s = torch.einsum("ghmd,gtd->ghmt", q, k) * scale
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    return torch.einsum("ghmt,gtd->ghmd", torch.softmax(s, dim=-1), v)


def _verify_ref(q, k_cache, v_cache, cache_lens, k_new, v_new, scale, rows_of):
    B, H, M, D = q.shape
    G = k_cache.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty(B, H, M, D, dtype=torch.float32, device=q.device)
    causal = torch.ones(M, M, dtype=torch.bool, device=q.device).tril()  # [M(query), M(key)]
    for b in range(B):
        kn, vn = _new_kv(k_cache, v_cache, cache_lens, k_new, v_new, b, M)  # [G, M, D]
        ks, vs, allowed = [], [], []
        for g in range(G):
            rows = rows_of(b, g)  # [T] int64 context rows
            ks.append(torch.cat([k_cache[b, g, rows].float(), kn[g]]))
            vs.append(torch.cat([v_cache[b, g, rows].float(), vn[g]]))
            ctx = torch.ones(M, rows.numel(), dtype=torch.bool, device=q.device)
            allowed.append(torch.cat([ctx, causal], dim=1))
        qg = q[b].float().view(G, H // G, M, D)
        out[b] = _attend(qg, torch.stack(ks), torch.stack(vs), torch.stack(allowed), scale).reshape(H, M, D)
    return out


def full_verify_attention_ref(q, k_cache, v_cache, cache_lens, k_new=None, v_new=None, *, scale=None):
    """Reference of `full_verify_attention`: [B, H, M, D] fp32."""
    dev = q.device

    def rows_of(b, g):
        return torch.arange(int(cache_lens[b]), device=dev)

    return _verify_ref(q, k_cache, v_cache, cache_lens, k_new, v_new, scale, rows_of)


def sparse_verify_attention_ref(q, k_cache, v_cache, indices, cache_lens, k_new=None, v_new=None, *, scale=None):
    """Reference of `sparse_verify_attention`: [B, H, M, D] fp32; indices [B, S] or [B, G, S]."""

    def rows_of(b, g):
        row = indices[b] if indices.dim() == 2 else indices[b, g]
        return row[row >= 0].long()

    return _verify_ref(q, k_cache, v_cache, cache_lens, k_new, v_new, scale, rows_of)


def sparse_verify_attention_rope_ref(qkv, rope, k_cache, v_cache, indices, cache_lens, num_heads, *, scale=None):
    """Reference of `sparse_verify_attention_rope`: `rope_qkv_to_cache_ref` at positions cache_lens[b] + j
    (RoPE'd q; keys and values written to those cache rows), then `sparse_verify_attention_ref` with
    the new tokens from the cache. Returns (out fp32, q)."""
    from dustin_kernels.layer_ops import rope_qkv_to_cache_ref

    pos = cache_lens.long().view(-1, 1) + torch.arange(qkv.shape[1], device=qkv.device)  # [B, M]
    q = rope_qkv_to_cache_ref(qkv, rope, pos, k_cache, v_cache, num_heads)
    return sparse_verify_attention_ref(q, k_cache, v_cache, indices, cache_lens, scale=scale), q


def srh_scores_ref(q, kv_heads, k_cache, cache_lens, *, reduce="sum", out=None, accumulate=False):
    """Reference of `srh_scores`: [B, N_max] fp32 softmax mass per context position."""
    B, Hs, M, D = q.shape
    N = k_cache.shape[2]
    scale = 1.0 / math.sqrt(D)
    score = torch.zeros(B, N, dtype=torch.float32, device=q.device)
    for b in range(B):
        L = int(cache_lens[b])
        k = k_cache[b, kv_heads.long(), :L].float()  # [Hs, L, D]
        p = torch.softmax(torch.einsum("hmd,hnd->hmn", q[b].float(), k) * scale, dim=-1)
        score[b, :L] = p.sum(dim=(0, 1)) if reduce == "sum" else p.amax(dim=(0, 1))
    if not accumulate:
        return score
    return out.float() + score if reduce == "sum" else torch.maximum(out.float(), score)


def _top(scores: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The k candidate positions with the largest scores, ties to the lower index."""
    if k <= 0:
        return candidates[:0]
    order = torch.sort(scores[candidates], descending=True, stable=True).indices
    return candidates[order[:k]]


def select_indices_ref(primary, secondary, cache_lens, *, budget, sinks, window, m):
    """Reference of `select_indices`: [B, budget] int32, sorted ascending, -1 padded."""
    B = primary.shape[0]
    dev = primary.device
    free = budget - sinks - window
    out = torch.full((B, budget), -1, dtype=torch.int32, device=dev)
    for b in range(B):
        L = int(cache_lens[b])
        if L <= budget:
            out[b, :L] = torch.arange(L, dtype=torch.int32, device=dev)
            continue
        m_b = m if secondary is not None else free
        middle = torch.arange(sinks, L - window, device=dev)
        first = _top(primary[b].float(), middle, m_b)
        taken = torch.zeros(L, dtype=torch.bool, device=dev)
        taken[first] = True
        rest = middle[~taken[middle]]
        second = _top(secondary[b].float(), rest, free - m_b) if secondary is not None else rest[:0]
        chosen = torch.cat([torch.arange(sinks, device=dev), torch.arange(L - window, L, device=dev), first, second])
        out[b] = torch.sort(chosen).values.to(torch.int32)
    return out


def lookup_draft_ref(
    hist: torch.Tensor,  # [B, N] int32 tokens by position (-1: unknown), read and written
    end: torch.Tensor,  # [B]: the last known position
    ptr: torch.Tensor,  # [B] int64, read and written
    model: torch.Tensor,  # [B] int64: the draft model's tokens
    done: torch.Tensor,  # [B] bool
    counts: torch.Tensor,  # [B, 2] int64, added to
    max_ngram: int,
    min_ngram: int,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`lookup_draft` in torch ops (vectorised over the batch: the runtime's path off CUDA)."""
    h = hist.long()
    B, N = h.shape
    E = end.long().view(-1, 1)  # [B, 1]
    pos = torch.arange(N, device=h.device).view(1, -1)
    match = pos < E  # [B, N] candidate ends j < E
    best = torch.full((B,), -1, dtype=torch.long, device=h.device)
    for k in range(max_ngram):  # the k-th token back: hist[j - k] == hist[E - k]
        back = h if k == 0 else torch.nn.functional.pad(h, (k, 0), value=-1)[:, :N]
        want = torch.where(E - k >= 0, h.gather(1, (E - k).clamp_min(0)), -2)  # [B, 1]
        match = match & (back == want)
        if k + 1 >= min_ngram:  # a longer match overrides a shorter one
            last = torch.where(match, pos, -1).amax(1)  # [B] the most recent
            best = torch.where(last >= 0, last, best)
    new = torch.where(ptr >= 0, ptr + 1, torch.where(best >= 0, best + 1, -1))
    copy = h.gather(1, new.clamp_min(0).view(-1, 1)).view(-1)
    hit = (new >= 0) & (copy < vocab)
    tok = torch.where(hit, copy, model)
    ptr.copy_(torch.where(hit, new, -1))
    rows = (E.view(-1) + 1 < N).nonzero().view(-1)  # as the kernel: a history full to its end takes no write
    hist[rows, E.view(-1)[rows] + 1] = tok[rows].to(hist.dtype)
    live = ~done
    counts[:, 0] += (hit & live).long()
    counts[:, 1] += live.long()
    return tok, hit
