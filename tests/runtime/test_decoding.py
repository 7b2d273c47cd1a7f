"""Autoregressive and speculative decoding: greedy equivalence, exact rejection sampling, EOS and
length limits per sequence."""

import math

import pytest
import torch

from dustin_runtime.attention import TorchAttention
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model
from dustin_runtime.sampling import SamplingConfig, speculative_accept
from dustin_runtime.speculative import speculative_generate


@pytest.fixture
def pair(perturbed_pair):
    """A target and a draft sharing the vocabulary; the draft is the target with noisy weights, so
    it agrees often but not always."""
    return perturbed_pair("llama3", 11, 0.6)


PROMPTS = [[5, 9, 17, 3], [44, 2, 8, 90, 13, 7, 7, 21, 60, 1, 33], [100]]


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculative_equals_greedy_autoregressive(pair, gamma):
    target, draft = pair
    ar = generate(target, PROMPTS, [20, 31, 25])
    sd = speculative_generate(target, draft, PROMPTS, [20, 31, 25], gamma=gamma)
    assert sd.tokens == ar.tokens
    assert [len(t) for t in sd.tokens] == [20, 31, 25]
    acc = [a for row in sd.stats.accepted for a in row if a >= 0]
    assert min(acc) == 0 and max(acc) >= 1  # the draft is rejected sometimes and accepted sometimes
    assert sd.stats.steps < 31  # speculation saved target passes


def test_eos_and_max_new_per_sequence(pair):
    target, draft = pair
    ar = generate(target, PROMPTS, 12)
    eos = ar.tokens[1][4]  # a token the target emits as 5th token of sequence 1
    ar_eos = generate(target, PROMPTS, [12, 12, 3], eos_ids=(eos,))
    sd_eos = speculative_generate(target, draft, PROMPTS, [12, 12, 3], gamma=4, eos_ids=(eos,))
    assert sd_eos.tokens == ar_eos.tokens
    first = ar.tokens[1].index(eos)
    assert ar_eos.tokens[1] == ar.tokens[1][: first + 1] and ar_eos.finish_reasons[1] == "eos"
    assert len(ar_eos.tokens[2]) == 3 or ar_eos.finish_reasons[2] == "eos"


def test_batch_results_equal_single_sequence_results(pair):
    target, draft = pair
    batched = speculative_generate(target, draft, PROMPTS, 15, gamma=3)
    for b, p in enumerate(PROMPTS):
        alone = speculative_generate(target, draft, [p], 15, gamma=3)
        assert alone.tokens[0] == batched.tokens[b]


def _chi2_ok(counts: torch.Tensor, probs: torch.Tensor, n: int) -> tuple[float, float]:
    """Chi-square statistic (cells with expectation < 5 pooled) and its 1e-4 critical value
    (Wilson-Hilferty)."""
    exp = probs * n
    small = exp < 5
    obs = torch.cat([counts[~small].double(), counts[small].sum().view(1).double()])
    ex = torch.cat([exp[~small], exp[small].sum().view(1)])
    keep = ex > 0
    stat = (((obs - ex) ** 2)[keep] / ex[keep]).sum().item()
    df = int(keep.sum()) - 1
    z = 3.719  # one-sided 1e-4
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def test_rejection_sampling_first_token_distribution():
    """speculative_accept's first emitted token is distributed as p, whatever q is."""
    g = torch.Generator().manual_seed(0)
    V, K, N = 12, 3, 200_000
    p_logits = torch.randn(1, K + 1, V, generator=g) * 1.5
    q = torch.softmax(torch.randn(1, K, V, generator=g) * 1.5, -1)
    drafts = torch.multinomial(q[0].repeat(N, 1), 1, generator=g).view(N, K)  # d_i ~ q_i
    # the draft distribution does not depend on earlier drafts here, which is a valid special case
    n, nxt = speculative_accept(drafts, q.expand(N, K, V), p_logits.expand(N, K + 1, V),
                                SamplingConfig(temperature=1.0), g)
    first = torch.where(n > 0, drafts[:, 0], nxt)
    counts = torch.bincount(first, minlength=V)
    stat, crit = _chi2_ok(counts, torch.softmax(p_logits[0, 0].double(), -1), N)
    assert stat < crit, (stat, crit)
    # the first draft is accepted with probability sum_x min(p(x), q(x)) (Leviathan et al., eq. 1)
    overlap = torch.minimum(torch.softmax(p_logits[0, 0], -1), q[0, 0]).sum().item()
    assert abs((n > 0).float().mean().item() - overlap) < 0.01


