"""The decoding loop's static state: reuse across calls (the engine), replayed acceptance, masked
finished sequences and exact accepted counts. (CUDA graph replay of the same phases: test_gpu.py.)"""

import pytest
import torch

from dustin_runtime.engine import Engine
from dustin_runtime.generate import generate
from dustin_runtime.sampling import SamplingConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import AcceptReplay, speculative_generate


@pytest.fixture
def pair(perturbed_pair):
    """A target and a draft that agree often but not always (the draft is the target, perturbed)."""
    return perturbed_pair("qwen2", 31, 0.5)


PROMPTS = [[5, 9, 17, 3, 8, 1, 30, 2, 44, 9], [44, 2, 8, 90, 13, 7, 7, 21, 60, 1, 33, 4, 4, 19], [100, 3, 3]]


def dustin(pair, budget=8):
    t, d = pair
    cfg = SparseConfig.all_heads(t.cfg, d.cfg, budget, sinks=1, window=2)
    return make_policy("dustin", cfg, target=t, draft=d)


@pytest.mark.parametrize("policy", ["none", "dustin", "dustin-sparse-draft"])
def test_engine_reuse_equals_fresh_runs(pair, policy):
    """A cached loop state (what CUDA graphs capture) reset for each call gives what fresh state gives."""
    target, draft = pair
    eng = Engine(target, draft)
    calls = [(PROMPTS, [9, 14, 6], 0), ([p[::-1] for p in PROMPTS], [12, 5, 10], 1), (PROMPTS, [9, 14, 6], 0)]
    sampling = SamplingConfig(temperature=0.9, top_p=0.95)
    for prompts, max_new, seed in calls:
        hooks = lambda: {"none": None, "dustin": dustin(pair)}.get(policy) or sparse_draft(pair, 8)  # noqa: E731
        kw = dict(gamma=3, sampling=sampling, seed=seed)
        reused = speculative_generate(target, draft, prompts, max_new, hooks=hooks(), engine=eng, **kw)
        fresh = speculative_generate(target, draft, prompts, max_new, hooks=hooks(), **kw)
        assert reused.tokens == fresh.tokens and reused.stats.accepted == fresh.stats.accepted
    assert len(eng.states) == 1 and next(iter(eng.states.values())).calls == 3
    ar_eng = Engine(target)
    for prompts, max_new, seed in calls:
        a = generate(target, prompts, max_new, sampling=sampling, seed=seed, engine=ar_eng)
        assert a.tokens == generate(target, prompts, max_new, sampling=sampling, seed=seed).tokens


def test_engine_keeps_caches_of_close_lengths_and_drops_states_on_new_ones(pair):
    target, draft = pair
    eng = Engine(target, draft)
    speculative_generate(target, draft, PROMPTS, 8, gamma=2, engine=eng)
    cache = eng.tcache
    speculative_generate(target, draft, [p + [1] for p in PROMPTS], 9, gamma=2, engine=eng)
    assert eng.tcache is cache and len(eng.states) == 1  # same batch, a few more rows: reused
    speculative_generate(target, draft, PROMPTS[:2], 8, gamma=2, engine=eng)
    assert eng.tcache is not cache and eng.tcache.batch == 2 and len(eng.states) == 1


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0)])
def test_replayed_counts_of_a_real_run_reproduce_it(pair, sampling):
    target, draft = pair
    real = speculative_generate(target, draft, PROMPTS, [11, 16, 7], gamma=4, sampling=sampling, seed=3)
    counts = torch.tensor(real.stats.accepted).clamp_min(0)  # finished sequences' rows are unused
    again = speculative_generate(target, draft, PROMPTS, [11, 16, 7], gamma=4, sampling=sampling, seed=3,
                                 replay=AcceptReplay(counts))
    assert again.stats.accepted == real.stats.accepted
    if sampling.greedy:
        assert again.tokens == real.tokens
    else:  # the counts are recorded cut at the length limit: the last step of a sequence can then
        # force fewer drafts than the real decision kept, and its last token is resampled there
        assert [t[:-1] for t in again.tokens] == [t[:-1] for t in real.tokens]
    assert again.stats.accept_source == "replayed" and real.stats.accept_source == "model"


