"""What a backend returns: :class:`RunResult` = per-request outputs + per-step rows + §4 metrics.

Backends fill :class:`RequestOutput` and :class:`StepRecord` and call :func:`run_metrics` once at the end;
the app layer adds status/config/env and writes the run record (docs/design.md §5). Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specexp.engine.stats import LATENCY_KEYS, AcceptanceStats, distribution, latency_summary

# Graph-capture metrics (§4) are None, never 0, where nothing was captured (CPU, or the hf backend).
GRAPH_METRIC_KEYS = ("graph_capture_bytes", "graph_capture_s", "graph_capture_per_size", "persistent_buffer_bytes")
STEP_TIME_KEYS = ("draft_ms", "verify_ms", "sample_ms", "schedule_ms", "step_ms")


@dataclass
class RequestOutput:
    """One request's result. Token ids are target-tokenizer ids; times are milliseconds, counted from the
    request's arrival on every backend (``queue_ms``: arrival -> first scheduled, part of ``ttft_ms``).

    ``accept_lengths[s]`` = tokens the request emitted at its s-th verification step (accepted drafts + the
    bonus/correction token); it sums to ``len(output_token_ids)`` and is what Spec-Bench calls accept_lengths.
    """

    prompt_id: str
    prompt: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_text: str
    category: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    queue_ms: float | None = None
    accept_lengths: list[int] = field(default_factory=list)

    def to_row(self) -> dict:
        """The outputs.jsonl line (§5) for this request."""
        return dataclasses.asdict(self)


@dataclass
class StepRecord:
    """One engine step (one row of steps.parquet). Times in milliseconds, ``None`` where not measured.

    ``num_tokens``: tokens the target processed in the step (prefill tokens + k+1 per verifying request);
    ``num_drafts``: requests in the step that carried >= 1 draft token. ``request_id`` is set by backends
    that run one request at a time (hf), ``None`` for batched steps. The native engine's steps that replay a
    verify graph sample inside it: their ``sample_ms`` is 0 and ``verify_ms`` includes the sampling.
    """

    step: int
    num_reqs: int
    num_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_output_tokens: int = 0
    draft_ms: float | None = None
    verify_ms: float | None = None
    sample_ms: float | None = None
    schedule_ms: float | None = None
    step_ms: float | None = None
    request_id: str | None = None


@dataclass
class RunResult:
    """Everything a backend measured. ``metrics`` holds the §4 metrics (see :func:`run_metrics`);
    ``env`` holds backend facts worth recording (e.g. ``{"device": "cuda:0", "gpu": "NVIDIA H200"}``)."""

    requests: list[RequestOutput]
    steps: list[StepRecord]
    metrics: dict
    env: dict = field(default_factory=dict)


def run_metrics(
    acceptance: AcceptanceStats,
    requests: list[RequestOutput],
    steps: list[StepRecord],
    duration_s: float,
    graph: dict | None = None,
) -> dict:
    """All §4 metrics of a run as one JSON-ready dict.

    ``duration_s``: wall time of the generation phase (model loading and warm-up excluded), used for
    ``output_tokens_per_s``. ``graph``: graph-capture metrics (keys of ``GRAPH_METRIC_KEYS``); missing ones
    are ``None``. Step timings are summarised per step as ``{"mean","p50","p90","p99"}``.
    """
    num_output_tokens = sum(len(r.output_token_ids) for r in requests)
    latencies = [{key: getattr(r, key) for key in LATENCY_KEYS} for r in requests]
    metrics = {
        "num_speculative_tokens": acceptance.num_speculative_tokens,
        **acceptance.metrics(),
        "acceptance_histogram_per_request": acceptance.histograms_per_request(),
        "num_requests": len(requests),
        "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "num_output_tokens": num_output_tokens,
        "num_steps": len(steps),
        "duration_s": duration_s,
        **latency_summary(latencies, num_output_tokens, duration_s),
        **{key: distribution([getattr(s, key) for s in steps]) for key in STEP_TIME_KEYS},
    }
    metrics.update({key: (graph or {}).get(key) for key in GRAPH_METRIC_KEYS})
    return metrics


def spec_bench_answer(request: RequestOutput, model_id: str) -> dict:
    """One line of a Spec-Bench answer file (its ``evaluation/speed.py`` reads ``choices[0]``'s
    ``new_tokens``, ``wall_time`` (seconds) and ``accept_lengths``). ``wall_time`` is the request's own
    generation time, its queueing left out, as Spec-Bench's one-request-at-a-time runs measure it."""
    wall_time_s = None
    if request.e2e_ms is not None:
        wall_time_s = (request.e2e_ms - (request.queue_ms or 0.0)) / 1e3
    return {
        "question_id": request.prompt_id,
        "category": request.category,
        "model_id": model_id,
        "choices": [
            {
                "index": 0,
                "turns": [request.output_text],
                "decoding_steps": [len(request.accept_lengths)],
                "new_tokens": [len(request.output_token_ids)],
                "wall_time": [wall_time_s],
                "accept_lengths": list(request.accept_lengths),
            }
        ],
    }
