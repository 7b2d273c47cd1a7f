"""Exact mode (greedy): the output equals vanilla greedy decoding token for token, whatever the
sparse verification does (budgets from tiny to above the context, ragged batches, EOS and length
limits inside a block, the context lookup, sparse drafting), and its statistics add up."""

from dataclasses import replace

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.exact import DEFAULT_K, K_MAX, ExactConfig, split_exact
from dustin_runtime.generate import generate
from dustin_runtime.lookup import LookupConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

PROMPTS = [[(7 * i + 3) % 131 for i in range(41)], [(5 * i + 1) % 131 for i in range(23)],
           [(11 * i + 2) % 131 for i in range(58)]]
MAX_NEW = [21, 30, 13]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_noisy_pair):
    """A tiny target and a noisy copy as its draft (they agree often but not always)."""
    return make_noisy_pair(tmp_path_factory.mktemp("exact") / "t", 11, 0.2)


def policy(pair, name, budget, draft_kv="full"):
    t, d = pair
    cfg = replace(SparseConfig.all_heads(t.cfg, d.cfg, budget, sinks=1, window=2), draft_kv=draft_kv)
    return make_policy(name, cfg, target=t, draft=d)


def exact(pair, hooks, k, prompts=PROMPTS, max_new=MAX_NEW, gamma=3, **kw):
    return speculative_generate(*pair, prompts, max_new, gamma=gamma, hooks=hooks, exact=ExactConfig(k), **kw)


@pytest.mark.parametrize("name,budget", [("dustin", 8), ("dustin", 16), ("streamingllm", 8), ("quest", 16),
                                         ("dustin", 256)])
