"""Fixtures of the profiler tests: a tiny target/draft pair with the Llama-3 tokenizer, a
calibration text, a profiling run's loaded pair and windows, and synthetic calibration statistics
with their candidate heads."""

import random
import shutil

import pytest
import torch

from dustin_profile import calibration as cal
from dustin_profile.calib_arr import CalibStats
from dustin_profile.candidates import Candidate
from dustin_runtime import pipeline

WORDS = ("the river house morning letter captain garden silver window quiet road winter mother ship "
         "door answer across never little stone between under light voice long").split()


def tiny_pair(root, shared, make_tiny_hf):
    out = {}
    for name, overrides in (("target", {}), ("draft", {"num_hidden_layers": 1, "num_attention_heads": 2,
                                                       "num_key_value_heads": 1}),
                            ("other", {"num_hidden_layers": 3})):
        folder = root / name
        make_tiny_hf("llama3", folder, seed=len(out), vocab_size=128256, hidden_size=32,
                     **{"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True, **overrides})
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(shared / "tokenizers" / "llama3" / f, folder / f)
        out[name] = folder
    return out


@pytest.fixture(scope="session")
def models(tmp_path_factory, shared_dir, make_tiny_hf):
    return tiny_pair(tmp_path_factory.mktemp("profile-models"), shared_dir, make_tiny_hf)


@pytest.fixture(scope="session")
def calib_text(tmp_path_factory):
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    path = tmp_path_factory.mktemp("calib") / "book.txt"
    path.write_text("\n".join(lines))
    return path


def _loaded(cfg, prof):
    tgt = pipeline.load(cfg.target, dtype=torch.float32, device="cpu")
    drf = pipeline.load(cfg.draft, dtype=torch.float32, device="cpu")
    docs = cal.read_documents(cfg.calib_paths, cfg.text_field)
    wins = cal.cut_windows(tgt.tokenizer, docs, cfg.windows + cfg.heldout, cfg.context + cfg.gamma + 1, cfg.seed)
    return tgt.model, drf.model, prof.to_sparse_config(), [list(w.tokens) for w in wins[: cfg.windows]]


@pytest.fixture(scope="session")
def loaded():
    """loaded(cfg, profile) -> (target, draft, the profile's SparseConfig without refresh, the run's
    calibration prose windows as token lists): the pair and data of a profiling run (fp32, CPU)."""
    return _loaded


def _random_stats(P=6, N=300, cd=3, ct=5, seed=0, lengths=None, ties=False) -> CalibStats:
    """Random A (a softmax-like distribution over each pass's context, summing to 1) and random
    candidate signals; `ties` quantises the signals so many values are equal."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths if lengths is not None else [N - 7 * i for i in range(P)])
    pos = torch.arange(N)
    valid = pos < lengths.view(-1, 1)
    raw = torch.rand(P, N, generator=g) ** 8 * valid
    attn = raw / raw.sum(1, keepdim=True)

    def sig(c):
        s = torch.rand(c, P, N, generator=g) * valid
        return (s * 4).floor() / 4 if ties else s

    return CalibStats(lengths, attn, sig(cd), sig(ct))


def _cands(cd, ct):
    return ([Candidate("draft", i, 0, (i,)) for i in range(cd)]
            + [Candidate("target", i, 0, (i,)) for i in range(ct)])


@pytest.fixture(scope="session")
def random_stats():
    """random_stats(P=6, N=300, cd=3, ct=5, seed=0, lengths=None, ties=False) -> CalibStats."""
    return _random_stats


@pytest.fixture(scope="session")
def cands():
    """cands(cd, ct): cd draft and ct target candidates, one KV head of layer 0 each."""
    return _cands
