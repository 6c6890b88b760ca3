"""What a backend returns: :class:`RunResult` = per-request outputs + per-step rows + §4 metrics.

Backends fill :class:`RequestOutput` and :class:`StepRecord` and call :func:`run_metrics` once at the end;
the app layer adds status/config/env and writes the run record (docs/design.md §5). Pure Python (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specexp.engine.stats import LATENCY_KEYS, AcceptanceStats, distribution, latency_summary
from specexp.group_metrics import grouped_metrics, mean_accepted_tokens
from specexp.load_metrics import LoadSettings, load_metrics
from specexp.workloads.prompt import Prompt

# Graph-capture metrics (§4) are None, never 0, where nothing was captured (CPU, or the hf backend).
GRAPH_METRIC_KEYS = ("graph_capture_bytes", "graph_capture_s", "graph_compile_s", "graph_capture_per_size",
                     "persistent_buffer_bytes")
STEP_TIME_KEYS = ("draft_ms", "verify_ms", "sample_ms", "schedule_ms", "step_ms")


@dataclass
class RequestOutput:
    """One request's result. Token ids are target-tokenizer ids; times are milliseconds, counted from the
    request's arrival on every backend (``queue_ms``: arrival -> first scheduled, part of ``ttft_ms``).

    ``accept_lengths[s]`` = tokens the request emitted at its s-th verification step (accepted drafts + the
    bonus/correction token); it sums to ``len(output_token_ids)`` and is what Spec-Bench calls accept_lengths.

    ``prompt_id`` is unique per request (:attr:`specexp.workloads.Prompt.request_id`): a question's id, or
    ``<id>/turn<n>`` for turn ``n`` of a multi-turn question; ``question_id`` is the question's id and ``turn``
    the turn (1-based); ``task`` the benchmark task of ``category`` (Spec-Bench's grouping), if any.
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
    question_id: str | None = None
    task: str | None = None
    turn: int = 1

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
    ``num_speculative_tokens``: the step's k (native: its verify rows carried at most k drafts and it proposed
    k per row, ``specexp.engine.depth``); ``None`` where a backend does not say.
    ``num_in_flight``: requests arrived and not finished when the step began; ``num_waiting``: those of them
    queued for a batch slot (native; ``None`` elsewhere).
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
    num_speculative_tokens: int | None = None
    num_in_flight: int | None = None
    num_waiting: int | None = None


@dataclass
class TraceRow:
    """What one step did for one request (one row of traces.parquet), from which every acceptance counter of
    the run can be recomputed (:func:`specexp.analysis.traces.acceptance_from_traces`).

    ``step``: the run's step (``steps.parquet``'s ``step``); ``k``: the step's speculation depth;
    ``num_query_tokens``: tokens the target ran for the request; ``is_prefill``: a prompt chunk;
    ``num_draft_tokens``: drafts it could accept (0: not a draft); ``num_accepted_tokens``: accepted of them
    (bonus/correction excluded); ``num_emitted_tokens``: output tokens the step added (0 for a prompt chunk
    that does not end the prompt); ``num_reqs``: rows of the step (its batch size); ``step_ms``: the step's
    wall time on the host.
    """

    step: int
    prompt_id: str
    k: int
    num_query_tokens: int
    is_prefill: bool
    num_draft_tokens: int
    num_accepted_tokens: int
    num_emitted_tokens: int
    num_reqs: int
    step_ms: float | None = None


@dataclass
class RunResult:
    """Everything a backend measured. ``metrics`` holds the §4 metrics (see :func:`run_metrics`);
    ``env`` holds backend facts worth recording (e.g. ``{"device": "cuda:0", "gpu": "NVIDIA H200"}``);
    ``traces`` one row per (request, step) where the backend sees its steps (empty for vLLM)."""

    requests: list[RequestOutput]
    steps: list[StepRecord]
    metrics: dict
    env: dict = field(default_factory=dict)
    traces: list[TraceRow] = field(default_factory=list)


