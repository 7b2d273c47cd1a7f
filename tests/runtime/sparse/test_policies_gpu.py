"""Sparse verification on a CUDA GPU: the Triton path (sparse_verify_attention, srh_scores,
select_indices) against the CPU reference path of the same policies."""

import pytest
import torch

from dustin_runtime.loader import load_model
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.sparse.teacher_forced import teacher_forced_nll
from dustin_runtime.speculative import speculative_generate

pytestmark = pytest.mark.gpu

SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def pair(tiny_hf, device):
    tf, _ = tiny_hf("qwen3", seed=81, **SHAPE)
    df, _ = tiny_hf("qwen3", seed=82, num_hidden_layers=1, **SHAPE)
    t, _ = load_model(str(tf), dtype=torch.float32, device=device)
    d, _ = load_model(str(df), dtype=torch.float32, device=device)
    if device == "cuda":
        t.use_kernels(), d.use_kernels()
    return t, d


@pytest.mark.parametrize("policy", ["dustin", "quest", "streamingllm", "oracle", "dustin-r"])
def test_gpu_policy_nll_matches_cpu(tiny_hf, policy):
    """dustin-r: dustin with refresh layer 1."""
    from dataclasses import replace

    seqs = torch.randint(0, 131, (2, 400), generator=torch.Generator().manual_seed(83)).tolist()
    nll = {}
    refresh = policy.endswith("-r")
    policy = policy.removesuffix("-r")
    for dev in ("cpu", "cuda"):
        t, d = pair(tiny_hf, dev)
        cfg = SparseConfig.all_heads(t.cfg, d.cfg, 96, sinks=4, window=16)
        if refresh:
            cfg = replace(cfg, refresh_layers=(1,))
        full, sparse = teacher_forced_nll(t, d, seqs, 300, gamma=4, hooks=[
            make_policy("full", None, target=t, draft=d), make_policy(policy, cfg, target=t, draft=d)])
        nll[dev] = (full.nll, sparse.nll)
    for a, b in zip(nll["cpu"], nll["cuda"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=2e-3)
    assert nll["cuda"][0] != nll["cuda"][1]  # the set really is sparse


def test_gpu_dustin_with_budget_over_context_equals_full(tiny_hf):
    t, d = pair(tiny_hf, "cuda")
    prompts = [list(range(1, 120)), list(range(5, 40)), [7] * 77]
    cfg = SparseConfig.all_heads(t.cfg, d.cfg, 512, sinks=4, window=16)
    full = speculative_generate(t, d, prompts, 20, gamma=4)
    sparse = speculative_generate(t, d, prompts, 20, gamma=4, hooks=make_policy("dustin", cfg, target=t, draft=d))
    assert sparse.tokens == full.tokens


def test_gpu_sparse_drafting_with_rope_inside_the_attention_equals_separate(tiny_hf, monkeypatch):
    """Sparse drafting on CUDA runs RoPE, the cache write and the attention over the draft set as one
    kernel; with the model's separate RoPE kernel instead (the backend declining) the tokens, the
    accepted counts, the draft's cache and the lookahead signal are the same (fp32)."""
    from dustin_runtime.ops import kernels
    from dustin_runtime.sparse import policies

    tf, _ = tiny_hf("qwen2", seed=84, **SHAPE)  # no q / k norm: the fused path applies
    df, _ = tiny_hf("qwen2", seed=85, num_hidden_layers=1, **SHAPE)
    t, d = (load_model(str(f), dtype=torch.float32, device="cuda")[0].use_kernels() for f in (tf, df))
    V = t.cfg.vocab_size
    prompts = [[i % V for i in range(1, 300)], [i * 7 % V for i in range(140)], [7] * 211]
    cfg = SparseConfig(budget=48, sinks=4, window=16, m=12, draft_heads=((0, 1, (2, 3)),),
                       target_heads=((0, 0, (0, 1)), (1, 1, (2, 3))), draft_kv="verify-set")
    calls = []
    fused = kernels.sparse_verify_attention_rope
    monkeypatch.setattr(kernels, "sparse_verify_attention_rope", lambda *a, **k: calls.append(1) or fused(*a, **k))
    runs = []
    for on in (True, False):
        if not on:
            monkeypatch.setattr(policies._DraftBackend, "attend_qkv", lambda self, *a: None)
        h = make_policy("dustin", cfg, target=t, draft=d)
        res = speculative_generate(t, d, prompts, 30, gamma=4, hooks=h, cuda_graphs=False)
        runs.append((res, h, [k.clone() for k in h.dcache.k], len(calls)))
    (a, ha, ka, n_on), (b, hb, kb, n_off) = runs
    assert n_on > 0 and n_off == n_on  # the fused kernel ran in the first run only
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted
    for x, y in zip(ka, kb, strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-5)
    assert torch.allclose(ha.draft_score, hb.draft_score, rtol=1e-4, atol=1e-7)
