"""Exact mode on CUDA: the confirmation pass as a CUDA graph (with the step's phase graphs) gives
what the eager loop gives, and both are greedy decoding's output."""

import pytest
import torch

from dustin_runtime.exact import ExactConfig
from dustin_runtime.generate import generate
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

pytestmark = pytest.mark.gpu

PROMPTS = [[(7 * i + 3) % 131 for i in range(300)], [(5 * i + 1) % 131 for i in range(170)],
           [(11 * i + 2) % 131 for i in range(233)]]
MAX_NEW = [40, 57, 23]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_noisy_pair):
    return make_noisy_pair(tmp_path_factory.mktemp("exact-gpu") / "t", 11, 0.2, device="cuda")


@pytest.mark.parametrize("name,draft_kv", [("dustin", "full"), ("dustin", "verify-set"), ("streamingllm", "full"),
                                           ("quest", "full")])
def test_confirmation_graph_equals_eager_and_greedy(pair, name, draft_kv):
    t, d = pair
    cfg = SparseConfig.all_heads(t.cfg, d.cfg, 32, sinks=2, window=4)
    if draft_kv != "full":
        from dataclasses import replace

        cfg = replace(cfg, draft_kv=draft_kv)
    runs = {}
    for graphs in (False, True, True):  # the second graph run replays the captured graphs
        hooks = make_policy(name, cfg, target=t, draft=d)
        runs.setdefault(graphs, []).append(speculative_generate(t, d, PROMPTS, MAX_NEW, gamma=3, hooks=hooks,
                                                                exact=ExactConfig(3), cuda_graphs=graphs))
    eager, (first, again) = runs[False][0], runs[True]
    assert first.stats.cuda_graphs and first.tokens == eager.tokens == again.tokens
    assert first.stats.extra["agreement"] == eager.stats.extra["agreement"]
    assert eager.tokens == generate(t, PROMPTS, MAX_NEW, cuda_graphs=False).tokens


@pytest.mark.parametrize("name", ["dustin", "dustin-vs", "quest"])
def test_bf16_kernels_graph_equals_eager(tiny_hf, name):
    """The production path (bf16, the fused kernels): graphs and eager agree on tokens and on every
    pass's agreement, over two calls (the second replays the captured confirmation graph)."""
    from dustin_runtime.loader import load_model

    shape = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    tf, _ = tiny_hf("qwen3", seed=91, **shape)
    df, _ = tiny_hf("qwen3", seed=92, num_hidden_layers=1, **shape)
    t = load_model(str(tf), dtype=torch.bfloat16, device="cuda")[0].use_kernels()
    d = load_model(str(df), dtype=torch.bfloat16, device="cuda")[0].use_kernels()
    cfg = SparseConfig(budget=64, sinks=4, window=16, m=16, draft_heads=((0, 1, (2, 3)),),
                       target_heads=((0, 0, (0, 1)), (1, 1, (2, 3))),
                       draft_kv="verify-set" if name.endswith("-vs") else "full")
    base = name.removesuffix("-vs")
    for call in range(2):
        ps = [p[call:] for p in PROMPTS]
        runs = [speculative_generate(t, d, ps, MAX_NEW, gamma=4, hooks=make_policy(base + "-x", cfg, target=t, draft=d),
                                     cuda_graphs=graphs) for graphs in (False, True)]
        eager, graph = runs
        assert graph.stats.cuda_graphs and graph.tokens == eager.tokens
        for k in ("agreement", "confirm_passes", "checked_tokens", "exact_k"):
            assert graph.stats.extra[k] == eager.stats.extra[k]
