"""benchmarks/leviathan.py: the speedup formula and the one-baseline rule of the end-to-end tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from leviathan import add_theory, count_within, leviathan_speedup


def test_formula_is_expected_tokens_over_step_cost():
    assert leviathan_speedup(0.8, 0, 0.3) == pytest.approx(1.0)
    assert leviathan_speedup(0.8, 2, 0.0) == pytest.approx(1 + 0.8 + 0.64)  # free draft: expected tokens per step
    assert leviathan_speedup(0.6, 3, 0.25) == pytest.approx((1 + 0.6 + 0.36 + 0.216) / 1.75)


def test_speedups_share_one_baseline_over_every_k0_run():
    rows = [{"k": 0, "acceptance_rate": 0.6, "output_tokens_per_s": 400.0, "output_tokens_per_s_runs": [300, 400, 410]},
            {"k": 0, "acceptance_rate": 0.8, "output_tokens_per_s": 420.0, "output_tokens_per_s_runs": [420, 430, 440]},
            {"k": 2, "acceptance_rate": 0.6, "output_tokens_per_s": 500.0, "output_tokens_per_s_runs": [500]},
            {"k": 2, "acceptance_rate": None, "output_tokens_per_s": 600.0}]
    add_theory(rows, c=0.2)
    base = 415.0  # the median of all six k = 0 runs, whichever rate their row names
    assert [r["speedup"] for r in rows] == pytest.approx([400 / base, 420 / base, 500 / base, 600 / base])
    assert rows[2]["theory_speedup"] == pytest.approx(leviathan_speedup(0.6, 2, 0.2))
    assert rows[2]["within_15pct_of_theory"] == (abs(rows[2]["speedup"] / rows[2]["theory_speedup"] - 1) <= 0.15)
    assert rows[0]["within_15pct_of_theory"] is None  # the baseline's own runs: nothing predicted
    assert "theory_speedup" not in rows[3]  # real acceptance: no synthetic rate to predict from


def test_each_row_splits_the_formula_into_tokens_per_step_and_step_cost():
    rows = [{"k": 0, "acceptance_rate": 0.8, "output_tokens_per_s": 500.0, "step_ms_p50": 1.0},
            {"k": 0, "acceptance_rate": 0.6, "output_tokens_per_s": 500.0, "step_ms_p50": 1.4},
            {"k": 3, "acceptance_rate": 0.8, "output_tokens_per_s": 800.0, "step_ms_p50": 2.4},
            {"k": 2, "acceptance_rate": 0.8, "output_tokens_per_s": 700.0}]  # an older row without step times
    add_theory(rows, c=0.3)
    k3 = rows[2]
    assert k3["theory_acceptance_length"] == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert k3["step_cost_in_plain_steps"] == pytest.approx(2.4 / 1.2)  # over the median k = 0 step
    assert k3["theory_step_cost_in_plain_steps"] == pytest.approx(3 * 0.3 + 1)
    # the formula is exactly the ratio of its two predicted factors
    assert k3["theory_speedup"] == pytest.approx(k3["theory_acceptance_length"] / k3["theory_step_cost_in_plain_steps"])
    assert "step_cost_in_plain_steps" not in rows[3]


def test_step_cost_splits_into_the_verify_and_the_draft_per_token():
    rows = [{"k": 0, "acceptance_rate": 0.8, "output_tokens_per_s": 500.0, "step_ms_p50": 1.0,
             "verify_ms_p50": 0.98, "draft_ms_p50": 0.0},
            {"k": 2, "acceptance_rate": 0.8, "output_tokens_per_s": 700.0, "step_ms_p50": 2.0,
             "verify_ms_p50": 1.2, "draft_ms_p50": 0.76}]
    add_theory(rows, c=0.3)
    k2 = rows[1]
    assert k2["verify_cost_in_plain_steps"] == pytest.approx(1.2)  # the formula prices it at 1
    assert k2["draft_cost_per_token_in_plain_steps"] == pytest.approx(0.38)  # ... and this at c = 0.3
    assert rows[0]["verify_cost_in_plain_steps"] == pytest.approx(0.98)
    assert "draft_cost_per_token_in_plain_steps" not in rows[0]


def test_decode_phase_speedup_leaves_out_the_prefill_steps():
    """With a draft the prompt's prefill step costs more (its eager prefill joins the target's): the decode phase
    alone is a request's wall time less its prefill steps."""
    def row(k, wall_ms, prefill_ms, tps):
        return {"k": k, "acceptance_rate": 0.8, "output_tokens_per_s": tps, "wall_ms_per_request": wall_ms,
                "prefill_steps_per_request": 1.0, "prefill_step_ms_mean": prefill_ms}
    rows = [row(0, 136.0, 16.0, 940.0), row(0, 134.0, 14.0, 955.0), row(2, 158.0, 32.0, 810.0),
            {"k": 1, "acceptance_rate": 0.8, "output_tokens_per_s": 800.0}]  # an older row: no step times
    add_theory(rows, c=0.66)
    k2 = rows[2]
    assert k2["decode_ms_per_request"] == pytest.approx(126.0)
    assert k2["decode_speedup"] == pytest.approx(120.0 / 126.0)  # over the k = 0 rows' median decode phase
    assert k2["decode_within_15pct_of_theory"] == (abs(120.0 / 126.0 / leviathan_speedup(0.8, 2, 0.66) - 1) <= 0.15)
    assert rows[0]["decode_within_15pct_of_theory"] is None
    assert "decode_speedup" not in rows[3] and "decode_within_15pct_of_theory" not in rows[3]


def test_count_within_rechecks_the_rows_at_another_cost_ratio():
    rows = [{"k": 0, "acceptance_rate": 0.8, "output_tokens_per_s": 100.0},
            {"k": 1, "acceptance_rate": 0.8, "output_tokens_per_s": 100.0 * leviathan_speedup(0.8, 1, 0.4)},
            {"k": 4, "acceptance_rate": 0.8, "output_tokens_per_s": 100.0 * leviathan_speedup(0.8, 4, 0.4)},
            {"k": 2, "acceptance_rate": None, "output_tokens_per_s": 150.0}]
    add_theory(rows, c=0.4)
    assert count_within(rows, 0.4) == (2, 2)  # exactly the formula at the c it was built with; k = 0 and
    # measured-acceptance rows are not points
    # at a cheaper draft the formula promises more: 8% more at k = 1 (still within), 18% at k = 4 (outside)
    assert leviathan_speedup(0.8, 1, 0.3) / leviathan_speedup(0.8, 1, 0.4) == pytest.approx(1.4 / 1.3)
    assert leviathan_speedup(0.8, 4, 0.3) / leviathan_speedup(0.8, 4, 0.4) == pytest.approx(2.6 / 2.2)
    assert count_within(rows, 0.3) == (1, 2)
