"""A measurement's repeats -> the parts of result.json that carry them (docs/design.md §4-5).

- ``repeats``: one entry per repeat: its ``figures`` (every latency and throughput figure of that pass, plus
  its acceptance length, and ``by_task`` / ``by_category``: each group's :data:`GROUP_TIMING` figures of
  that pass), when it started, its slot in a sweep's order, its wall and CPU seconds, and the machine's
  state before and after it.
- ``metrics``: the §4 metrics. Latency and throughput figures are the **mean over the repeats**; acceptance
  figures, per-request rows (outputs.jsonl) and the per-category groups are those of the first repeat (under
  greedy decoding every repeat emits the same tokens; under sampling each repeat's acceptance length is in
  ``repeats`` and summarised in ``intervals.acceptance_length_over_repeats``). Added:
  ``num_repeats``, ``intervals`` (:func:`intervals`), ``sample_counts`` and ``noise``
  (:func:`specexp.measure.guards.noise_report`).
- ``measure``: the settings used, the order the repeats ran in (``interleaved`` or ``back_to_back``, and why),
  how many times the engine was built, and the machine's state before the first repeat and after the last.
- steps.parquet holds every repeat's steps, with a ``repeat`` column; traces.parquet (like outputs.jsonl) the
  first repeat's, so its rows recompute the record's acceptance counters exactly.
"""

from __future__ import annotations

import copy
import dataclasses

from specexp.engine.stats import LATENCY_KEYS
from specexp.measure import guards
from specexp.measure.intervals import CONFIDENCE, bootstrap_acceptance, repeat_summary
from specexp.measure.loop import Measurement
from specexp.measure.settings import MeasureSettings
from specexp.result import STEP_TIME_KEYS

# Every latency and throughput figure of a pass (docs/design.md §4), load metrics included.
TIMING_SCALARS = ("output_tokens_per_s", "duration_s", "requests_per_s", "total_tokens_per_s",
                  "goodput_requests_per_s")
TIMING_DISTRIBUTIONS = (*LATENCY_KEYS, *STEP_TIME_KEYS, "tokens_per_s_per_user", "verify_share")
STATS = ("mean", "p50", "p90", "p99")
# The per-group (metrics.by_task / by_category) timing figures each repeat keeps, so a group's speedup gets an
# interval from the repeats of both points like the run's does.
GROUP_LEVELS = ("by_task", "by_category")
GROUP_TIMING = ("output_tokens_per_s", "tpot_ms.p50", "e2e_ms.mean")


def timing_figures(metrics: dict) -> dict:
    """The latency and throughput figures of one pass's metrics, in the metrics' shape:
    ``{"output_tokens_per_s": x, "duration_s": x, "ttft_ms": {"mean": x, "p50": x, ...}, ...}``."""
    figures = {name: metrics.get(name) for name in TIMING_SCALARS}
    for name in TIMING_DISTRIBUTIONS:
        figures[name] = {stat: (metrics.get(name) or {}).get(stat) for stat in STATS}
    return figures


def figure_value(figures: dict, name: str):
    """``figures["tpot_ms"]["p50"]`` for ``name`` = ``"tpot_ms.p50"`` (None where absent)."""
    node = figures
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def group_timing_figures(metrics: dict) -> dict:
    """``{"by_task": {task: {"output_tokens_per_s": x, "tpot_ms.p50": x, "e2e_ms.mean": x}}, "by_category":
    {...}}``: the :data:`GROUP_TIMING` figures of each group of one pass's metrics (levels without groups
    left out)."""
    out = {}
    for level in GROUP_LEVELS:
        groups = metrics.get(level)
        if isinstance(groups, dict) and groups:
            out[level] = {name: {figure: figure_value(group, figure) for figure in GROUP_TIMING}
                          for name, group in groups.items()}
    return out


def _over_repeats(per_repeat: list[dict]) -> dict:
    """:func:`repeat_summary` of every timing figure over the repeats, in the figures' shape."""
    out = {name: repeat_summary([f.get(name) for f in per_repeat]) for name in TIMING_SCALARS}
    for name in TIMING_DISTRIBUTIONS:
        out[name] = {stat: repeat_summary([(f.get(name) or {}).get(stat) for f in per_repeat]) for stat in STATS}
    return out


