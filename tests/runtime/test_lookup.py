"""Context lookup beside the draft (`--draft-lookup`): the proposals against a plain-Python search
(longest n-gram first, the most recent occurrence, then the copy goes on), greedy decoding still
emits the target's own tokens, and the option's parsing. (Sampled: the joint-law test in
test_decoding.py; CUDA graphs: test_graphs_gpu.py.)"""

import random

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model
from dustin_runtime.lookup import ContextLookup, LookupConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate


def ref_next(known: list[int], ptr: int, nmax: int, nmin: int) -> int:
    """The history position whose token comes next (-1: none): the copy goes on, else the most
    recent earlier end of the longest suffix match, nmax down to nmin."""
    if ptr >= 0:
        return ptr + 1
    E = len(known) - 1
    for n in range(nmax, nmin - 1, -1):
        if E - n + 1 < 0:
            continue
        suffix = known[E - n + 1:]
        for j in range(E - 1, n - 2, -1):
            if known[j - n + 1: j + 1] == suffix:
                return j + 1
    return -1


@pytest.mark.parametrize("nmax,nmin", [(4, 2), (3, 1), (1, 1), (5, 5)])
def test_drafts_equal_the_plain_search_over_steps(nmax, nmin):
    """Several steps of the loop's use: gamma draft forwards (copies, else the model's token), then a
    commit of some drafts and a new token; the history and every choice follow the plain search."""
    rng = random.Random(nmax * 10 + nmin)
    B, N, steps, gamma, V = 5, 61, 6, 3, 5
    lens = [1, 2, 7, 13, 30]  # prompts from one token on (no match possible at first)
    hists = [[rng.randrange(3 if b % 2 else 5) for _ in range(n)] for b, n in enumerate(lens)]
    look = ContextLookup(LookupConfig(nmax, nmin), B, N, "cpu")
    look.load(hists)
    L = [n - 1 for n in lens]  # cur sits at L
    made = copied = 0
    for _ in range(steps):
        look.begin()
        ptrs = [-1] * B
        for i in range(gamma):
            model = [rng.randrange(V) for _ in range(B)]
            tok, hit = look.draft(torch.tensor(L) + i, torch.tensor(model), V, torch.zeros(B, dtype=torch.bool))
            for b in range(B):
                known = hists[b][: L[b] + i + 1]
                ptrs[b] = ref_next(known, ptrs[b], nmax, nmin)
                assert bool(hit[b]) == (ptrs[b] >= 0), (b, i)
                choice = known[ptrs[b]] if ptrs[b] >= 0 else model[b]
                assert int(tok[b]) == choice
                hists[b] = known + [choice]
                made, copied = made + 1, copied + (ptrs[b] >= 0)
        for b in range(B):  # commit a few drafts and a new token, as the loop does
            n = rng.randrange(gamma + 1)
            hists[b] = hists[b][: L[b] + n + 1] + [rng.randrange(V)]
            L[b] += n + 1
        look.write(torch.tensor(L), torch.tensor([hists[b][L[b]] for b in range(B)]))
        for b in range(B):
            assert look.hist[b, : L[b] + 1].tolist() == hists[b][: L[b] + 1]
    assert look.summary()["lookup_share"] == pytest.approx(copied / made) and copied < made
    assert copied > 0 or nmin == 5  # short alphabets repeat: copies happen unless 5 tokens must match


@pytest.fixture
def pair(tiny_hf):
    tfolder, _ = tiny_hf("llama3", seed=41)
    dfolder, _ = tiny_hf("llama3", seed=42, num_hidden_layers=1)
    return load_model(str(tfolder))[0], load_model(str(dfolder))[0]


@pytest.mark.parametrize("policy", [None, "dustin", "dustin-vs"])
def test_greedy_with_lookup_emits_the_targets_tokens(pair, policy):
    target, draft = pair
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(0, 131, (9,), generator=g).tolist()
    prompts = [motif * 4 + [5, 6], torch.randint(0, 131, (23,), generator=g).tolist(), motif[:3] * 6]
    hooks = None
    if policy is not None:
        cfg = SparseConfig.all_heads(target.cfg, draft.cfg, 64, sinks=1, window=3)  # covers: exact
        cfg = SparseConfig(**{**cfg.__dict__, "draft_kv": "verify-set" if policy.endswith("-vs") else "full"})
        hooks = make_policy("dustin", cfg, target=target, draft=draft)
    out = speculative_generate(target, draft, prompts, 17, gamma=4, hooks=hooks, lookup=LookupConfig(4, 1))
    assert out.tokens == generate(target, prompts, 17).tokens
    x = out.stats.extra
    assert x["draft_lookup"] == "4:1" and 0 < x["lookup_share"] <= 1


def test_paired_drafting_with_lookup_counts_the_real_drafts_only(pair):
    """The shadow drafting (paired drafting) copies too, but only the real drafts are counted, and the
    tokens are those of the run without the shadow."""
    target, draft = pair
    cfg = SparseConfig.all_heads(target.cfg, draft.cfg, 8, sinks=1, window=3)
    cfg = SparseConfig(**{**cfg.__dict__, "draft_kv": "verify-set"})
    g = torch.Generator().manual_seed(8)
    motif = torch.randint(0, 131, (7,), generator=g).tolist()
    prompts = [motif * 5, motif[:4] * 6 + [1, 2]]
    runs = [speculative_generate(target, draft, prompts, 15, gamma=3, lookup=LookupConfig(4, 1),
                                 hooks=make_policy("dustin", cfg, target=target, draft=draft, paired=paired))
            for paired in (False, True)]
    assert runs[0].tokens == runs[1].tokens
    a, b = (r.stats.extra for r in runs)
    assert "draft_retention" in b and a["lookup_drafts"] == b["lookup_drafts"] > 0
    assert a["lookup_share"] == b["lookup_share"] > 0


def test_lookup_is_refused_under_tensor_parallel_and_parses():
    assert LookupConfig.parse("4") == LookupConfig(4, 2)
    assert LookupConfig.parse("1") == LookupConfig(1, 1)
    assert LookupConfig.parse(" 6:3 ") == LookupConfig(6, 3)
    for bad in ("", "x", "2:3", "0", "4:0", "17", "4:2:1"):
        with pytest.raises(DustinError, match="n-gram"):
            LookupConfig.parse(bad)