def run_metrics(
    acceptance: AcceptanceStats,
    requests: list[RequestOutput],
    steps: list[StepRecord],
    duration_s: float,
    graph: dict | None = None,
    load: LoadSettings | None = None,
) -> dict:
    """All §4 metrics of a run as one JSON-ready dict.

    ``duration_s``: wall time of the generation phase (model loading and warm-up excluded), used for
    ``output_tokens_per_s``. ``graph``: graph-capture metrics (keys of ``GRAPH_METRIC_KEYS``); missing ones
    are ``None``. ``load``: the batch limit and SLOs of the load metrics (:mod:`specexp.load_metrics`; default:
    batch 1, no SLO). Step timings are summarised per step as ``{"mean","p50","p90","p99"}``. The same metrics per
    category and per task are in ``by_category`` / ``by_task`` (:mod:`specexp.group_metrics`), and
    ``spec_bench_mean_accepted_tokens`` is Spec-Bench's "#Mean accepted tokens".
    """
    num_output_tokens = sum(len(r.output_token_ids) for r in requests)
    latencies = [{key: getattr(r, key) for key in LATENCY_KEYS} for r in requests]
    metrics = {
        "num_speculative_tokens": acceptance.num_speculative_tokens,
        **acceptance.metrics(),
        "acceptance_histogram_per_request": acceptance.histograms_per_request(),
        "drafted_per_position_per_request": {rid: list(c.drafted_per_position)
                                             for rid, c in acceptance.per_request.items()},
        "num_requests": len(requests),
        "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "num_output_tokens": num_output_tokens,
        "num_steps": len(steps),
        "duration_s": duration_s,
        **latency_summary(latencies, num_output_tokens, duration_s),
        **{key: distribution([getattr(s, key) for s in steps]) for key in STEP_TIME_KEYS},
        **load_metrics(requests, steps, duration_s, load or LoadSettings(max_num_seqs=1)),
    }
    metrics.update(depth_metrics(steps, acceptance.num_speculative_tokens))
    metrics.update({key: (graph or {}).get(key) for key in GRAPH_METRIC_KEYS})
    metrics["spec_bench_mean_accepted_tokens"] = mean_accepted_tokens(requests)
    metrics.update(grouped_metrics(acceptance, requests))  # by_category, by_task
    return metrics


def depth_metrics(steps: list[StepRecord], max_k: int) -> dict:
    """The per-step depth metrics of a run whose steps ran k in 0..max_k: ``num_speculative_tokens_hist[k]``
    (steps of depth k; vLLM's name), ``acceptance_length_by_num_speculative_tokens[k]`` (1 + accepted / drafts
    over the steps of depth k; ``None`` where they verified no draft) and ``mean_draft_tokens_per_step`` (draft
    tokens verified per step). The first two are ``None`` when no step recorded its k (hf, vLLM)."""
    depths = [s for s in steps if s.num_speculative_tokens is not None]
    hist = accepted = drafts = None
    if depths:
        hist, accepted, drafts = [0] * (max_k + 1), [0] * (max_k + 1), [0] * (max_k + 1)
        for s in depths:
            hist[s.num_speculative_tokens] += 1
            accepted[s.num_speculative_tokens] += s.num_accepted_tokens
            drafts[s.num_speculative_tokens] += s.num_drafts
    return {
        "num_speculative_tokens_hist": hist,
        "acceptance_length_by_num_speculative_tokens": (
            None if hist is None else [1.0 + a / d if d else None for a, d in zip(accepted, drafts)]),
        "mean_draft_tokens_per_step": (sum(s.num_draft_tokens for s in steps) / len(steps)) if steps else None,
    }


def prompt_fields(prompt: Prompt) -> dict:
    """The :class:`RequestOutput` fields that come from the request's prompt."""
    return {"prompt_id": prompt.request_id, "prompt": prompt.text, "prompt_token_ids": list(prompt.token_ids),
            "category": prompt.category, "question_id": prompt.id, "task": prompt.task, "turn": prompt.turn}