def test_replay_changes_only_the_accept_decision(pair):
    """Forced counts decide how many drafts are kept; the token after them is the target's, and
    drafting, verification and the cache advance follow as in a real run."""
    target, draft = pair
    g = torch.Generator().manual_seed(4)
    counts = torch.randint(0, 4, (40, 3), generator=g)  # gamma 3
    out = speculative_generate(target, draft, PROMPTS, [20, 20, 5], gamma=3, replay=AcceptReplay(counts),
                               hooks=dustin(pair))
    acc = torch.tensor(out.stats.accepted)  # [steps, B]
    for b, want in enumerate([20, 20, 5]):
        live = acc[:, b] >= 0
        steps = int(live.sum())
        assert live[:steps].all() and not live[steps:].any()  # a finished sequence stays finished
        assert torch.equal(acc[: steps - 1, b], counts[: steps - 1, b])  # forced, up to its last step
        assert acc[steps - 1, b] <= counts[steps - 1, b]  # the last one cut at the length limit
        assert int((acc[:steps, b] + 1).sum()) == want == len(out.tokens[b])
    # the emitted tokens are the drafts' (kept) and then the target's own choice
    ref = speculative_generate(target, draft, PROMPTS, [20, 20, 5], gamma=3, replay=AcceptReplay(counts),
                               hooks=dustin(pair))
    assert ref.tokens == out.tokens


def test_accepted_counts_stop_at_the_length_limit_and_eos(pair):
    target, draft = pair
    full = speculative_generate(target, draft, PROMPTS, 3, gamma=4, replay=AcceptReplay(torch.full((4, 3), 4)))
    assert full.stats.accepted[0] == [2, 2, 2]  # 5 emitted, 3 kept
    first = full.tokens[1][0]
    eos = speculative_generate(target, draft, PROMPTS, 9, gamma=4, eos_ids=(first,),
                               replay=AcceptReplay(torch.full((4, 3), 4)))
    assert eos.tokens[1] == [first] and eos.stats.accepted[0][1] == 0 and eos.finish_reasons[1] == "eos"
    assert eos.stats.accepted[1][1] == -1


def sparse_draft(pair, budget, policy="dustin", draft_kv="verify-set", **kw):
    t, d = pair
    cfg = SparseConfig.all_heads(t.cfg, d.cfg, budget, sinks=1, window=3)
    cfg = SparseConfig(**{**cfg.__dict__, "draft_kv": draft_kv})
    return make_policy(policy, cfg, target=t, draft=d, **kw)


@pytest.mark.parametrize("policy", ["dustin", "streamingllm"])
def test_sparse_drafting_with_a_set_covering_the_context_equals_full_drafting(pair, policy):
    target, draft = pair
    t, d = pair
    cfg = SparseConfig.all_heads(t.cfg, d.cfg, 64, sinks=1, window=3)
    full = speculative_generate(target, draft, PROMPTS, 12, gamma=3, hooks=make_policy(policy, cfg, target=t, draft=d))
    sparse = speculative_generate(target, draft, PROMPTS, 12, gamma=3, hooks=sparse_draft(pair, 64, policy))
    assert sparse.tokens == full.tokens and sparse.stats.accepted == full.stats.accepted
    assert sparse.stats.extra["draft_kv"] == "verify-set"


@pytest.mark.parametrize("policy", ["dustin", "streamingllm"])
def test_sparse_drafting_attends_the_set_the_commits_and_its_drafts(pair, monkeypatch, policy):
    """At every draft forward the draft's rows are: the latest verification set (chosen at L0), the
    rows committed since ([L0, L)) and this step's drafts before the forward's own ([L, start))."""
    from dustin_runtime.sparse import policies

    target, draft = pair
    seen = []
    orig = policies.DraftSet.drafted

    def record(self, start, lens):
        orig(self, start, lens)
        seen.append((self.idx.clone(), self.set_lens.clone(), start.clone(), lens.clone()))

    monkeypatch.setattr(policies.DraftSet, "drafted", record)
    hooks = sparse_draft(pair, 8, policy)
    out = speculative_generate(target, draft, PROMPTS, 14, gamma=3, hooks=hooks)
    assert len(seen) == 3 * out.stats.steps  # gamma forwards per step
    checked = 0
    for idx, L0, start, _ in seen:
        for b in range(len(PROMPTS)):
            rows = [int(r) for r in idx[b] if r >= 0]
            assert len(rows) == len(set(rows)) and all(r < int(start[b]) for r in rows)
            S_part = [r for r in rows if r < int(L0[b])]
            assert len(S_part) == min(8, int(L0[b]))  # the set: the whole context when it is short
            assert set(range(int(L0[b]), int(start[b]))) <= set(rows)  # commits and drafts so far
            assert {0} | set(range(max(0, int(L0[b]) - 3), int(L0[b]))) <= set(S_part)  # its sinks and window
            checked += 1
    assert checked and any(int(L0[b]) < int(L[b]) for _, L0, _, L in seen for b in range(3))
    assert any(int(L0[b]) > 8 for _, L0, _, _ in seen for b in range(3)), "the budget must bind"


