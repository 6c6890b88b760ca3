"""Serving-load metrics of a run (docs/design.md §4): throughput per run and per user, goodput under SLOs,
batch occupancy and the verification's share of each step. Pure Python (no torch).

vLLM's ``vllm bench serve`` reports the same quantities as ``request_throughput``, ``total_token_throughput``
and ``request_goodput``; here the names carry their units (``requests_per_s``, ``total_tokens_per_s``,
``goodput_requests_per_s``). ``output_tokens_per_s`` (vLLM's ``output_throughput``) is in
:func:`specexp.engine.stats.latency_summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specexp.engine.stats import distribution

NO_STEP_METRICS = ("batch_occupancy", "num_reqs_per_step", "verify_share")


@dataclass(frozen=True)
class LoadSettings:
    """What load metrics need beyond the run's records: ``max_num_seqs`` (the batch rows a step can hold, the
    denominator of occupancy) and the SLOs in ms (``None`` = no objective on that latency)."""

    max_num_seqs: int
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None

    @classmethod
    def of(cls, spec, max_num_seqs: int | None = None) -> LoadSettings:
        """The settings of a :class:`specexp.specs.RunSpec` (``max_num_seqs``: the backend's own batch limit,
        default ``engine.max_num_seqs``)."""
        return cls(max_num_seqs or spec.engine.max_num_seqs, spec.slo.ttft_ms, spec.slo.tpot_ms)


def meets_slo(ttft_ms: float | None, tpot_ms: float | None, settings: LoadSettings) -> bool:
    """Whether one request meets both objectives. A request without a TPOT (one output token) meets any TPOT
    objective; one without a TTFT meets none."""
    if settings.slo_ttft_ms is not None and (ttft_ms is None or ttft_ms > settings.slo_ttft_ms):
        return False
    return settings.slo_tpot_ms is None or tpot_ms is None or tpot_ms <= settings.slo_tpot_ms


def verify_share(step) -> float | None:
    """One step's verification time (target forward + rejection sampling: ``verify_ms + sample_ms``) over its
    phases' sum (``schedule_ms + verify_ms + sample_ms + draft_ms``); ``None`` where not measured."""
    phases = [getattr(step, name) for name in ("schedule_ms", "verify_ms", "sample_ms", "draft_ms")]
    if any(p is None for p in phases) or sum(phases) <= 0:
        return None
    return (phases[1] + phases[2]) / sum(phases)


def load_metrics(requests: Sequence, steps: Sequence, duration_s: float, settings: LoadSettings) -> dict:
    """The load metrics of a run as a JSON-ready dict.

    ``requests``: :class:`specexp.result.RequestOutput` rows (their ``ttft_ms``/``tpot_ms`` and token ids);
    ``steps``: :class:`specexp.result.StepRecord` rows (empty where the backend shows none: the step metrics
    are then ``None``); ``duration_s``: first arrival -> last token. Returns ``requests_per_s``,
    ``total_tokens_per_s`` (prompt + output tokens), ``tokens_per_s_per_user`` (per request ``1000 /
    tpot_ms``, as ``{mean, p50, p90, p99}``), ``num_good_requests`` and ``goodput_requests_per_s`` (requests
    meeting both SLOs per second; ``None`` without an SLO), and over steps ``batch_occupancy`` (rows /
    ``max_num_seqs``), ``num_reqs_per_step`` and ``verify_share`` (:func:`verify_share`), each as a
    distribution.
    """
    n = len(requests)
    tokens = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in requests)
    per_user = [1e3 / r.tpot_ms for r in requests if r.tpot_ms]
    has_slo = settings.slo_ttft_ms is not None or settings.slo_tpot_ms is not None
    good = sum(meets_slo(r.ttft_ms, r.tpot_ms, settings) for r in requests) if has_slo else None
    metrics = {
        "requests_per_s": n / duration_s if duration_s else None,
        "total_tokens_per_s": tokens / duration_s if duration_s else None,
        "tokens_per_s_per_user": distribution(per_user),
        "num_good_requests": good,
        "goodput_requests_per_s": good / duration_s if good is not None and duration_s else None,
    }
    if not steps:
        return {**metrics, **{name: None for name in NO_STEP_METRICS}}
    return {
        **metrics,
        "batch_occupancy": distribution([s.num_reqs / settings.max_num_seqs for s in steps]),
        "num_reqs_per_step": distribution([s.num_reqs for s in steps]),
        "verify_share": distribution([verify_share(s) for s in steps]),
    }
