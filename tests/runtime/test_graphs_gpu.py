"""The decoding loop's CUDA graphs: greedy (and seeded sampled) outputs of the graph path equal the
eager path token for token, for every policy (dustin with refresh layers too), ragged prompts, batch
1 and 16, sequences finishing early; graphs are captured once per configuration and replayed by
later calls."""

import pytest
import torch

from dustin_runtime.engine import default_engine
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model
from dustin_runtime.sampling import SamplingConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import AcceptReplay, speculative_generate

pytestmark = pytest.mark.gpu

SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


@pytest.fixture
def pair(tiny_hf):
    tf, _ = tiny_hf("qwen3", seed=91, **SHAPE)
    df, _ = tiny_hf("qwen3", seed=92, num_hidden_layers=1, **SHAPE)
    t, _ = load_model(str(tf), dtype=torch.bfloat16, device="cuda")
    d, _ = load_model(str(df), dtype=torch.bfloat16, device="cuda")
    return t.use_kernels(), d.use_kernels()


def prompts(batch, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 450, (batch,), generator=g).tolist()
    return [torch.randint(0, 131, (n,), generator=g).tolist() for n in lens]


def hooks(name, t, d, budget=64):
    """The policy of a test name; -vs drafts over the verification set, -r refreshes the set at layer 1."""
    if name == "none":
        return None
    refresh = (1,) if name.endswith("-r") else ()
    name = name.removesuffix("-r")
    cfg = SparseConfig(budget=budget, sinks=4, window=16, m=16, draft_heads=((0, 1, (2, 3)),),
                       target_heads=((0, 0, (0, 1)), (1, 1, (2, 3))),
                       draft_kv="verify-set" if name.endswith("-vs") else "full", refresh_layers=refresh)
    name = name.removesuffix("-vs")
    return make_policy(name, None if name == "full" else cfg, target=t, draft=d)


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("policy", ["none", "full", "dustin", "streamingllm", "quest", "dustin-vs", "dustin-r",
                                    "dustin-vs-r"])
def test_graph_path_equals_eager_path(pair, policy, batch):
    t, d = pair
    for call in range(2):  # the second call replays the graphs the first captured
        ps = prompts(batch, seed=batch * 10 + call)
        max_new = [24 if b % 3 else 7 for b in range(batch)]  # some finish early
        eager = speculative_generate(t, d, ps, max_new, gamma=4, hooks=hooks(policy, t, d), cuda_graphs=False)
        graph = speculative_generate(t, d, ps, max_new, gamma=4, hooks=hooks(policy, t, d))
        assert graph.stats.cuda_graphs and not eager.stats.cuda_graphs
        assert graph.tokens == eager.tokens and graph.stats.accepted == eager.stats.accepted
    st = default_engine(t, d).last
    assert st.calls >= 2 and st.graphs.captured


def test_sampled_graph_path_equals_eager_and_eos_finishes_early(pair):
    t, d = pair
    ps = prompts(6, seed=3)
    s = SamplingConfig(temperature=0.8, top_p=0.9)
    eager = speculative_generate(t, d, ps, 20, gamma=3, sampling=s, seed=7, cuda_graphs=False)
    graph = speculative_generate(t, d, ps, 20, gamma=3, sampling=s, seed=7)
    assert graph.tokens == eager.tokens
    eos = eager.tokens[2][3]
    a = speculative_generate(t, d, ps, 20, gamma=3, eos_ids=(eos,), cuda_graphs=False)
    b = speculative_generate(t, d, ps, 20, gamma=3, eos_ids=(eos,))
    assert a.tokens == b.tokens and a.finish_reasons == b.finish_reasons


def test_autoregressive_graph_path_equals_eager(pair):
    t, _ = pair
    for call in range(2):
        ps = prompts(5, seed=40 + call)
        assert generate(t, ps, 17).tokens == generate(t, ps, 17, cuda_graphs=False).tokens
        s = SamplingConfig(temperature=1.0)
        assert generate(t, ps, 9, sampling=s, seed=2).tokens == generate(t, ps, 9, sampling=s, seed=2,
                                                                          cuda_graphs=False).tokens


def test_replayed_acceptance_in_graphs(pair):
    t, d = pair
    ps = prompts(4, seed=9)
    counts = torch.randint(0, 5, (40, 4), generator=torch.Generator().manual_seed(1))
    a = speculative_generate(t, d, ps, 30, gamma=4, replay=AcceptReplay(counts), cuda_graphs=False)
    b = speculative_generate(t, d, ps, 30, gamma=4, replay=AcceptReplay(counts))
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


