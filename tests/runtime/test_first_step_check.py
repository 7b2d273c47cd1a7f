"""The first-step check of decoding (`generate.check_finite`): logits that are not finite stop the
run with one DustinError naming the model, instead of greedy token 0 forever; finite ones, and the
EOS columns masked to -Inf before min_new_tokens, pass. On CUDA the second call replays the steps'
CUDA graphs, whose logits buffers the check reads."""

import pytest
import torch

from dustin_runtime.errors import DustinError
from dustin_runtime.generate import check_finite, generate
from dustin_runtime.speculative import speculative_generate

PROMPTS = [[5, 9, 17, 3], [44, 2, 8, 90, 13]]


def _pair(perturbed_pair, device):
    target, draft = perturbed_pair("llama3", 3, 0.3)
    return target.to(device), draft.to(device)


def _check(target, draft, graphs: bool):
    eos = (7,)
    kw = dict(cuda_graphs=graphs)
    ok = speculative_generate(target, draft, PROMPTS, 6, gamma=3, eos_ids=eos, min_new_tokens=4, **kw)
    assert all(len(t) == 6 or t[-1] in eos for t in ok.tokens)  # EOS masked to -Inf early: not refused
    assert generate(target, PROMPTS, 6, **kw).tokens
    for who, model in (("the target", target), ("the draft", draft)):
        w = model.norm.weight
        keep = w.clone()
        with torch.no_grad():
            w.fill_(float("nan"))
        with pytest.raises(DustinError, match=f"^{who} .*logits are not finite"):
            speculative_generate(target, draft, PROMPTS, 6, gamma=3, **kw)
        if model is target:
            with pytest.raises(DustinError, match="logits are not finite"):
                generate(target, PROMPTS, 6, **kw)
        with torch.no_grad():
            w.copy_(keep)
    assert speculative_generate(target, draft, PROMPTS, 6, gamma=3, **kw).tokens == \
        speculative_generate(target, draft, PROMPTS, 6, gamma=3, cuda_graphs=False).tokens


def test_first_step_logits_not_finite_are_refused(perturbed_pair):
    target, draft = _pair(perturbed_pair, "cpu")
    _check(target, draft, graphs=False)


@pytest.mark.gpu
def test_first_step_check_reads_the_replayed_graphs(perturbed_pair):
    target, draft = _pair(perturbed_pair, "cuda")
    _check(target, draft, graphs=True)


def test_check_finite_predicate(perturbed_pair):
    target, _ = perturbed_pair("llama3", 3, 0.3)
    x = torch.randn(2, 3, 11)
    check_finite(x, target, "the target")
    x[0, 1, 4] = float("-inf")  # a masked column
    check_finite(x, target, "the target")
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[1, 2, 0] = bad
        with pytest.raises(DustinError):
            check_finite(y, target, "the target")
    y = x.clone()
    y[1, 0] = float("-inf")  # a whole row of -Inf: no token to choose
    with pytest.raises(DustinError):
        check_finite(y, target, "the target")