def _acceptance_intervals(metrics: dict, settings: MeasureSettings) -> dict:
    """Bootstrap intervals (over requests) of the first repeat's acceptance figures; exact (low = high) for a
    run without drafts (k = 0: acceptance length 1 by definition)."""
    histograms = list((metrics.get("acceptance_histogram_per_request") or {}).values())
    boot = bootstrap_acceptance(histograms, settings.bootstrap_seed, settings.bootstrap_resamples)
    if not metrics.get("num_drafts"):
        value = metrics.get("acceptance_length")
        boot["acceptance_length"] = {"low": value, "high": value}
    if not histograms and metrics.get("num_drafts"):
        boot["note"] = "no per-request counts (this backend counts acceptance for the whole run only)"
    return boot


def intervals(results: list, per_repeat: list[dict], settings: MeasureSettings) -> dict:
    """``metrics.intervals``: every timing figure over the repeats (``{"mean", "std", "low", "high", "n"}``,
    n = repeats), ``acceptance`` (bootstrap over the first repeat's requests: ``acceptance_length``,
    ``per_position_acceptance``, ``conditional_acceptance`` as ``{"low", "high"}``, with ``unit``,
    ``num_requests``, ``resamples``, ``seed``) and ``acceptance_length_over_repeats``."""
    first = results[0].metrics
    return {
        "confidence": CONFIDENCE,
        **_over_repeats(per_repeat),
        "acceptance": _acceptance_intervals(first, settings),
        "acceptance_length_over_repeats": repeat_summary([r.metrics.get("acceptance_length") for r in results]),
    }


def sample_counts(metrics: dict, num_repeats: int) -> dict:
    """What each figure rests on: ``num_requests``, ``num_repeats``, ``drafted_per_position`` (drafts that
    proposed position i) and ``conditioned_per_position`` (the denominator of conditional acceptance at i:
    num_drafts at 0, then the drafts with positions 0..i-1 accepted)."""
    accepted = list(metrics.get("accepted_per_position") or [])
    drafts = metrics.get("num_drafts") or 0
    return {"num_requests": metrics.get("num_requests"), "num_repeats": num_repeats,
            "num_drafts": drafts, "drafted_per_position": list(metrics.get("drafted_per_position") or []),
            "conditioned_per_position": [drafts, *accepted[:-1]] if accepted else []}


def step_rows(results: list) -> list[dict]:
    """Every repeat's step rows (steps.parquet), each with its ``repeat``."""
    return [{**dataclasses.asdict(step), "repeat": r} for r, result in enumerate(results) for step in result.steps]


def summarize(measurement: Measurement, settings: MeasureSettings, order: str, order_note: str,
              own_pid: int, siblings=(), concurrent=()) -> dict:
    """``{"metrics", "repeats", "measure", "requests", "steps", "traces"}`` for the run record (module
    docstring). ``siblings``: pids the GPU guard ignores; ``concurrent``: the other jobs of a parallel sweep
    that overlapped this one (:func:`specexp.measure.overlap.concurrent_jobs`)."""
    results = measurement.results
    per_repeat = [timing_figures(r.metrics) for r in results]
    metrics = copy.deepcopy(results[0].metrics)
    means = _over_repeats(per_repeat)
    for name in TIMING_SCALARS:
        metrics[name] = means[name]["mean"]
    for name in TIMING_DISTRIBUTIONS:
        if isinstance(metrics.get(name), dict):
            metrics[name] = {**metrics[name], **{stat: means[name][stat]["mean"] for stat in STATS}}
    metrics["num_repeats"] = len(results)
    metrics["intervals"] = intervals(results, per_repeat, settings)
    metrics["sample_counts"] = sample_counts(metrics, len(results))
    repeats = []
    for record, figures, result in zip(measurement.repeats, per_repeat, results):
        figures = {**figures, "acceptance_length": result.metrics.get("acceptance_length"),
                   "num_output_tokens": result.metrics.get("num_output_tokens"),
                   **group_timing_figures(result.metrics)}
        repeats.append({**record, "figures": figures})
    guarded = {name: [figure_value(f, name) for f in per_repeat] for name in guards.GUARDED_FIGURES}
    metrics["noise"] = guards.noise_report(measurement.machine, repeats, guarded, settings.busy_load_per_core,
                                           settings.max_relative_std, own_pid, siblings, concurrent)
    measure = {
        **dataclasses.asdict(settings),
        "warmup_requests": measurement.warmup_requests,
        "engine_builds": measurement.engine_builds,
        "order": order,
        "order_note": order_note,
        "machine": measurement.machine,
    }
    return {"metrics": metrics, "repeats": repeats, "measure": measure, "requests": results[0].requests,
            "steps": step_rows(results), "traces": list(getattr(results[0], "traces", []) or [])}
