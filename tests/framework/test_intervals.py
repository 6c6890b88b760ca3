"""Intervals are honest: deterministic for a seed, and covering the known value of synthetic cases at about
the stated 95% (at least 90 of 100 seeded draws). Fast: numpy only, no model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specexp.engine.stats import AcceptanceCounts
from specexp.measure.intervals import (
    acceptance_figures,
    bootstrap_acceptance,
    bootstrap_ratio,
    ratio_interval,
    repeat_summary,
    t_quantile_975,
)

DRAWS = 100
K = 4


def geometric_histograms(rng: np.random.Generator, alphas: np.ndarray, drafts_per_request: int) -> list[list[int]]:
    """One acceptance histogram per request: each draft accepts token by token with the request's α, up to K."""
    histograms = []
    for alpha in alphas:
        accepted = np.minimum(rng.geometric(1 - alpha, size=drafts_per_request) - 1, K)
        histograms.append(np.bincount(accepted, minlength=K + 1).tolist())
    return histograms


def beta_moment(a: float, b: float, j: int) -> float:
    """E[α^j] for α ~ Beta(a, b)."""
    return math.prod((a + t) / (a + b + t) for t in range(j))


@pytest.mark.parametrize("df", [1, 2, 3, 7, 30, 120])
def test_t_quantile_matches_students_t_at_whole_degrees_of_freedom(df):
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-6)


@given(st.floats(min_value=1.0, max_value=1e4))
def test_t_quantile_matches_students_t_at_any_degrees_of_freedom(df):
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-6)


def test_one_repeat_has_a_mean_and_no_interval():
    assert repeat_summary([5.0, None]) == {"mean": 5.0, "std": None, "low": None, "high": None, "n": 1}
    assert repeat_summary([]) == {"mean": None, "std": None, "low": None, "high": None, "n": 0}


def test_the_repeat_interval_covers_the_true_mean_at_about_95_percent():
    rng = np.random.Generator(np.random.PCG64(1))
    covered = 0
    for _ in range(DRAWS):
        s = repeat_summary(rng.normal(100.0, 7.0, size=3).tolist())
        covered += s["low"] <= 100.0 <= s["high"]
    assert covered >= 90


def test_the_speedup_interval_covers_the_true_ratio_at_about_95_percent():
    rng = np.random.Generator(np.random.PCG64(2))
    covered = 0
    for _ in range(DRAWS):
        speculative, baseline = rng.normal(150.0, 9.0, size=3), rng.normal(100.0, 6.0, size=3)
        r = ratio_interval(speculative.tolist(), baseline.tolist())
        assert r["value"] == pytest.approx(speculative.mean() / baseline.mean())
        covered += r["low"] <= 1.5 <= r["high"]
    assert covered >= 90


def test_a_speedup_with_a_single_repeat_on_either_side_has_no_interval():
    r = ratio_interval([120.0], [100.0, 101.0])
    assert r["value"] == pytest.approx(120 / 100.5) and r["low"] is None and r["high"] is None


def test_the_bootstrap_is_deterministic_for_a_seed():
    histograms = geometric_histograms(np.random.Generator(np.random.PCG64(3)), np.full(12, 0.6), 15)
    first, again = bootstrap_acceptance(histograms, seed=7), bootstrap_acceptance(histograms, seed=7)
    assert first == again
    other = bootstrap_acceptance(histograms, seed=8)
    assert other["acceptance_length"] != first["acceptance_length"]
    assert first["unit"] == "request" and first["num_requests"] == 12 and first["resamples"] == 1000


def test_the_bootstrap_covers_the_known_acceptance_length_at_about_95_percent():
    """Requests differ (α ~ Beta(6, 4) per request), every request has 20 drafts: the population acceptance
    length is 1 + Σ_j E[α^j], j = 1..K (truncated geometric), which each seeded interval should cover."""
    a, b = 6.0, 4.0
    known = 1 + sum(beta_moment(a, b, j) for j in range(1, K + 1))
    data = np.random.Generator(np.random.PCG64(4))
    covered = 0
    for draw in range(DRAWS):
        histograms = geometric_histograms(data, data.beta(a, b, size=40), 20)
        bounds = bootstrap_acceptance(histograms, seed=draw, resamples=500)["acceptance_length"]
        covered += bounds["low"] <= known <= bounds["high"]
    assert covered >= 90


def test_the_bootstrap_covers_the_known_per_position_acceptance_at_about_95_percent():
    a, b = 6.0, 4.0
    known = [beta_moment(a, b, i + 1) for i in range(K)]  # P(positions 1..i+1 accepted)
    data = np.random.Generator(np.random.PCG64(5))
    covered = np.zeros(K)
    for draw in range(DRAWS):
        histograms = geometric_histograms(data, data.beta(a, b, size=40), 20)
        bounds = bootstrap_acceptance(histograms, seed=draw, resamples=500)["per_position_acceptance"]
        covered += [lo <= v <= hi for lo, hi, v in zip(bounds["low"], bounds["high"], known)]
    assert (covered >= 90).all(), covered


def test_the_ratio_bootstrap_covers_the_known_rate_at_about_95_percent():
    data = np.random.Generator(np.random.PCG64(6))
    covered = 0
    for draw in range(DRAWS):
        trials = data.integers(20, 60, size=30)
        successes = data.binomial(trials, data.beta(7, 3, size=30))
        r = bootstrap_ratio(successes, trials, seed=draw, resamples=500)
        covered += r["low"] <= 0.7 <= r["high"]
    assert covered >= 90


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, K), st.integers(0, K)), max_size=6), min_size=1, max_size=5))
def test_pooled_histograms_give_the_engine_counters_acceptance_figures(requests):
    """The bootstrap recomputes acceptance from per-request histograms exactly as AcceptanceCounts does."""
    total = AcceptanceCounts(K)
    histograms = []
    for verifications in requests:
        counts = AcceptanceCounts(K)
        for drafted, accepted in verifications:
            counts.add(drafted, min(accepted, drafted))
        total.merge(counts)
        histograms.append(counts.acceptance_histogram)
    at_least = np.cumsum(np.asarray(histograms, dtype=float)[:, ::-1], axis=1)[:, ::-1].sum(axis=0)
    figures = acceptance_figures(at_least)
    expected = total.metrics()
    assert figures["acceptance_length"] == pytest.approx(expected["acceptance_length"]) or not expected["num_drafts"]
    for name in ("per_position_acceptance", "conditional_acceptance"):
        want = [math.nan if v is None else v for v in expected[name]]
        assert np.allclose(figures[name], want, equal_nan=True)