@pytest.mark.parametrize("k", [1, 3, K_MAX])
def test_exact_output_is_vanilla_greedy(pair, name, budget, k):
    ar = generate(pair[0], PROMPTS, MAX_NEW)
    out = exact(pair, policy(pair, name, budget), k)
    assert out.tokens == ar.tokens and out.finish_reasons == ar.finish_reasons
    x = out.stats.extra
    assert x["exact_k"] == k and x["confirm_passes"] >= -(-out.stats.steps // k)
    assert 0 <= x["agreement"] <= 1 and x["checked_tokens"] == x["checked_draft"] + x["checked_correction"]
    if budget == 256:  # the set covers the context: sparse is full verification, every token is confirmed
        assert x["agreement"] == 1 and x["confirmed_share"] == 1


def test_a_tiny_budget_disagrees_and_is_corrected(pair):
    """The test can fail: plain sparse verification at S = 4 departs from greedy; exact mode does not."""
    ar = generate(pair[0], PROMPTS, MAX_NEW)
    plain = speculative_generate(*pair, PROMPTS, MAX_NEW, gamma=3, hooks=policy(pair, "streamingllm", 4))
    assert plain.tokens != ar.tokens
    out = exact(pair, policy(pair, "streamingllm", 4), 2)
    assert out.tokens == ar.tokens
    assert out.stats.extra["agreement"] < 1 and out.stats.extra["confirmed_share"] < 1


def test_eos_and_length_limits_inside_a_block(pair):
    ar = generate(pair[0], PROMPTS, MAX_NEW)
    eos = ar.tokens[1][6]  # a token sequence 1 emits as its 7th
    ref = generate(pair[0], PROMPTS, [21, 30, 2], eos_ids=(eos,), min_new_tokens=2)
    for k in (2, 5):
        out = exact(pair, policy(pair, "dustin", 8), k, max_new=[21, 30, 2], eos_ids=(eos,), min_new_tokens=2)
        assert out.tokens == ref.tokens and out.finish_reasons == ref.finish_reasons
    assert "eos" in ref.finish_reasons


def test_with_the_lookup_and_sparse_drafting(pair):
    ar = generate(pair[0], PROMPTS, MAX_NEW)
    look = exact(pair, policy(pair, "dustin", 8), 3, lookup=LookupConfig(3, 1))
    assert look.tokens == ar.tokens and look.stats.extra["lookup_drafts"] > 0
    vs = exact(pair, policy(pair, "dustin", 8, draft_kv="verify-set"), 3)
    assert vs.tokens == ar.tokens


def test_full_verification_in_exact_mode_agrees_on_every_token(pair):
    out = exact(pair, None, 4)
    assert out.tokens == generate(pair[0], PROMPTS, MAX_NEW).tokens
    assert out.stats.extra["agreement"] == 1 and out.stats.extra["provisional_tokens"] >= sum(MAX_NEW)


def test_one_sequence_and_a_one_token_prompt(pair):
    prompts = [[17], [3, 9, 4]]
    ar = generate(pair[0], prompts, [9, 11])
    assert exact(pair, policy(pair, "streamingllm", 4), 3, prompts=prompts, max_new=[9, 11]).tokens == ar.tokens


def test_replayed_agreement_sets_what_each_pass_confirms(pair):
    """bench e2e's replay: a pass confirms min(forced, provisional) tokens and then takes the full
    argmax (forced 1 under full verification: at most 2 tokens a pass, still the greedy output)."""
    out = exact(pair, None, 2, exact_replay=torch.ones(1, 3, dtype=torch.long))
    assert out.tokens == generate(pair[0], PROMPTS, MAX_NEW).tokens
    x = out.stats.extra
    assert x["confirm_passes"] >= max(MAX_NEW) // 2 and x["confirmed_share"] < 1


def test_k_zero_is_off_and_bad_configs_are_refused(pair):
    plain = speculative_generate(*pair, PROMPTS, MAX_NEW, gamma=3, hooks=policy(pair, "dustin", 8))
    off = exact(pair, policy(pair, "dustin", 8), 0)
    assert off.tokens == plain.tokens and "exact_k" not in off.stats.extra
    for bad in (-1, K_MAX + 1, 2.5):
        with pytest.raises(DustinError, match="--exact"):
            ExactConfig(bad)


def test_policy_names_carry_k():
    assert split_exact("dustin-vs-x") == ("dustin-vs", ExactConfig(DEFAULT_K))
    assert split_exact("dustin-vs-x3") == ("dustin-vs", ExactConfig(3))
    assert split_exact("quest-x1") == ("quest", ExactConfig(1))
    assert split_exact("dustin-vs") == ("dustin-vs", ExactConfig()) and split_exact("-x") == ("-x", ExactConfig())
    for bad in ("dustin-x0", f"dustin-x{K_MAX + 1}"):
        with pytest.raises(DustinError, match=f"1 ... {K_MAX}"):
            split_exact(bad)


@pytest.mark.slow
@pytest.mark.parametrize("budget,draft_kv", [(80, "full"), (80, "verify-set"), (1024, "full")])
def test_embedded_pair_exact_output_is_greedy(smollm2, shared_dir, budget, draft_kv):
    """SmolLM2-135M with the committed draft and profile: the greedy output, from a budget where
    sparse verification departs to one above the context."""
    import os

    from dustin_profile.artifact import load_profile
    from dustin_runtime.loader import load_model
    from dustin_runtime.tokenizer import load_tokenizer

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isdir(os.path.join(root, "models", "smollm2-draft")):
        pytest.skip("the committed draft models/smollm2-draft is absent")
    target, ckpt = smollm2
    draft, _ = load_model(os.path.join(root, "models", "smollm2-draft"))
    text = (shared_dir / "corpus/gutenberg/eval/stoker-bram--dracula.txt").read_text()
    ids = load_tokenizer(ckpt).encode(text[:20000], add_special_tokens=False)
    prompts, max_new = [ids[1000:1600], ids[3000:3450]], [40, 33]
    cfg = load_profile(os.path.join(root, "profiles", "smollm2-draft.json")).to_sparse_config(budget, draft_kv=draft_kv)
    hooks = make_policy("dustin", cfg, target=target, draft=draft)
    out = speculative_generate(target, draft, prompts, max_new, gamma=4, hooks=hooks, exact=ExactConfig(3))
    assert out.tokens == generate(target, prompts, max_new).tokens
    assert out.stats.extra["confirm_passes"] > 0