@pytest.mark.parametrize("sampling,subset,lookup", [(SamplingConfig(1.0), None, False),
                                                    (SamplingConfig(0.8, top_p=0.9), None, False),
                                                    (SamplingConfig(1.0), (0, 2, 3, 7), False),
                                                    (SamplingConfig(1.0), None, True)])
def test_speculative_sampling_matches_target_joint_distribution(tiny_hf, sampling, subset, lookup):
    """End to end: the joint law of two sampled tokens equals the target's, computed exactly; also
    with the draft's head over a vocabulary subset (--draft-vocab: 5 of the 9 tokens get draft
    probability zero) and with drafts copied from the prompt (--draft-lookup: one-hot proposals)."""
    from dustin_runtime.lookup import LookupConfig

    tfolder, _ = tiny_hf("qwen3", seed=21, vocab_size=9)
    dfolder, _ = tiny_hf("qwen3", seed=22, vocab_size=9)
    target, _ = load_model(str(tfolder))
    draft, _ = load_model(str(dfolder))
    if subset is not None:
        draft.restrict_head(torch.tensor(subset))
    prompt, N, V = [3, 1, 4, 1, 5] + ([3, 1] if lookup else []), 6000, 9  # "3 1" recurs: the lookup copies 4, 1
    out = speculative_generate(target, draft, [prompt] * N, 2, gamma=2, sampling=sampling, seed=5,
                               lookup=LookupConfig(4, 1) if lookup else None)
    pairs = torch.tensor([t[0] * V + t[1] for t in out.tokens])
    counts = torch.bincount(pairs, minlength=V * V)
    from dustin_runtime.sampling import probs_from_logits

    with torch.no_grad():
        lg = target(torch.tensor([prompt]), target.allocate_cache(1, 8), TorchAttention(), phase="prefill")
        p1 = probs_from_logits(lg[0, -1], sampling).double()  # [V]
        seqs = torch.tensor([prompt + [t] for t in range(V)])
        lg2 = target(seqs, target.allocate_cache(V, 8), TorchAttention(), phase="prefill")
        p2 = probs_from_logits(lg2[:, -1], sampling).double()  # [V, V]
    joint = (p1.view(V, 1) * p2).flatten()
    stat, crit = _chi2_ok(counts, joint, N)
    assert stat < crit, (stat, crit)
    acc = [a for row in out.stats.accepted for a in row if a >= 0]
    assert 0 < sum(acc) < 2 * len(acc)  # some drafts accepted, some rejected
    if subset is not None:  # tokens outside the subset do come out (the target's residual)
        assert {t[0] for t in out.tokens} - set(subset)
    if lookup:  # the first draft of every step is a copy
        assert out.stats.extra["lookup_share"] >= 0.5


def test_stats_are_consistent(pair):
    target, draft = pair
    out = speculative_generate(target, draft, PROMPTS, [9, 13, 4], gamma=3)
    s = out.stats.to_dict()
    assert s["new_tokens"] == [9, 13, 4]
    assert s["mode"] == "speculative" and s["gamma"] == 3
    assert all(k in s["seconds"] for k in ("prefill", "draft", "verify", "other", "total"))
    assert 0 <= s["mean_accepted"] <= 3 and s["tokens_per_s"] > 0
    # every live (sequence, step) pair emitted accepted + 1 tokens; the sum covers what was produced
    for b, want in enumerate([9, 13, 4]):
        emitted = sum(row[b] + 1 for row in out.stats.accepted if row[b] >= 0)
        assert emitted == want  # accepted counts stop at the length limit


