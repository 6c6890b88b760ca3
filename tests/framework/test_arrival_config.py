"""workload.arrival and its settings: Poisson times that reproduce from the seed at the asked rate, traces read
from JSON lines, one-line errors for bad or missing settings, refusals where a backend cannot serve the process,
and synthetic acceptance in vLLM's forms."""

from __future__ import annotations

import json
import statistics

import pytest
from test_config_checks import refused

from specexp import launch
from specexp.errors import ConfigError
from specexp.run_spec import BACKEND_ARRIVALS
from specexp.specs import WorkloadSpec
from specexp.workloads.arrivals import (
    ArrivalSchedule,
    arrival_schedule,
    check_backend_arrivals,
    poisson_offsets,
    read_trace_offsets,
)

NUM_DRAWS = 2000
RATE_TOLERANCE = 0.05


@pytest.mark.parametrize("rate", [0.5, 8.0, 250.0])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_poisson_arrivals_reproduce_from_the_seed_at_the_asked_rate(rate, seed):
    offsets = poisson_offsets(NUM_DRAWS + 1, rate, seed)
    assert offsets == poisson_offsets(NUM_DRAWS + 1, rate, seed)
    assert offsets != poisson_offsets(NUM_DRAWS + 1, rate, seed + 1)
    assert offsets[0] == 0.0 and all(b >= a for a, b in zip(offsets, offsets[1:]))
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert len(gaps) == NUM_DRAWS
    assert abs(1.0 / statistics.fmean(gaps) - rate) <= RATE_TOLERANCE * rate


def _workload(**values) -> WorkloadSpec:
    return WorkloadSpec(name="code", seed=3, **values)


def test_each_process_gives_its_schedule(tmp_path):
    assert arrival_schedule(_workload(), 4).is_burst
    closed = arrival_schedule(_workload(arrival="concurrency", max_concurrency=2), 4)
    assert (closed.kind, closed.offsets_s, closed.max_concurrency) == ("concurrency", None, 2)
    assert arrival_schedule(_workload(max_concurrency=2), 4) == closed, "a capped burst is the closed loop"
    poisson = arrival_schedule(_workload(arrival="poisson", request_rate=5.0), 4)
    assert poisson.offsets_s == tuple(poisson_offsets(4, 5.0, seed=3)) and poisson.request_rate == 5.0
    trace = tmp_path / "arrivals.jsonl"
    trace.write_text('0.5\n{"arrival_s": 0}\n\n2.25\n9\n')
    schedule = arrival_schedule(_workload(arrival="trace", arrival_path=str(trace)), 3)
    assert schedule == ArrivalSchedule("trace", (0.5, 0.0, 2.25), None)


@pytest.mark.parametrize(("values", "fragments"), [
    ({"arrival": "poisson"}, ["workload.arrival=poisson needs workload.request_rate"]),
    ({"arrival": "concurrency"}, ["needs workload.max_concurrency"]),
    ({"arrival": "trace"}, ["needs workload.arrival_path"]),
    ({"arrival": "burst", "request_rate": 3.0}, ["workload.request_rate=3.0 is set", "workload.arrival=poisson"]),
    ({"arrival": "poisson", "request_rate": 3.0, "arrival_path": "x.jsonl"}, ["arrival_path=x.jsonl is set"]),
    ({"arrival": "poisson", "request_rate": -1.0}, ["workload.request_rate=-1.0", "> 0"]),
    ({"arrival": "sometimes"}, ["workload.arrival='sometimes'", "burst, poisson, concurrency, trace"]),
])
def test_bad_or_missing_settings_are_one_line_errors(values, fragments):
    with pytest.raises(ConfigError) as info:
        arrival_schedule(_workload(**values), 4)
    assert "\n" not in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(("text", "fragment"), [
    ("0.1\n0.2\n", "2 arrival offsets for 3 requests"),
    ("0.1\n-2\n0.3\n", "line 2 is '-2'"),
    ('0.1\n{"t": 1}\n0.3\n', "line 2"),
    ("0.1\nsoon\n0.3\n", "line 2 is 'soon'"),
])
def test_a_bad_trace_is_a_one_line_error(tmp_path, text, fragment):
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        read_trace_offsets(path, 3)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_trace_offsets(tmp_path / "missing.jsonl", 3)


