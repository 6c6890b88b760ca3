"""Load metrics of a run: throughput per run and per user, goodput under SLOs, batch occupancy and the
verification's share of step time (specexp.load_metrics), on hand-built records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specexp.load_metrics import LoadSettings, load_metrics, meets_slo, verify_share
from specexp.result import RequestOutput, StepRecord


def _request(ttft_ms, tpot_ms, num_output=4, num_prompt=3) -> RequestOutput:
    return RequestOutput(prompt_id="p", prompt="", prompt_token_ids=[1] * num_prompt,
                         output_token_ids=[5] * num_output, output_text="", ttft_ms=ttft_ms, tpot_ms=tpot_ms)


def _step(num_reqs, schedule=1.0, verify=6.0, sample=1.0, draft=2.0) -> StepRecord:
    return StepRecord(step=0, num_reqs=num_reqs, num_tokens=num_reqs, schedule_ms=schedule, verify_ms=verify,
                      sample_ms=sample, draft_ms=draft)


def test_throughput_per_run_and_per_user():
    requests = [_request(100.0, 10.0), _request(300.0, 20.0, num_output=1)]
    m = load_metrics(requests, [_step(2)], duration_s=2.0, settings=LoadSettings(max_num_seqs=8))
    assert m["requests_per_s"] == 1.0
    assert m["total_tokens_per_s"] == (3 + 4 + 3 + 1) / 2.0
    assert m["tokens_per_s_per_user"]["mean"] == pytest.approx((100.0 + 50.0) / 2)
    assert m["goodput_requests_per_s"] is None and m["num_good_requests"] is None  # no SLO, no goodput


def test_goodput_counts_requests_meeting_both_objectives():
    requests = [_request(100.0, 10.0), _request(300.0, 10.0), _request(100.0, 30.0), _request(150.0, None, 1)]
    settings = LoadSettings(max_num_seqs=4, slo_ttft_ms=200.0, slo_tpot_ms=20.0)
    m = load_metrics(requests, [], duration_s=4.0, settings=settings)
    assert m["num_good_requests"] == 2  # the first, and the one-token request (no TPOT to miss)
    assert m["goodput_requests_per_s"] == 0.5
    assert m["batch_occupancy"] is None and m["verify_share"] is None  # no steps seen (vLLM)
    assert not meets_slo(None, 1.0, settings)


def test_occupancy_and_verify_share_per_step():
    steps = [_step(2), _step(4, schedule=0.0, verify=3.0, sample=1.0, draft=0.0), _step(4, verify=None)]
    m = load_metrics([_request(1.0, 1.0)], steps, 1.0, LoadSettings(max_num_seqs=4))
    assert m["batch_occupancy"]["mean"] == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    assert m["num_reqs_per_step"]["p50"] == 4
    assert m["verify_share"]["mean"] == pytest.approx((0.7 + 1.0) / 2)  # the step without times is left out


@given(st.lists(st.floats(0, 50), min_size=4, max_size=4))
def test_verify_share_is_a_share(phases):
    share = verify_share(_step(1, *phases))
    assert share is None if sum(phases) == 0 else 0.0 <= share <= 1.0
