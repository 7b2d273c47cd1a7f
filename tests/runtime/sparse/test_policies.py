"""Sparse verification policies end to end on tiny random models: full budget equals full
verification, set invariants under ragged acceptance, sparse attention equals masked attention,
the kernel path equals the reference path, and ARR orders oracle >= dustin >= streamingllm."""

import pytest
import torch

from dustin_runtime.attention import AttentionBackend
from dustin_runtime.errors import DustinError
from dustin_runtime.loader import load_model
from dustin_runtime.ops import SparseOps
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import POLICY_CLASSES, make_policy, policy_class
from dustin_runtime.speculative import SpecHooks, speculative_generate

from .policy_cases import MAX_NEW, PROMPTS, config, noisy_copy, policy_pair, run, spy_verify

SPARSE = [p for p, c in POLICY_CLASSES.items() if c.budgeted]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory, make_tiny_hf):
    return policy_pair(tmp_path_factory.mktemp("pol") / "t", make_tiny_hf)


@pytest.mark.parametrize("policy", SPARSE)
def test_budget_covering_the_context_gives_the_tokens_of_full(pair, policy):
    full, _ = run(pair, "full", None)
    plain = speculative_generate(*pair, PROMPTS, MAX_NEW, gamma=3)
    assert full.tokens == plain.tokens
    out, _ = run(pair, policy, config(*pair, budget=128), measure_arr=True, paired=True)
    assert out.tokens == full.tokens
    assert out.stats.policy == policy
    x = out.stats.extra
    assert x["arr"] == pytest.approx(1.0, abs=1e-5)
    assert x["agree"] == 1 and x["paired_retention"] == 1 and x["full_tau"] == pytest.approx(out.stats.mean_accepted + 1)


@pytest.mark.parametrize("policy", ["streamingllm", "quest", "oracle"])
def test_paired_acceptance_at_a_small_budget(pair, policy):
    out, _ = run(pair, policy, config(*pair, budget=16, sinks=2, window=4), paired=True)
    x = out.stats.extra
    tau = out.stats.mean_accepted + 1
    assert x["paired_retention"] * x["full_tau"] == pytest.approx(tau)  # the same (sequence, step) pairs
    assert 0 < x["agree"] < 1  # a 16-row set changes some verifications, not all


def check_set(idx, L, S, sinks, window):
    """Invariants of one sequence's set idx [S] for context L."""
    idx = idx.tolist()
    assert len(idx) == S
    if L <= S:
        assert idx == list(range(L)) + [-1] * (S - L)
        return
    assert all(0 <= i < L for i in idx), (idx, L)
    assert idx == sorted(set(idx)), "sorted and unique"
    assert set(range(sinks)) <= set(idx) and set(range(L - window, L)) <= set(idx)


@pytest.mark.parametrize("policy", SPARSE)
def test_set_invariants_under_ragged_acceptance(pair, policy):
    S, sinks, window = 24, 2, 6
    out, hooks = run(pair, policy, config(*pair, budget=S, sinks=sinks, window=window), trace=True)
    acc = torch.tensor(out.stats.accepted)  # [steps, B]
    live = acc >= 0
    ragged = [(row[m].min() != row[m].max()).item() for row, m in zip(acc, live, strict=True) if m.sum() > 1]
    assert any(ragged), "the test must see sequences accepting different lengths in one step"
    # the lengths each step verified at, from the accepted counts (prompt - 1, then + n + 1), for
    # the sequences live at that step (a finished one's last count is cut at its length limit)
    lens = torch.tensor([len(p) - 1 for p in PROMPTS])
    expected = []
    for row in acc:
        expected.append(lens.clone())
        lens = lens + torch.where(row >= 0, row + 1, 0)
    sets = hooks.trace
    per_step = 1 if policy != "quest" else pair[0].cfg.num_layers
    assert len(sets) == per_step * len(expected)
    for i, (_, L, idx) in enumerate(sets):
        want, live = expected[i // per_step], acc[i // per_step] >= 0
        assert L[live].tolist() == want[live].tolist()
        rows = idx if idx.dim() == 2 else idx.flatten(0, 1)
        Ls = L if idx.dim() == 2 else L.repeat_interleave(idx.shape[1])
        assert rows.shape[-1] == S and rows.dtype == torch.int32
        for r, Lr in zip(rows, Ls.tolist(), strict=True):
            check_set(r, Lr, S, sinks, window)
    assert any(int(L.max()) > S for _, L, _ in sets), "the budget must bind"


class MaskedVerify(SpecHooks):
    """Reference of sparse verification: the torch reference attention over a boolean mask of the
    rows in another policy's set (recorded by it) plus the new tokens."""

    name = "masked"

    def __init__(self, sets):
        self.sets, self.step = sets, 0

    def target_backend(self, default):
        outer = self

        class Backend(AttentionBackend):
            def attend(self, layer, q, cache, ctx):
                if ctx.phase != "verify":
                    return default.attend(layer, q, cache, ctx)
                _, _, idx = outer.sets[outer.step]
                B, N = q.shape[0], cache.max_len
                keep = torch.zeros(B, N + 1, dtype=torch.bool)
                keep.scatter_(1, torch.where(idx >= 0, idx, N).long(), True)
                keep = keep[:, :N] | (torch.arange(N) >= ctx.start.view(B, 1))  # the new tokens
                return _masked_attention(q, cache.k[layer], cache.v[layer], ctx.start, keep)

        return Backend()

    def after_verify(self, accepted, advance):
        self.step += 1


def _masked_attention(q, k, v, start, keep):
    B, H, M, D = q.shape
    G, N = k.shape[1], k.shape[2]
    qpos = start.view(B, 1).long() + torch.arange(M)
    visible = (torch.arange(N).view(1, 1, N) <= qpos.unsqueeze(-1)) & keep.view(B, 1, N)  # [B, M, N]
    return torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=visible.unsqueeze(1), enable_gqa=G != H).to(q.dtype)


