"""Exact mode with sampling: on a tiny-vocabulary model the first two tokens' joint distribution
under exact mode is the target's (a chi-square test), and plain sparse verification's is not (the
test can fail). Seeded draws; the target's distribution is computed directly (fp64)."""

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.exact import ExactConfig
from dustin_runtime.sampling import SamplingConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

V, PROMPT = 12, [(5 * i + 3) % 12 for i in range(24)]
SAMPLING = SamplingConfig(temperature=0.5)
BATCH, CALLS = 1000, 6  # 6000 draws of (x1, x2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_noisy_pair):
    return make_noisy_pair(tmp_path_factory.mktemp("xs") / "t", 5, 0.3, vocab_size=V)


def target_joint(target) -> torch.Tensor:
    """[V, V] the target's P(x1, x2) after the prompt at the test's temperature (fp64)."""
    from dustin_runtime.attention import TorchAttention

    ids = torch.tensor([PROMPT + [a] for a in range(V)])
    cache = target.allocate_cache(V, 64)
    logits = target(ids, cache, TorchAttention(), phase="prefill", kv_len=len(PROMPT) + 1).double()
    p = torch.softmax(logits / SAMPLING.temperature, -1)  # [V, T, V]
    return p[0, -2].view(V, 1) * p[:, -1]  # x1's row is the same for every sequence


def draws(pair, hooks_fn, exact: ExactConfig) -> torch.Tensor:
    counts = torch.zeros(V * V, dtype=torch.float64)
    for seed in range(CALLS):
        out = speculative_generate(*pair, [PROMPT] * BATCH, 2, gamma=3, sampling=SAMPLING, seed=seed,
                                   hooks=hooks_fn(), exact=exact)
        pairs = torch.tensor(out.tokens)
        counts += torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double()
    return counts


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probs (cells expecting < 5 pooled)."""
    n = counts.sum()
    exp = probs.flatten() * n
    small = exp < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([exp[~small], exp[small].sum().view(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def streaming(pair, budget=4):
    t, d = pair
    return lambda: make_policy("streamingllm", SparseConfig.all_heads(t.cfg, d.cfg, budget, sinks=1, window=2),
                               target=t, draft=d)


def test_exact_sampling_follows_the_target_and_plain_sparse_does_not(pair):
    joint = target_joint(pair[0])
    plain = draws(pair, streaming(pair), ExactConfig())
    assert p_value(plain, joint) < 1e-6
    for k in (1, 3):
        assert p_value(draws(pair, streaming(pair), ExactConfig(k)), joint) > 1e-3
    assert p_value(draws(pair, lambda: None, ExactConfig()), joint) > 1e-3  # the test's own check: full verification


def test_exact_sampling_refuses_sets_that_see_the_drafts(pair):
    t, d = pair
    cfg = SparseConfig.all_heads(t.cfg, d.cfg, 8, sinks=1, window=2)
    for name in ("dustin", "quest"):
        with pytest.raises(DustinError, match="before the step's drafts"):
            speculative_generate(t, d, [PROMPT], 4, sampling=SAMPLING, hooks=make_policy(name, cfg, target=t, draft=d),
                                 exact=ExactConfig(2))
