"""The recorder's ground truth against Hugging Face's eager attention probabilities (tiny models)."""

import pytest
import torch

from dustin_profile.groundtruth import record_window
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model

GAMMA = 3
M = GAMMA + 1


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_tiny_hf):
    root = tmp_path_factory.mktemp("gt")
    hf_t = make_tiny_hf("llama3", root / "t", seed=1)
    hf_d = make_tiny_hf("qwen3", root / "d", seed=2, num_hidden_layers=1)
    for hf in (hf_t, hf_d):
        hf.set_attn_implementation("eager")
    return (load_model(str(root / "t"))[0], hf_t), (load_model(str(root / "d"))[0], hf_d)


def hf_probs(hf, ids):
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).float()  # [layers, H, T, T]


def kv_sum(p, G):
    """[layers, H, rows, cols] -> [layers * G, cols]: sum over each KV head's query heads and the rows."""
    Ly, H = p.shape[:2]
    return p.view(Ly, G, H // G, *p.shape[2:]).sum(dim=(2, 3)).reshape(Ly * G, -1)


def renorm(p):
    return p / p.sum(-1, keepdim=True)


def context_share(rows, L):
    """[layers, H, M, cols] verification rows -> each query's attention on [0, L), renormalised."""
    return renorm(rows[..., :L])


def test_text_mode_matches_hf_attention(pair):
    (tgt, hf_t), (drf, hf_d) = pair
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 131, (60,), generator=g).tolist()
    positions = [50, 37]
    rec = record_window(tgt, drf, tokens, positions, gamma=GAMMA, quest_budgets=(16, 32, 64),
                        verify_tokens="text", prefill_chunk=16)
    pt, pd = hf_probs(hf_t, tokens[:50 + M]), hf_probs(hf_d, tokens[:50 + M])
    Gt, Gd = tgt.cfg.num_kv_heads, drf.cfg.num_kv_heads
    for i, L in enumerate(positions):
        assert int(rec["lengths"][i]) == L
        rows = pt[:, :, L: L + M]  # verification queries
        share = context_share(rows, L)  # the new tokens' mass is left out of ARR
        assert rows[..., L:L + M].sum(-1).mean() > 0.01  # ... and there is some to leave out
        torch.testing.assert_close(rec["attn"][i, :L], share.mean(dim=(0, 1, 2)), atol=2e-5, rtol=1e-4)
        assert rec["attn"][i, L:].abs().sum() == 0
        torch.testing.assert_close(rec["attn"][i].sum(), torch.tensor(1.0), atol=1e-5, rtol=0)
        torch.testing.assert_close(rec["layer_attn"][i, :, :L].float(), share.mean(dim=(1, 2)), atol=1e-3, rtol=1e-2)
        hist = renorm(pt[:, :, L - M: L, : L - M])  # previous pass: queries [L-M, L) over [0, L-M)
        torch.testing.assert_close(rec["target"][:, i, : L - M], kv_sum(hist, Gt), atol=1e-4, rtol=1e-4)
        assert rec["target"][:, i, L - M:].abs().sum() == 0
        look = renorm(pd[:, :, L: L + GAMMA, :L])  # draft's queries at the positions it is fed (cur, d_1..)
        torch.testing.assert_close(rec["draft"][:, i, :L], kv_sum(look, Gd), atol=1e-4, rtol=1e-4)
        q = rec["quest"][i]  # [layers, budgets]
        assert (q[:, 1:] >= q[:, :-1] - 1e-6).all() and (q <= 1 + 1e-5).all()
        torch.testing.assert_close(q[:, -1], torch.ones(q.shape[0]), atol=1e-5, rtol=0)  # 64 >= L: all pages


def test_draft_mode_verifies_the_drafts_greedy_tokens(pair):
    (tgt, hf_t), (drf, _) = pair
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 131, (50,), generator=g).tolist()
    L = 40
    rec = record_window(tgt, drf, tokens, [L, 30], gamma=GAMMA, verify_tokens="draft")
    want = generate(drf, [tokens[: L + 1]], GAMMA).tokens[0]
    assert rec["drafted"][0].tolist() == want
    pt = hf_probs(hf_t, tokens[: L + 1] + want)
    torch.testing.assert_close(rec["attn"][0, :L], context_share(pt[:, :, L: L + M], L).mean(dim=(0, 1, 2)), atol=2e-5,
                               rtol=1e-4)
    greedy = generate(tgt, [tokens[: L + 1]], GAMMA).tokens[0]
    agree = 0
    for a, b in zip(want, greedy, strict=True):
        if a != b:
            break
        agree += 1
    assert int(rec["accepted"][0]) == agree


def test_kv_head_signals_triton_matches_reference():
    """The CUDA path's Triton srh_scores (here in the interpreter) on a batch-broadcast cache."""
    from dustin_profile.candidates import kv_head_signals

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 6, 5, 16, generator=g)  # 3 passes, 6 heads (GQA 3), M 5
    k = torch.randn(1, 2, 37, 16, generator=g)
    lens = torch.tensor([37, 20, 9], dtype=torch.int32)
    ref = kv_head_signals(q, k, lens, triton=False)
    tri = kv_head_signals(q, k, lens, triton=True)
    torch.testing.assert_close(tri, ref, atol=1e-5, rtol=1e-4)
    assert ref.shape == (2, 3, 37) and ref[:, 1, 20:].abs().sum() == 0
    torch.testing.assert_close(ref.sum(-1), torch.full((2, 3), 15.0), atol=1e-4, rtol=0)  # 3 heads x 5 queries


def test_sparse_drafting_mode(pair):
    """With draft_set the draft drafts over a verification set: a set covering the context gives the
    full-attention recording; a binding one drafts from fewer rows (and may draft other tokens)."""
    (tgt, _), (drf, _) = pair
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 131, (70,), generator=g).tolist()
    plain = record_window(tgt, drf, tokens, [60, 45], gamma=GAMMA)
    covering = record_window(tgt, drf, tokens, [60, 45], gamma=GAMMA, draft_set=(64, 2, 4))
    assert torch.equal(plain["drafted"], covering["drafted"])
    torch.testing.assert_close(plain["draft"], covering["draft"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(plain["attn"], covering["attn"])
    tight = record_window(tgt, drf, tokens, [60, 45], gamma=GAMMA, draft_set=(12, 2, 4))
    assert tight["drafted"].shape == plain["drafted"].shape
    assert not torch.allclose(tight["draft"], plain["draft"], atol=1e-3)  # other drafts or other queries
