"""AcceptanceStats and latency summaries (docs/design.md §4) as specifications."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.stats import AcceptanceStats, distribution, latency_summary, percentile, request_latency


@st.composite
def verifications(draw):
    k = draw(st.integers(0, 8))
    n = draw(st.integers(0, 40))
    rows = []
    for _ in range(n):
        drafted = draw(st.integers(0, k))
        rows.append((draw(st.sampled_from(["a", "b", "c"])), drafted, draw(st.integers(0, drafted))))
    return k, rows


def _stats(k, rows):
    stats = AcceptanceStats(k)
    for rid, drafted, accepted in rows:
        stats.record(rid, drafted, accepted)
    return stats


@settings(max_examples=200, deadline=None)
@given(verifications())
def test_metric_identities_hold_for_any_verifications(case):
    k, rows = case
    m = _stats(k, rows).metrics()
    drafts = [(d, a) for _, d, a in rows if d > 0]
    assert m["num_drafts"] == len(drafts)
    assert m["num_draft_tokens"] == sum(d for d, _ in drafts)
    assert m["num_accepted_tokens"] == sum(a for _, a in drafts)
    if m["num_drafts"]:
        assert math.isclose(m["acceptance_length"], 1 + m["num_accepted_tokens"] / m["num_drafts"])
        assert math.isclose(sum(m["per_position_acceptance"]), m["acceptance_length"] - 1)
        assert math.isclose(m["draft_acceptance_rate"], m["num_accepted_tokens"] / m["num_draft_tokens"])
    else:
        assert m["acceptance_length"] == 1.0 and m["draft_acceptance_rate"] is None
    for counts in (m["accepted_per_position"], m["drafted_per_position"]):
        assert len(counts) == k
        assert all(counts[i] >= counts[i + 1] for i in range(k - 1)), "per-position counts never increase"
    assert all(a <= d for a, d in zip(m["accepted_per_position"], m["drafted_per_position"]))
    hist = m["acceptance_histogram"]
    assert len(hist) == k + 1 and sum(hist) == m["num_drafts"]
    assert sum(j * n for j, n in enumerate(hist)) == m["num_accepted_tokens"]


@settings(max_examples=100, deadline=None)
@given(verifications())
def test_run_counts_are_the_sum_of_per_request_counts(case):
    k, rows = case
    stats = _stats(k, rows)
    per_request = stats.histograms_per_request()
    run_hist = stats.metrics()["acceptance_histogram"]
    assert [sum(h[j] for h in per_request.values()) for j in range(k + 1)] == run_hist
    assert sum(stats.request_metrics(r)["num_drafts"] for r in per_request) == stats.metrics()["num_drafts"]


def test_conditional_acceptance_divides_by_the_previous_position():
    stats = AcceptanceStats(3)
    for accepted in (3, 2, 1, 0):
        stats.record("r", 3, accepted)
    m = stats.metrics()
    assert m["accepted_per_position"] == [3, 2, 1]
    assert m["per_position_acceptance"] == [0.75, 0.5, 0.25]
    assert m["conditional_acceptance"] == [0.75, 2 / 3, 0.5]
    assert m["acceptance_histogram"] == [1, 1, 1, 1]
    assert m["acceptance_length"] == 2.5


def test_undefined_ratios_are_none_not_zero():
    m = AcceptanceStats(2).metrics()
    assert m["per_position_acceptance"] == [None, None]
    assert m["conditional_acceptance"] == [None, None]
    stats = AcceptanceStats(2)
    stats.record("r", 2, 0)
    assert stats.metrics()["conditional_acceptance"] == [0.0, None]


@pytest.mark.parametrize("drafted,accepted", [(3, 0), (2, 3), (-1, 0), (1, -1)])
def test_impossible_verifications_are_rejected(drafted, accepted):
    with pytest.raises(ValueError):
        AcceptanceStats(2).record("r", drafted, accepted)


def test_percentiles_interpolate_linearly():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([], 50) is None
    assert distribution([None, 2.0, 4.0]) == {"mean": 3.0, "p50": 3.0, "p90": 3.8, "p99": pytest.approx(3.98)}


def test_request_latency_splits_first_token_from_the_rest():
    lat = request_latency(arrival_s=10.0, first_token_s=10.1, end_s=10.5, num_output_tokens=5)
    assert {k: v for k, v in lat.items() if k != "queue_ms"} == pytest.approx(
        {"ttft_ms": 100.0, "tpot_ms": 100.0, "e2e_ms": 500.0})
    assert lat["queue_ms"] is None  # not known without the time it was first scheduled
    queued = request_latency(10.0, 10.1, 10.5, 5, scheduled_s=10.04)
    assert queued["queue_ms"] == pytest.approx(40.0) and queued["ttft_ms"] == pytest.approx(100.0)
    assert request_latency(0.0, 0.2, 0.2, 1)["tpot_ms"] is None


def test_latency_summary_reports_throughput_over_the_run():
    reqs = [request_latency(0, 0.1, 1.0, 10), request_latency(1.0, 1.3, 2.0, 10)]
    summary = latency_summary(reqs, num_output_tokens=20, duration_s=2.0)
    assert summary["output_tokens_per_s"] == 10.0
    assert summary["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert set(summary["e2e_ms"]) == {"mean", "p50", "p90", "p99"}
