"""Per-group metrics: ``metrics.by_category.<category>`` and ``metrics.by_task.<task>`` of result.json.

Each group holds DESIGN.md §4's acceptance metrics over its requests' verifications (acceptance length,
per-position and conditional acceptance, the acceptance histogram), its latencies (``ttft_ms``, ``tpot_ms``,
``e2e_ms``: mean, p50, p90, p99), ``spec_bench_mean_accepted_tokens`` and:

- ``output_tokens_per_s``: the group's output tokens ÷ the sum of its requests' end-to-end seconds. With
  requests served one at a time this is the group's share of the run's throughput; in a batched run
  requests overlap, so it is a per-request speed and the groups' figures do not add up to the run's.
- ``num_requests`` (turns count separately), ``num_questions``, ``num_prompt_tokens``, ``num_output_tokens``.

``spec_bench_mean_accepted_tokens`` is Spec-Bench's "#Mean accepted tokens": the mean of every decoding step's
``accept_lengths`` (tokens emitted by the step, bonus token included), over all steps of all requests — the
prompt's prefill step (one token) and steps that drafted nothing included — whereas ``acceptance_length``
averages over verifications that carried drafts only.

A backend that counts acceptance only for the whole run (vLLM) leaves the groups' acceptance metrics ``None``.
Requests without a category are grouped under ``uncategorized``; ``by_task`` is empty when the workload has no
tasks (only Spec-Bench's and MT-Bench's categories group into tasks).
"""

from __future__ import annotations

from collections.abc import Callable

from specexp.engine.stats import AcceptanceCounts, AcceptanceStats, latency_summary

UNCATEGORIZED = "uncategorized"


def mean_accepted_tokens(requests: list) -> float | None:
    """Spec-Bench's mean accepted tokens: the mean of every step's ``accept_lengths`` over ``requests``
    (``None`` when no request recorded its steps)."""
    steps = [n for r in requests for n in r.accept_lengths]
    return sum(steps) / len(steps) if steps else None


def _counted_per_request(acceptance: AcceptanceStats) -> bool:
    return bool(acceptance.per_request) or acceptance.total.num_drafts == 0


def group_metrics(acceptance: AcceptanceStats, requests: list) -> dict:
    """The metrics of one group of ``requests`` (:class:`specexp.result.RequestOutput`), their acceptance
    counted from ``acceptance``'s per-request counts (keyed by ``prompt_id``)."""
    counts = AcceptanceCounts(acceptance.num_speculative_tokens)
    for request in requests:
        if request.prompt_id in acceptance.per_request:
            counts.merge(acceptance.per_request[request.prompt_id])
    accepted = counts.metrics()
    if not _counted_per_request(acceptance):
        accepted = dict.fromkeys(accepted)
    num_output_tokens = sum(len(r.output_token_ids) for r in requests)
    latencies = [{"ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "e2e_ms": r.e2e_ms} for r in requests]
    e2e_s = [r.e2e_ms / 1e3 for r in requests if r.e2e_ms is not None]
    summary = latency_summary(latencies, num_output_tokens, sum(e2e_s) if len(e2e_s) == len(requests) else 0.0)
    return {
        "num_requests": len(requests),
        "num_questions": len({r.question_id or r.prompt_id for r in requests}),
        "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
        "num_output_tokens": num_output_tokens,
        **accepted,
        "spec_bench_mean_accepted_tokens": mean_accepted_tokens(requests),
        **summary,
    }


def metrics_by(acceptance: AcceptanceStats, requests: list, key: Callable[[object], str | None],
               default: str | None = UNCATEGORIZED) -> dict[str, dict]:
    """``{group: group_metrics}`` with requests grouped by ``key(request)``, groups in first-seen order;
    requests whose key is ``None`` go to ``default`` (left out when ``default`` is ``None``)."""
    groups: dict[str, list] = {}
    for request in requests:
        name = key(request)
        name = default if name is None else str(name)
        if name is not None:
            groups.setdefault(name, []).append(request)
    return {name: group_metrics(acceptance, members) for name, members in groups.items()}


def grouped_metrics(acceptance: AcceptanceStats, requests: list) -> dict:
    """``{"by_category": ..., "by_task": ...}`` for result.json's metrics."""
    return {
        "by_category": metrics_by(acceptance, requests, lambda r: r.category),
        "by_task": metrics_by(acceptance, requests, lambda r: r.task, default=None),
    }
