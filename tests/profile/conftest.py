"""Fixtures of the profiler tests: a tiny target/draft pair with the Llama-3 tokenizer, and a
calibration text."""

import random
import shutil

import pytest

from tests.conftest import make_tiny_hf

WORDS = ("the river house morning letter captain garden silver window quiet road winter mother ship "
         "door answer across never little stone between under light voice long").split()


def tiny_pair(root, shared):
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
def models(tmp_path_factory, shared_dir):
    return tiny_pair(tmp_path_factory.mktemp("profile-models"), shared_dir)


@pytest.fixture(scope="session")
def calib_text(tmp_path_factory):
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    path = tmp_path_factory.mktemp("calib") / "book.txt"
    path.write_text("\n".join(lines))
    return path
