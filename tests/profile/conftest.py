"""Fixtures of the profiler tests: a tiny target/draft pair with the Llama-3 tokenizer, and a
calibration text."""

import random

import pytest

WORDS = ("the river house morning letter captain garden silver window quiet road winter mother ship "
         "door answer across never little stone between under light voice long").split()


@pytest.fixture(scope="session")
def models(tiny_models):
    return tiny_models


@pytest.fixture(scope="session")
def calib_text(tmp_path_factory):
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)]
    path = tmp_path_factory.mktemp("calib") / "book.txt"
    path.write_text("\n".join(lines))
    return path
