"""What the policy tests share (test_policies.py): prompts, the tiny target with a
noisy copy as its draft, one speculative run through a policy, a spy on the verification hooks, and
the all-heads config."""

import torch

from dustin_runtime.loader import load_model
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

PROMPTS = [
    [(7 * i + 3) % 131 for i in range(61)],
    [(5 * i + 1) % 131 for i in range(38)],
    [(11 * i + 2) % 131 for i in range(83)],
]
MAX_NEW = [18, 25, 14]


def noisy_copy(folder, scale=0.6, seed=12):
    draft, _ = load_model(str(folder))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=g))
    return draft


def policy_pair(folder, make_tiny_hf):
    """A tiny Llama-3 target written to `folder` and a noisy copy of it as the draft."""
    make_tiny_hf("llama3", folder, seed=11)
    target, _ = load_model(str(folder))
    return target, noisy_copy(folder)


def run(pair, policy, cfg, measure_arr=False, ops=None, trace=False, prompts=PROMPTS, max_new=MAX_NEW, gamma=3,
        paired=False):
    target, draft = pair
    hooks = make_policy(policy, cfg, target=target, draft=draft, measure_arr=measure_arr, ops=ops, paired=paired)
    if trace:
        hooks.trace = []
    return speculative_generate(target, draft, prompts, max_new, gamma=gamma, hooks=hooks), hooks


def spy_verify(hooks, after_before, after_observe):
    """Call after_before() after hooks.before_verify and after_observe(layer, q, cache, ctx) after each
    hooks.observe_verify (the set chosen, or re-chosen at a refresh layer, is in place by then)."""
    inner_before, inner_observe = hooks.before_verify, hooks.observe_verify

    def before_verify():
        inner_before()
        after_before()

    def observe_verify(layer, q, cache, ctx):
        inner_observe(layer, q, cache, ctx)
        after_observe(layer, q, cache, ctx)

    hooks.before_verify, hooks.observe_verify = before_verify, observe_verify


def config(target, draft, budget, sinks=2, window=6):
    return SparseConfig.all_heads(target.cfg, draft.cfg, budget, sinks=sinks, window=window)