def test_backends_name_the_arrivals_they_serve():
    check_backend_arrivals("vllm", ArrivalSchedule("concurrency", None, 4), BACKEND_ARRIVALS["vllm"])
    with pytest.raises(ConfigError) as info:
        check_backend_arrivals("vllm", ArrivalSchedule("poisson", (0.0,), None, 2.0), BACKEND_ARRIVALS["vllm"])
    assert str(info.value) == ("workload.arrival=poisson is not supported by backend vllm: it serves"
                               " workload.arrival=burst, concurrency")
    refused(["backend=hf", "workload.arrival=concurrency", "workload.max_concurrency=2"],
            "workload.arrival=concurrency is not supported by backend hf", "burst")


def test_a_run_carries_its_arrivals_and_slo_without_a_plus():
    plan = launch.plan_run(["run", "+exp=quickstart", "tracking=disabled", "workload.num_prompts=3",
                            "workload.arrival=poisson", "workload.request_rate=4", "slo.ttft_ms=200"])
    spec = plan.jobs[0].spec
    assert spec.arrivals.kind == "poisson" and len(spec.arrivals.offsets_s) == 3
    assert spec.slo.ttft_ms == 200 and spec.slo.tpot_ms is None
    refused(["slo.tpot_ms=-5"], "slo.tpot_ms=-5", "> 0")


def test_multi_turn_prompts_need_a_burst(tmp_path):
    questions = tmp_path / "question.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Hi", "More"]}) + "\n")
    refused(["+exp=quickstart", "workload=mtbench", f"workload.path={questions}", "workload.arrival=concurrency",
             "workload.max_concurrency=2"], "needs single-turn prompts", "'1' has 2 turns")


# ------------------------------------------------------------------------------- synthetic acceptance


def test_synthetic_acceptance_is_plain_config_in_every_form():
    base = ["+exp=quickstart", "tracking=disabled", "workload.num_prompts=1", "speculator.rejection=synthetic"]
    for form in ("speculator.synthetic_acceptance_rates=[0.9,0.5,0.5,0.1]",
                 "speculator.synthetic_acceptance_length=2.5", "speculator.synthetic_acceptance_rate=0.6"):
        launch.plan_run(["run", *base, form])


@pytest.mark.parametrize(("override", "fragments"), [
    ("speculator.synthetic_acceptance_rates=[0.9,0.5]", ["has 2 entries", "4 (speculator.num_speculative_tokens)"]),
    ("speculator.synthetic_acceptance_rates=[0.5,0.9,0.1,0.1]", ["increases", "unconditional"]),
    ("speculator.synthetic_acceptance_rates=[1.5,0.5,0.1,0.1]", ["synthetic_acceptance_rates=[1.5", "[0, 1]"]),
    ("speculator.synthetic_acceptance_length=6", ["synthetic_acceptance_length=6", "[1, 5]"]),
    ("speculator.synthetic_acceptance_length=0.5", ["synthetic_acceptance_length=0.5", ">= 1"]),
])
def test_bad_synthetic_acceptance_is_a_one_line_error(override, fragments):
    refused(["speculator.rejection=synthetic", "speculator.num_speculative_tokens=4", override], *fragments)


def test_synthetic_forms_need_synthetic_rejection_and_one_form():
    refused(["speculator.synthetic_acceptance_length=2"], "speculator.rejection='standard'",
            "speculator.rejection=synthetic")
    refused(["speculator.rejection=synthetic", "speculator.num_speculative_tokens=2",
             "speculator.synthetic_acceptance_length=2", "speculator.synthetic_acceptance_rates=[0.5,0.5]"],
            "both set")
