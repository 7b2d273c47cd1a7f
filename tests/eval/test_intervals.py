"""Bootstrap intervals: they hold the value, shrink with more windows, cover the truth about as
often as they claim, and keep windows paired."""

import numpy as np
import pytest

from dustin_eval.intervals import bootstrap, mean, ppl_ratio, ratio_of_sums


def test_interval_holds_the_value_and_shrinks_with_windows():
    rng = np.random.default_rng(0)
    widths = []
    for n in (8, 32, 128):
        x = rng.normal(1.0, 0.2, n)
        v, lo, hi = bootstrap(mean, x, resamples=2000)
        assert lo <= v <= hi and v == pytest.approx(x.mean())
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    assert widths[2] == pytest.approx(2 * 1.96 * 0.2 / np.sqrt(128), rel=0.25)  # the normal-theory width


def test_coverage_is_near_the_level():
    rng = np.random.default_rng(1)
    hits, trials = 0, 200
    for t in range(trials):
        x = rng.exponential(1.0, 40)  # skewed, true mean 1
        _, lo, hi = bootstrap(mean, x, resamples=800, seed=t)
        hits += lo <= 1.0 <= hi
    assert 0.88 <= hits / trials <= 0.99  # percentile bootstrap at n = 40: a little under 95%


def test_pairing_cancels_what_windows_share():
    """Windows of very different difficulty: a policy 2% worse on every window has a tight ratio
    interval because each resample draws the same windows for both."""
    rng = np.random.default_rng(2)
    tokens = np.full(16, 1000.0)
    nll_full = rng.uniform(2.0, 4.0, 16) * tokens  # mean NLL per token differs a lot between windows
    nll_pol = nll_full + np.log(1.02) * tokens
    v, lo, hi = bootstrap(ppl_ratio, nll_pol, tokens, nll_full, tokens)
    assert v == pytest.approx(1.02) and hi - lo < 1e-9
    unpaired = bootstrap(lambda a, t: float(np.exp(a.sum() / t.sum())), nll_pol, tokens)
    assert unpaired[2] - unpaired[1] > 0.1


def test_ratio_of_sums_and_bad_input():
    assert ratio_of_sums(np.array([1.0, 3.0]), np.array([2.0, 2.0])) == 1.0
    with pytest.raises(ValueError):
        bootstrap(mean, [])
    with pytest.raises(ValueError):
        bootstrap(ratio_of_sums, [1.0, 2.0], [1.0])


def test_groups_resample_books_not_windows():
    """Four identical windows per book are one book's worth of evidence: resampling books gives the
    interval of the 8 books' values (draw for draw), far wider than treating the 32 windows as
    independent; one window a group is the plain bootstrap exactly."""
    rng = np.random.default_rng(3)
    books = rng.normal(1.0, 0.2, 8)
    windows = np.repeat(books, 4)
    labels = [f"book{i}" for i in range(8) for _ in range(4)]
    v, lo, hi = bootstrap(mean, windows, groups=labels, resamples=1000)
    v8, lo8, hi8 = bootstrap(mean, books, resamples=1000)
    assert (v, lo, hi) == pytest.approx((v8, lo8, hi8), abs=1e-12)
    _, lo32, hi32 = bootstrap(mean, windows, resamples=1000)
    assert hi - lo > 1.6 * (hi32 - lo32)  # sqrt(4) = 2 in theory
    x = rng.normal(0.0, 1.0, 12)
    assert bootstrap(mean, x, groups=[f"g{i}" for i in range(12)]) == bootstrap(mean, x)
    with pytest.raises(ValueError):
        bootstrap(mean, x, groups=["a"] * 11)