@pytest.mark.parametrize("policy", ["dustin", "streamingllm", "oracle"])
def test_sparse_verification_equals_masked_full_attention(pair, policy):
    cfg = config(*pair, budget=20, sinks=2, window=5)
    out, hooks = run(pair, policy, cfg, trace=True)
    ref = speculative_generate(*pair, PROMPTS, MAX_NEW, gamma=3, hooks=_Tail(MaskedVerify(hooks.trace)))
    assert ref.tokens == out.tokens
    full, _ = run(pair, "full", None)
    assert out.tokens != full.tokens  # the budget changes what is verified


class _Tail(SpecHooks):
    """Wraps hooks with the policies' prefill tail (same prefill chunks, so the same cache)."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def target_backend(self, default):
        return self.inner.target_backend(default)

    def prefill_tail(self, gamma):
        return gamma + 1

    def after_verify(self, accepted, advance):
        self.inner.after_verify(accepted, advance)


@pytest.mark.parametrize("policy", ["dustin", "quest"])
def test_triton_kernels_path_equals_reference_path(pair, policy):
    """The CUDA path (srh_scores, select_indices, sparse_verify_attention launchers), run in the
    Triton interpreter, picks the same sets and tokens as the torch references."""
    cfg = config(*pair, budget=24)
    prompts, max_new = PROMPTS[:2], [6, 6]
    a, ha = run(pair, policy, cfg, trace=True, prompts=prompts, max_new=max_new)
    b, hb = run(pair, policy, cfg, trace=True, prompts=prompts, max_new=max_new, ops=SparseOps(triton=True))
    assert a.tokens == b.tokens
    for (_, la, ia), (_, lb, ib) in zip(ha.trace, hb.trace, strict=True):
        assert torch.equal(la, lb) and torch.equal(ia, ib)


def test_arr_orders_oracle_dustin_streamingllm(tmp_path, make_tiny_hf):
    """Constructed case: every query of the target is one constant vector (q weights zeroed, a q
    bias on the slowest RoPE pair, RoPE almost still), so attention follows key content, not
    position, and concentrates on a few tokens anywhere in the context. History and lookahead
    signals find them; a recent window does not."""
    folder = tmp_path / "q"
    make_tiny_hf("qwen2", folder, seed=5, rope_theta=1e9)
    target, _ = load_model(str(folder))
    draft = noisy_copy(folder, scale=0.2, seed=6)
    c = target.cfg
    D, half = c.head_dim, c.head_dim // 2
    for m in (target, draft):
        with torch.no_grad():
            for blk in m.layers:
                blk.attn.wqkv.weight[: c.q_size] = 0
                bias = torch.zeros(c.num_heads, D)
                bias[:, half - 1] = 150.0  # the slowest-rotating pair: position hardly matters
                bias[:, D - 1] = 150.0
                blk.attn.wqkv.bias[: c.q_size] = bias.flatten()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 131, (n,), generator=g).tolist() for n in (150, 121)]
    cfg = SparseConfig.all_heads(c, draft.cfg, 24, sinks=2, window=4)
    arr = {}
    for policy in ("oracle", "dustin", "target-only", "streamingllm", "quest"):
        hooks = make_policy(policy, cfg, target=target, draft=draft, measure_arr=True)
        out = speculative_generate(target, draft, prompts, 12, gamma=3, hooks=hooks)
        arr[policy] = out.stats.extra["arr"]
    assert arr["oracle"] >= arr["dustin"] - 1e-6, arr
    assert arr["dustin"] > arr["streamingllm"] + 0.05, arr
    assert arr["target-only"] > arr["streamingllm"] + 0.05, arr
    assert arr["quest"] > arr["streamingllm"], arr


def test_policy_refusals(pair):
    target, draft = pair
    with pytest.raises(DustinError, match="unknown policy"):
        make_policy("h2o", None, target=target, draft=draft)
    with pytest.raises(DustinError, match="needs a budget"):
        make_policy("quest", None, target=target, draft=draft)
    with pytest.raises(DustinError, match="needs retrieval heads"):
        make_policy("dustin", SparseConfig(budget=64, sinks=2, window=6, m=10), target=target, draft=draft)
    with pytest.raises(DustinError, match="smaller than sinks \\+ window"):
        SparseConfig(budget=10, sinks=4, window=8)
    bad = SparseConfig(budget=64, sinks=2, window=6, m=10, draft_heads=((0, 0, (0, 1, 2, 3)),),
                       target_heads=((5, 0, (0,)),))
    with pytest.raises(DustinError, match="outside the target model"):
        make_policy("dustin", bad, target=target, draft=draft)
    wrong_group = SparseConfig(budget=64, sinks=2, window=6, m=10, draft_heads=((0, 1, (0,)),),
                               target_heads=((1, 0, (0,)),))
    with pytest.raises(DustinError, match="do not use KV head 1"):
        make_policy("dustin", wrong_group, target=target, draft=draft)


def test_dustin_set_is_the_hybrid_of_both_signals(pair):
    """Each step's set is select_indices(draft lookahead, target history, m) of that step's signals,
    both signals are live (normalised distributions over [0, L)), and m > 0 changes the set."""
    from dustin_kernels import select_indices_ref

    cfg = config(*pair, budget=24)
    target, draft = pair
    hooks = make_policy("dustin", cfg, target=target, draft=draft)
    checked = []
    inner = hooks.before_verify

    def before_verify():
        inner()
        lens = hooks.tcache.lengths
        want = select_indices_ref(hooks.draft_score, hooks.history, lens, budget=24, sinks=2, window=6, m=hooks.m)
        only_target = select_indices_ref(hooks.history, None, lens, budget=24, sinks=2, window=6, m=16)
        for score in (hooks.draft_score, hooks.history):
            L = lens.long().view(-1, 1)
            inside = torch.arange(score.shape[1]).view(1, -1) < L
            assert torch.allclose(score.sum(1), torch.ones(len(L))) and (score[~inside] == 0).all()
        checked.append((torch.equal(hooks.indices, want), torch.equal(want, only_target)))

    hooks.before_verify = before_verify
    speculative_generate(target, draft, PROMPTS, MAX_NEW, gamma=3, hooks=hooks)
    assert hooks.m == 8 and all(ok for ok, _ in checked)
    assert not all(same for _, same in checked)  # the draft's share matters


def test_refresh_layer_reselects_from_the_current_queries(pair):
    """With a refresh layer, the layers before it attend the set chosen before the pass, and it (and
    any later layer) attends select_indices of the current verification queries' attention over
    every KV head of that layer (reference scores), which differs from the pre-pass set at times."""
    from dataclasses import replace

    from dustin_kernels import select_indices_ref, srh_scores_ref

    target, draft = pair
    t = target.cfg
    assert t.num_kv_heads >= 2
    cfg = replace(config(target, draft, budget=24), refresh_layers=(1,))
    hooks = make_policy("dustin", cfg, target=target, draft=draft)
    hooks.trace = []
    before, wanted = [], []
    query = list(range(t.num_heads))

    def observe_verify(layer, q, cache, ctx):
        if layer == 1:
            c = hooks.cfg
            heads = torch.tensor(query, dtype=torch.int32) // t.n_rep
            score = srh_scores_ref(q[:, query], heads, cache.k[1], ctx.start, reduce="sum")
            wanted.append(select_indices_ref(score, None, ctx.start, budget=24, sinks=c.sinks, window=c.window,
                                             m=c.free))

    spy_verify(hooks, lambda: before.append(hooks.indices.clone()), observe_verify)
    out = speculative_generate(target, draft, PROMPTS, MAX_NEW, gamma=3, hooks=hooks)
    assert hooks.layer_sets and len(hooks.trace) == 2 * out.stats.steps == 2 * len(before) == 2 * len(wanted)
    for i, (layer, _, idx) in enumerate(hooks.trace):
        assert layer == i % 2 and torch.equal(idx, (before if layer == 0 else wanted)[i // 2])
    assert any(not torch.equal(a, b) for a, b in zip(before, wanted, strict=True))


def test_refresh_layers_at_a_covering_budget_give_full_tokens(pair):
    from dataclasses import replace

    target, draft = pair
    full, _ = run(pair, "full", None)
    out, _ = run(pair, "dustin", replace(config(target, draft, budget=128), refresh_layers=(0, 1)), measure_arr=True)
    assert out.tokens == full.tokens and out.stats.extra["arr"] == pytest.approx(1.0, abs=1e-5)
    assert out.stats.extra["refresh_layers"] == [0, 1]  # what ran is reported
    plain, _ = run(pair, "dustin", config(target, draft, budget=128))
    assert "refresh_layers" not in plain.stats.extra


def test_refresh_layer_configs_refused(pair):
    from dataclasses import replace

    target, draft = pair
    cfg = config(target, draft, budget=24)
    with pytest.raises(DustinError, match="ascending"):
        replace(cfg, refresh_layers=(1, 0))
    with pytest.raises(DustinError, match="past the target's 2 layers"):
        make_policy("dustin", replace(cfg, refresh_layers=(2,)), target=target, draft=draft)


class _InOrder:
    """A CPU stand-in for the side CUDA stream: work queued on it runs in order, so the test follows
    the side-stream bookkeeping (what is stashed, when it is scored) without a GPU."""

    device = torch.device("cpu")

    def wait_stream(self, other):
        pass


@pytest.mark.parametrize("draft_kv", ["full", "verify-set"])
def test_history_scored_while_drafting_equals_in_line(pair, monkeypatch, draft_kv):
    """With a side stream a verification pass stashes its retrieval heads' queries and context lengths
    and the next drafting scores them: the tokens and, once the last stash is scored, the history of
    scoring in line."""
    import contextlib
    import dataclasses

    from dustin_runtime.sparse.policies import SignalPolicy

    cfg = dataclasses.replace(config(*pair, 24), draft_kv=draft_kv)
    inline_out, inline = run(pair, "dustin", cfg)
    assert inline.side is None and not inline.deferred
    monkeypatch.setattr(SignalPolicy, "_side_stream", lambda self, device: _InOrder())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _InOrder())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    out, h = run(pair, "dustin", cfg)
    assert h.deferred and out.tokens == inline_out.tokens
    assert not torch.equal(h.history, inline.history)  # one pass behind until a drafting scores it
    with torch.inference_mode():  # as the loop runs
        h.before_draft()
        h.drafted(h.tokens)
    assert torch.equal(h.history, inline.history) and not h.forked


def test_policy_traits_are_what_the_policies_do(pair):
    """Every policy's class traits (read by the planner and the benches without building one) match
    the built policy: budgeted ones need a config, one-set ones can be drafted over (verify-set) and
    the others refuse it, the ones that need heads refuse a config without any, and the names map
    to the classes that carry them."""
    from dataclasses import replace

    target, draft = pair
    cfg = config(target, draft, budget=24)
    headless = SparseConfig(budget=24, sinks=2, window=6)
    assert set(POLICY_CLASSES) == {"full", "dustin", "draft-only", "target-only", "streamingllm", "quest", "oracle"}
    for name, cls in POLICY_CLASSES.items():
        assert cls.name == name and policy_class(name) is cls
        if not cls.budgeted:
            assert isinstance(make_policy(name, None, target=target, draft=draft), cls)
            continue
        with pytest.raises(DustinError, match="needs a budget"):
            make_policy(name, None, target=target, draft=draft)
        vs = replace(cfg, draft_kv="verify-set")
        if cls.one_set:
            assert make_policy(name, vs, target=target, draft=draft).one_set
        else:
            with pytest.raises(DustinError, match="draft cannot draft over it"):
                make_policy(name, vs, target=target, draft=draft)
        if cls.needs_heads:
            with pytest.raises(DustinError, match="needs retrieval heads"):
                make_policy(name, headless, target=target, draft=draft)
        else:
            assert isinstance(make_policy(name, headless, target=target, draft=draft), cls)
    assert [n for n, c in POLICY_CLASSES.items() if c.refreshes] == ["dustin"]
    assert [n for n, c in POLICY_CLASSES.items() if c.pages] == ["quest"]
    with pytest.raises(DustinError, match="unknown policy 'eagle'; choose one of full, dustin"):
        policy_class("eagle")

