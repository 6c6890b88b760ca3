"""Leviathan's formulas and the α / c estimators (specexp.analysis.theory)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from analysis_records import synthetic_record, synthetic_steps

from specexp.analysis import load_runs
from specexp.analysis.theory import (
    acceptance_trials,
    best_k,
    expected_acceptance_length,
    expected_speedup,
    fit_alpha,
    fit_theory,
    with_theory,
)


@pytest.mark.parametrize(
    "alpha, k, expected",
    [(0.8, 4, (1 - 0.8**5) / 0.2), (0.5, 1, 1.5), (0.5, 3, 1.875), (0.0, 5, 1.0), (0.9, 0, 1.0), (1.0, 6, 7.0)],
)
def test_expected_acceptance_length_is_the_geometric_sum(alpha, k, expected):
    assert expected_acceptance_length(alpha, k) == pytest.approx(expected)
    assert expected_acceptance_length(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))


def test_expected_speedup_at_known_alpha_and_c():
    # (1 - 0.8^5) / ((1 - 0.8)(4 * 0.1 + 1)) = 3.3616 / 1.4
    assert expected_speedup(0.8, 0.1, 4) == pytest.approx(3.3616 / 1.4)
    assert expected_speedup(0.6, 0.5, 0) == pytest.approx(1.0)
    assert expected_speedup(1.0, 0.0, 8) == pytest.approx(9.0)
    # a measured verify cost replaces the 1 in the denominator
    assert expected_speedup(0.8, 0.1, 4, verify_cost=1.6) == pytest.approx(3.3616 / 2.0)


def test_best_k_maximises_the_expected_speedup():
    for alpha, c in [(0.8, 0.05), (0.6, 0.2), (0.9, 0.01), (0.3, 0.5)]:
        k = best_k(alpha, c, k_max=16)
        values = [expected_speedup(alpha, c, j) for j in range(17)]
        assert values[k] == pytest.approx(max(values))
    assert best_k(0.1, 1.0) == 0  # a slow, bad draft: do not speculate
    assert best_k(math.nan, 0.1) is None


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.95])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_alpha_estimate_is_exact_on_expected_geometric_counts(alpha, k):
    n = 10_000
    accepted = [n * alpha ** (i + 1) for i in range(k)]
    successes, trials = acceptance_trials(accepted, [n] * k, n)
    assert successes / trials == pytest.approx(alpha)


def test_alpha_estimate_counts_only_positions_a_short_draft_proposed():
    # 10 drafts of depth 2, all accepted, and 10 drafts cut to depth 1, all accepted: α = 1, not less.
    successes, trials = acceptance_trials(accepted=[20, 10], drafted=[20, 10], num_drafts=20)
    assert successes == trials == 30


def test_fit_alpha_recovers_the_acceptance_rate_of_simulated_runs(write_run, tmp_path):
    for k in (1, 2, 4, 8):
        write_run(f"s/{k}", synthetic_record(k, alpha=0.75, drafts_per_request=2000))
    alpha, trials = fit_alpha(load_runs(tmp_path / "runs"))
    assert alpha == pytest.approx(0.75, abs=0.01)
    assert trials > 10_000


def test_cost_ratio_is_draft_forward_time_over_plain_target_step(write_run, tmp_path):
    for k in (0, 1, 2, 4):
        write_run(f"s/{k}", synthetic_record(k), synthetic_steps(k, draft_forward_ms=2.0, verify_ms=10.0))
    fits = fit_theory(load_runs(tmp_path / "runs"))
    assert len(fits) == 1
    fit = fits.iloc[0]
    assert fit["c"] == pytest.approx(0.2)  # 2 ms per draft forward / 10 ms per target decode step
    assert fit["target_step_ms"] == pytest.approx(10.0)  # prefill step (99 ms) excluded
    assert fit["c_source"] == "decode steps"
    assert fit["best_k_theory"] == best_k(fit["alpha"], 0.2)


def test_cost_ratio_falls_back_to_run_level_means_without_steps(write_run, tmp_path):
    for k in (0, 2):
        write_run(f"s/{k}", synthetic_record(k))  # draft_ms.mean = k ms, verify_ms.mean = 10 ms
    fit = fit_theory(load_runs(tmp_path / "runs")).iloc[0]
    assert fit["c"] == pytest.approx(0.1)
    assert fit["c_source"] == "all steps"


def test_with_theory_gives_theory_at_each_runs_k(write_run, tmp_path):
    for k in (0, 1, 3):
        write_run(f"s/{k}", synthetic_record(k), synthetic_steps(k, verify_ms=10.0 + k))
    table = with_theory(load_runs(tmp_path / "runs")).set_index("k")
    alpha, c = table.loc[3, "alpha"], table.loc[3, "c"]
    assert table.loc[3, "theory_acceptance_length"] == pytest.approx(expected_acceptance_length(alpha, 3))
    assert table.loc[3, "theory_speedup"] == pytest.approx(expected_speedup(alpha, c, 3))
    assert table.loc[3, "verify_cost_ratio"] == pytest.approx(13.0 / 10.0)
    assert table.loc[3, "theory_speedup_verify_cost"] == pytest.approx(expected_speedup(alpha, c, 3, 1.3))
    assert table.loc[0, "theory_speedup"] == pytest.approx(1.0)
    assert isinstance(table, pd.DataFrame)