def test_bench_e2e_small_shape(tmp_path):
    from dustin_eval.bench_e2e import E2EConfig, run_e2e, write_result

    cfg = E2EConfig(target="qwen2.5-0.5b", draft="qwen2.5-0.5b", batch=4, context=2048, new_tokens=24, budget=256,
                    m=64, alphas=(0.6, 0.9), phase_reps=5, policies=("ar", "full", "dustin", "streamingllm", "quest",
                                                                      "dustin-vs"))
    res = run_e2e(cfg, "pytest")
    path = write_result(res, tmp_path)
    assert path.is_file() and path.with_name(path.stem + "-alpha.png").is_file()
    by = {r["policy"]: r for r in res["records"]}
    assert set(by) == {"ar", "full", "dustin", "streamingllm", "quest", "dustin-vs"}
    for r in res["records"]:
        assert r["cuda_graphs"] and r["ms_per_step"] > 0 and r["graph_phase_sum_ms"] > 0
        assert r["new_tokens"] == 4 * 24
    assert by["ar"]["steps"] == 24 and by["full"]["steps"] < 24  # replayed acceptance at 0.8
    assert 1.5 < by["full"]["mean_accepted"] < 3.5
    assert res["summary"]["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    assert len(res["alpha_sweep"]) == 2 * 6
    assert by["dustin-vs"]["byte_floor_ms"] < by["dustin"]["byte_floor_ms"]


def test_refresh_in_the_captured_verify_graph_equals_eager(pair):
    """The refresh re-selects inside the verify graph: replayed, it leaves the same last refreshed sets as the eager path (the graph did not freeze the
    warm-up's set), call after call."""
    t, d = pair
    ps = prompts(8, seed=5)
    h, e = hooks("dustin-r", t, d), hooks("dustin-r", t, d)
    graph = speculative_generate(t, d, ps, 24, gamma=4, hooks=h)
    again = speculative_generate(t, d, ps, 24, gamma=4, hooks=h)  # replays the captured graphs
    eager = speculative_generate(t, d, ps, 24, gamma=4, hooks=e, cuda_graphs=False)
    assert graph.stats.cuda_graphs and default_engine(t, d).last.objs["hooks"] is h
    assert graph.tokens == again.tokens == eager.tokens and graph.stats.accepted == eager.stats.accepted
    assert torch.equal(h.indices, e.indices) and torch.equal(h.current, e.current)


@pytest.mark.parametrize("policy", ["dustin", "dustin-vs-r"])
def test_signals_on_a_side_stream_equal_in_line(pair, policy, monkeypatch):
    """The target's history scored on a side stream while the next step drafts and the draft's
    lookahead scored during the step's last draft forward on it, in graphs and eagerly, give the
    tokens and the signal buffers of scoring in line."""
    from dustin_runtime.sparse.policies import SignalPolicy

    t, d = pair
    ps = prompts(16, seed=21)
    h, e = hooks(policy, t, d), hooks(policy, t, d)
    graph = speculative_generate(t, d, ps, 24, gamma=4, hooks=h)
    again = speculative_generate(t, d, ps, 24, gamma=4, hooks=h)  # replays the captured graphs
    eager = speculative_generate(t, d, ps, 24, gamma=4, hooks=e, cuda_graphs=False)
    assert h.side is not None and e.side is not None and graph.stats.cuda_graphs and h.deferred
    with torch.inference_mode():  # the last pass's history is scored by a next drafting: run that part
        for p in (h, e):
            p.before_draft()
            p.drafted(p.tokens)
    monkeypatch.setattr(SignalPolicy, "_side_stream", lambda self, device: None)  # in line (a fresh eager engine)
    i = hooks(policy, t, d)
    inline = speculative_generate(t, d, ps, 24, gamma=4, hooks=i, cuda_graphs=False)
    assert i.side is None
    assert graph.tokens == again.tokens == eager.tokens == inline.tokens
    assert graph.stats.accepted == inline.stats.accepted
    assert torch.equal(h.history, i.history) and torch.equal(e.history, i.history)
    assert torch.equal(h.draft_score, i.draft_score) and torch.equal(e.draft_score, i.draft_score)
    assert h.draft_score.abs().sum() > 0 and h.m > 0  # the lookahead chose rows


def test_bench_e2e_refresh_layers(tmp_path):
    from dustin_eval.bench_e2e import E2EConfig, run_e2e, write_result

    cfg = E2EConfig(target="qwen2.5-0.5b", draft="qwen2.5-0.5b", batch=4, context=2048, new_tokens=24, budget=256,
                    m=64, alphas=(), phase_reps=5, policies=("full", "dustin", "dustin-r", "dustin-vs-r"),
                    refresh_layers=(8, 16))
    res = run_e2e(cfg, "pytest")
    assert write_result(res, tmp_path).is_file()
    by = {r["policy"]: r for r in res["records"]}
    for r in res["records"]:
        assert r["cuda_graphs"] and r["ms_per_step"] > 0 and r["graph_phase_sum_ms"] > 0
        assert r["new_tokens"] == 4 * 24
    assert by["dustin-r"]["steps"] == by["dustin"]["steps"]  # the same replayed acceptance
    assert by["dustin-r"]["byte_floor_bytes"] > by["dustin"]["byte_floor_bytes"]
    assert res["summary"]["dustin-r"]["vs_no_refresh"] == pytest.approx(
        by["dustin-r"]["tokens_per_s"] / by["dustin"]["tokens_per_s"])
    assert res["sparse"]["refresh_layers"] == [8, 16]


@pytest.mark.parametrize("policy", ["full", "dustin-vs"])
def test_vocabulary_subset_draft_graph_path_equals_eager(pair, policy):
    """A draft whose head keeps a subset of the vocabulary (--draft-vocab): the graph path (the head's
    scatter into -inf logits captured too) equals the eager path, sequences of 16 through the
    skinny kernels."""
    t, d = pair
    d.restrict_head(torch.arange(0, 131, 2))
    try:
        ps = prompts(16, seed=5)
        eager = speculative_generate(t, d, ps, 20, gamma=4, hooks=hooks(policy, t, d), cuda_graphs=False)
        graph = speculative_generate(t, d, ps, 20, gamma=4, hooks=hooks(policy, t, d))
        assert graph.tokens == eager.tokens and graph.stats.accepted == eager.stats.accepted
    finally:
        d.restrict_head(None)


@pytest.mark.parametrize("policy", ["none", "dustin-vs"])
def test_graph_path_with_context_lookup_equals_eager(pair, policy):
    """--draft-lookup inside the graphs: the history buffer is loaded per call and updated in place."""
    from dustin_runtime.lookup import LookupConfig

    t, d = pair
    for call in range(2):
        g = torch.Generator().manual_seed(40 + call)
        motif = torch.randint(0, 131, (11,), generator=g).tolist()
        ps = [motif * (3 + b % 5) + torch.randint(0, 131, (b,), generator=g).tolist() for b in range(8)]
        look = LookupConfig(4, 1)
        eager = speculative_generate(t, d, ps, 21, gamma=4, hooks=hooks(policy, t, d), cuda_graphs=False, lookup=look)
        graph = speculative_generate(t, d, ps, 21, gamma=4, hooks=hooks(policy, t, d), lookup=look)
        assert graph.stats.cuda_graphs and graph.tokens == eager.tokens
        assert graph.stats.accepted == eager.stats.accepted
        assert graph.stats.extra["lookup_share"] == eager.stats.extra["lookup_share"] > 0


@pytest.mark.parametrize("enabled", [True, False])
def test_phases_run_under_the_engines_blas_library_and_put_the_users_back(enabled):
    """Warm-up call, capture and eager calls see `PhaseGraphs.blas`; the caller's setting holds after each."""
    from dustin_runtime.engine import BLAS, PhaseGraphs

    before = torch.backends.cuda.preferred_blas_library()
    seen = []
    x, w = torch.randn(80, 256, device="cuda"), torch.randn(128, 256, device="cuda")
    y = torch.empty(80, 128, device="cuda")

    def phase():
        seen.append(torch.backends.cuda.preferred_blas_library())
        torch.matmul(x, w.t(), out=y)

    pg = PhaseGraphs(enabled, blas=BLAS)
    for _ in range(3):
        pg.run("p", phase)
        assert torch.backends.cuda.preferred_blas_library() == before
    assert len(seen) == (2 if enabled else 3)  # replays run no Python
    assert all(str(s).lower().endswith(BLAS) for s in seen)
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-4, atol=1e-3)
