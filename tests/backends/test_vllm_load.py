"""Backend vllm under load, without vLLM: a closed loop becomes vLLM's max_num_seqs and its latencies count from
the first scheduling, synthetic acceptance becomes vLLM's per-position rates, and the arrivals vLLM cannot
serve are refused with one line naming those it can."""

from __future__ import annotations

import pytest
from test_vllm_backend import RequestMetrics, RequestStateStats, make_spec

from specexp.backends import vllm as backend
from specexp.backends.vllm_load import closed_loop_latency
from specexp.errors import ConfigError
from specexp.run_spec import BACKEND_ARRIVALS
from specexp.workloads.arrivals import ArrivalSchedule, check_backend_arrivals


def _with(spec, arrivals=None, **speculator_options):
    spec.arrivals = arrivals
    spec.speculator.options.update(speculator_options)
    return spec


def test_a_closed_loop_is_vllms_batch_limit():
    spec = _with(make_spec(k=2), ArrivalSchedule("concurrency", None, 4))
    assert backend.llm_kwargs(spec)["max_num_seqs"] == 4
    assert backend.llm_kwargs(_with(make_spec(k=2), ArrivalSchedule("burst")))["max_num_seqs"] == 16


@pytest.mark.parametrize(("options", "rates"), [
    ({"synthetic_acceptance_rate": 0.5}, [0.5, 0.25, 0.125]),
    ({"synthetic_acceptance_rates": [0.9, 0.4, 0.4]}, [0.9, 0.4, 0.4]),
    ({"synthetic_acceptance_length": 2.5}, [1.0, 0.5, 0.0]),
])
def test_synthetic_acceptance_reaches_vllm_as_per_position_rates(options, rates):
    kwargs = backend.llm_kwargs(_with(make_spec(k=3), rejection="synthetic", **options))
    speculative = kwargs["speculative_config"]
    assert speculative["rejection_sample_method"] == "synthetic"
    assert speculative["synthetic_acceptance_rates"] == pytest.approx(rates)


def test_standard_rejection_leaves_vllms_sampler_alone():
    speculative = backend.llm_kwargs(_with(make_spec(k=3)))["speculative_config"]
    assert "rejection_sample_method" not in speculative and "synthetic_acceptance_rates" not in speculative


def test_closed_loop_latencies_count_from_the_first_scheduling():
    v1 = RequestStateStats(arrival_time=100.0, queued_ts=10.0, scheduled_ts=12.0, first_token_ts=12.25,
                           last_token_ts=13.25, first_token_latency=2.25)
    latency = closed_loop_latency(v1, num_output_tokens=5)
    assert latency == pytest.approx({"ttft_ms": 250.0, "tpot_ms": 250.0, "e2e_ms": 1250.0, "queue_ms": 0.0})
    v0 = RequestMetrics(arrival_time=1.0, last_token_time=3.0, first_scheduled_time=2.0, first_token_time=2.5,
                        time_in_queue=1.0, finished_time=3.0)
    assert closed_loop_latency(v0, 3)["ttft_ms"] == pytest.approx(500.0)
    assert closed_loop_latency(RequestStateStats(), 3)["ttft_ms"] is None


@pytest.mark.parametrize("kind", ["poisson", "trace"])
def test_open_loop_arrivals_are_refused_naming_the_ones_vllm_serves(kind):
    with pytest.raises(ConfigError) as info:
        check_backend_arrivals("vllm", ArrivalSchedule(kind, (0.0, 0.1)), BACKEND_ARRIVALS["vllm"])
    assert str(info.value) == (f"workload.arrival={kind} is not supported by backend vllm: it serves"
                               " workload.arrival=burst, concurrency")
