"""SamplingConfig refuses what would decode garbage (token 0 over and over): negative or
non-finite temperatures, top-p outside (0, 1]."""

import math

import pytest

from dustin_runtime.errors import DustinError
from dustin_runtime.sampling import SamplingConfig


@pytest.mark.parametrize("t", [-1.0, -1e-9, math.nan, math.inf, "0.5", True])
def test_bad_temperature(t):
    with pytest.raises(DustinError, match="temperature must be a finite number >= 0"):
        SamplingConfig(temperature=t)


@pytest.mark.parametrize("p", [0.0, -0.5, 1.5, 1.0000001, math.nan, math.inf, None])
def test_bad_top_p(p):
    with pytest.raises(DustinError, match=r"top-p must be in \(0, 1\]"):
        SamplingConfig(temperature=1.0, top_p=p)


def test_valid_settings():
    assert SamplingConfig(0.0).greedy and SamplingConfig(0).greedy  # temperature 0 = greedy stays valid
    assert not SamplingConfig(0.7, top_p=1e-6).greedy
    assert SamplingConfig(2, top_p=1).top_p == 1