def test_min_new_tokens_forbids_early_stop(pair):
    target, draft = pair
    free = generate(target, PROMPTS, 8)
    stop = free.tokens[0][0]  # the first token the target would emit for prompt 0
    ar = generate(target, PROMPTS, 8, eos_ids=(stop,), min_new_tokens=3)
    sd = speculative_generate(target, draft, PROMPTS, 8, gamma=3, eos_ids=(stop,), min_new_tokens=3)
    assert sd.tokens == ar.tokens
    assert ar.tokens[0][0] != stop and len(ar.tokens[0]) >= 3
    assert all(t != stop for seq in ar.tokens for t in seq[:3])
    unforced = generate(target, PROMPTS, 8, eos_ids=(stop,))
    assert unforced.tokens[0] == [stop] and unforced.finish_reasons[0] == "eos"


def test_teacher_forced_full_equals_one_forward(pair):
    from dustin_runtime.sparse.teacher_forced import teacher_forced_nll

    target, draft = pair
    g = torch.Generator().manual_seed(60)
    seqs = torch.randint(0, 131, (2, 44), generator=g)
    res, again = teacher_forced_nll(target, draft, seqs.tolist(), context=17, gamma=4, hooks=[None, None])
    assert res.nll == again.nll  # the shared prefill is copied, not consumed
    logits = target(seqs, target.allocate_cache(2, 44), TorchAttention(), phase="prefill")
    lp = torch.log_softmax(logits[:, 16:41], -1).gather(-1, seqs[:, 17:42].unsqueeze(-1)).squeeze(-1)
    assert res.tokens == [25, 25] and res.windows == 5  # 27 tokens after the context: 5 whole windows
    for b in range(2):
        assert abs(res.nll[b] + lp[b].sum().item()) < 1e-3
        by_offset = -lp[b].view(5, 5).sum(0)  # [windows, offset] -> per offset of the 5 window queries
        assert torch.allclose(torch.tensor(res.nll_by_offset[b], dtype=torch.float32), by_offset, atol=1e-3)


@pytest.mark.parametrize("gamma", [1, 4])
def test_draft_cache_catches_up_on_the_unfed_last_draft(tiny_hf, gamma):
    """The loop never feeds d_gamma to the draft; when every draft is accepted the next step's first
    forward writes it ([prev, cur] from L - 1). With the draft = the target every draft is accepted,
    so the draft's cache must hold, row for row, the target's K/V of every committed token but the
    last step's d_gamma (a one-token prompt included: its first forward is [cur, cur] from 0)."""
    from dustin_runtime.engine import Engine

    folder, _ = tiny_hf("llama3", seed=11)
    model, _ = load_model(str(folder))
    prompts, new = [[5, 9, 17, 3], [100], [44, 2, 8, 90, 13]], [13, 17, 11]
    eng = Engine(model, model)
    res = speculative_generate(model, model, prompts, new, gamma=gamma, engine=eng)
    assert res.tokens == generate(model, prompts, new).tokens
    for b in range(len(prompts)):  # every step accepts every draft but a row's last (cut at its length)
        steps = [row[b] for row in res.stats.accepted if row[b] >= 0]
        assert len(steps) > 1 and all(a == gamma for a in steps[:-1]), steps
    tc, dc = eng.tcache, eng.dcache
    for b, p in enumerate(prompts):
        n = int(tc.lengths[b])  # committed rows
        assert int(dc.lengths[b]) == n and n >= len(p) + len(res.tokens[b]) - 1
        for layer in range(len(tc.k)):
            for mine, theirs in ((dc.k[layer], tc.k[layer]), (dc.v[layer], tc.v[layer])):
                torch.testing.assert_close(mine[b, :, : n - 1], theirs[b, :, : n - 1], atol=1e-5, rtol=1e-4)