@pytest.mark.parametrize("budget", [64, 8])
def test_paired_drafting_leaves_the_loop_as_it_was(pair, budget):
    """The shadow drafting over the draft's whole cache rewrites no state the real drafting reads:
    the tokens and accepted counts are those of the run without it; with a set covering the context
    both drafts are the same, so full verification accepts as many of each."""
    target, draft = pair
    plain = speculative_generate(target, draft, PROMPTS, 12, gamma=3, hooks=sparse_draft(pair, budget))
    paired = speculative_generate(target, draft, PROMPTS, 12, gamma=3, hooks=sparse_draft(pair, budget, paired=True))
    assert paired.tokens == plain.tokens and paired.stats.accepted == plain.stats.accepted
    x = paired.stats.extra
    assert x["shadow_tau"] > 1 and len(x["paired_shadow_per_sequence"]) == len(PROMPTS)
    if budget == 64:
        assert x["draft_retention"] == 1 and x["paired_shadow_per_sequence"] == x["paired_full_per_sequence"]
    assert x["draft_retention"] == pytest.approx(x["full_tau"] / x["shadow_tau"])
    full_kv = speculative_generate(target, draft, PROMPTS, 12, gamma=3,
                                   hooks=sparse_draft(pair, budget, draft_kv="full", paired=True))
    assert "draft_retention" not in full_kv.stats.extra  # no shadow without sparse drafting


def test_paired_drafting_shadows_full_kv_drafting_of_the_same_context(pair):
    """One step from the same prefill: the shadow's drafts are those a full-KV drafting run makes,
    and full verification accepts as many of them; the set's drafts differ somewhere (the budget binds)."""
    target, draft = pair
    seen = {}
    hooks = sparse_draft(pair, 4, paired=True)
    for name in ("drafted", "shadow_drafted"):
        orig = getattr(hooks, name)

        def record(tokens, orig=orig, name=name):
            seen[name] = tokens.clone()
            orig(tokens)

        setattr(hooks, name, record)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 131, (n,), generator=g).tolist() for n in (37, 52, 29, 44)]  # the set binds
    sparse = speculative_generate(target, draft, prompts, 1, gamma=3, hooks=hooks)
    full_hooks = sparse_draft(pair, 4, draft_kv="full", paired=True)
    full_hooks.drafted = lambda tokens, orig=full_hooks.drafted: (seen.__setitem__("full", tokens.clone()), orig(tokens))
    full = speculative_generate(target, draft, prompts, 1, gamma=3, hooks=full_hooks)
    assert sparse.stats.steps == full.stats.steps == 1
    assert torch.equal(seen["shadow_drafted"], seen["full"])
    assert not torch.equal(seen["drafted"], seen["full"])
    assert sparse.stats.extra["paired_shadow_per_sequence"] == full.stats.extra["paired_full_per_sequence"]
    assert sparse.stats.extra["shadow_tau"] == full.stats.extra["full_tau"]


def test_paired_drafting_needs_greedy_decoding(pair):
    from dustin_runtime.errors import DustinError

    target, draft = pair
    with pytest.raises(DustinError, match="greedy"):
        speculative_generate(target, draft, PROMPTS, 4, gamma=3, hooks=sparse_draft(pair, 8, paired=True),
                             sampling=SamplingConfig(temperature=1.0))


def test_sparse_drafting_is_refused_where_there_is_no_shared_set(pair):
    from dustin_runtime.errors import DustinError

    t, d = pair
    cfg = SparseConfig(budget=16, sinks=1, window=3, draft_kv="verify-set")
    with pytest.raises(DustinError, match="per layer"):
        make_policy("quest", cfg, target=t, draft=d)
    with pytest.raises(DustinError, match="no verification set"):
        make_policy("full", cfg, target=t, draft=d)
