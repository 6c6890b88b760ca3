"""Tables of serving-load sweeps (``+exp=load_sweep``, ``+exp=rate_sweep``): one row per run along the load
axis, the best k at each load, and the oracle bound against the best static depth and what was measured.

The *load axis* is ``workload.max_concurrency`` (a closed loop) or ``workload.request_rate`` (Poisson), the
one that varies; a *series* is every other experiment-defining setting but k (pair, backend, ...): runs of
one series at one load differ only in k.

    runs = specexp.analysis.load_sweep("experiments/runs")
    load_table(runs)                               # throughput, TPOT, per-user tokens/s, verify share ...
    best_k_table(runs)                             # the fastest k at each load
    oracle_table(runs)                             # measured best vs modelled best static vs per-step oracle

**Intervals.** Every timing figure of :func:`load_table` (:data:`TIMING_COLUMNS`) comes with its spread over
the run's repeats: ``<figure>_std``, ``<figure>_low`` / ``<figure>_high`` (Student's t 95% interval) and
``<figure>_n`` (repeats), from the record's ``metrics.intervals`` (NaN bounds with one repeat); ``noisy`` says
whether the record marks its timings noisy. Speedups over k = 0 (:func:`best_k_table`, the measured column of
:func:`oracle_table`) get the 95% interval of :func:`specexp.measure.intervals.ratio_interval` from the repeats
of both points; the oracle's modelled speedups are computed once per repeat (that repeat's step costs) and
summarised over the repeats. Acceptance figures and the mean batch are counts, the same in every repeat under
greedy decoding.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specexp.analysis.groups import comparison_columns
from specexp.analysis.metrics import _ok
from specexp.analysis.oracle import (
    oracle_rounds,
    prefill_ms_per_token,
    request_matches,
    static_k_table,
    step_costs,
)
from specexp.analysis.traces import load_traces

LOAD_AXES = ("workload.max_concurrency", "workload.request_rate")
BURST_AXIS = "engine.max_num_seqs"  # all requests at once: the batch limit is the load
SERIES = "series"
LOAD_COLUMNS = ("output_tokens_per_s", "requests_per_s", "tokens_per_s_per_user.p50", "tpot_ms.p50", "tpot_ms.p99",
                "ttft_ms.p50", "queue_ms.p50", "num_reqs_per_step.mean", "batch_occupancy.mean", "verify_share.mean",
                "goodput_requests_per_s", "acceptance_length")
# Figures measured with a clock (they vary between repeats); the others are counts.
TIMING_COLUMNS = tuple(c for c in LOAD_COLUMNS
                       if c not in ("num_reqs_per_step.mean", "batch_occupancy.mean", "acceptance_length"))
INTERVAL_STATS = ("std", "low", "high", "n")


def load_axis(runs: pd.DataFrame) -> str:
    """The load column of ``runs``: the one of :data:`LOAD_AXES` that varies (the concurrency if both do or
    neither does but it is set), else :data:`BURST_AXIS` (runs whose requests all arrive at once)."""
    for column in LOAD_AXES:
        if column in runs and runs[column].dropna().nunique() > 1:
            return column
    present = [c for c in LOAD_AXES if c in runs and runs[c].notna().all()]
    return present[0] if present else BURST_AXIS


def with_series(runs: pd.DataFrame, axis: str | None = None) -> pd.DataFrame:
    """``runs`` (status ok) with a :data:`SERIES` label: the values of the comparison columns other than k
    and the load axis that differ between runs ("all" when none does)."""
    runs = _ok(runs).copy()
    if runs.empty:
        return runs.assign(**{SERIES: []})
    axis = axis or load_axis(runs)
    columns = [c for c in comparison_columns(runs) if c in runs and c != axis
               and runs[c].astype(str).nunique() > 1]
    runs[SERIES] = runs[columns].astype(str).agg(" · ".join, axis=1) if columns else "all"
    return runs


def _noisy(runs: pd.DataFrame) -> list[bool]:
    """Per run, whether its record marks its throughput noisy (:func:`specexp.measure.guards.is_marked`)."""
    from specexp.measure.guards import is_marked

    marked = runs["noise.figures"] if "noise.figures" in runs else pd.Series([None] * len(runs), index=runs.index)
    return [is_marked({"figures": list(m) if isinstance(m, (list, tuple)) or hasattr(m, "tolist") else []},
                      "output_tokens_per_s") for m in marked]


def _stat(runs: pd.DataFrame, figure: str, stat: str) -> pd.Series:
    """``intervals.<figure>.<stat>`` of each run; ``n`` is 1 for a record without intervals (one pass)."""
    column = f"intervals.{figure}.{stat}"
    values = pd.to_numeric(runs[column], errors="coerce") if column in runs else pd.Series(math.nan, index=runs.index)
    if stat == "n":
        values = values.where(values.notna() & runs[figure].notna(), runs[figure].notna().astype(float))
    return values


def load_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: series, load, k, the :data:`LOAD_COLUMNS` it has (timing figures: the mean over the
    repeats), each timing figure's ``_std`` / ``_low`` / ``_high`` / ``_n`` (module docstring), ``noisy``,
    ``run_dir``, ``repeats.output_tokens_per_s`` (the per-repeat values) and ``num_reqs_per_step.mean_spread``
    (the largest minus the smallest mean batch of the run's repeats, from steps.parquet: 0 when every repeat
    ran the same batches, as a closed loop under greedy decoding does), sorted by series, load, k."""
    runs = with_series(runs)
    if runs.empty:
        return pd.DataFrame(columns=[SERIES, "load", "k", *LOAD_COLUMNS])
    axis = load_axis(runs)
    present = [c for c in LOAD_COLUMNS if c in runs]
    table = runs.assign(load=runs[axis])[[SERIES, "load", "k", *present]].copy()
    for figure in (c for c in TIMING_COLUMNS if c in runs):
        for stat in INTERVAL_STATS:
            table[f"{figure}_{stat}"] = _stat(runs, figure, stat)
    batches = [[v for v in _cell_list(cell) if v is not None] for cell in
               runs.get("steps.by_repeat.num_reqs_mean", pd.Series([None] * len(runs), index=runs.index))]
    table["num_reqs_per_step.mean_spread"] = [max(b) - min(b) if b else 0.0 for b in batches]
    table["noisy"] = _noisy(runs)
    table["run_dir"] = runs["run_dir"]
    table["repeats.output_tokens_per_s"] = [_repeat_values(run, "output_tokens_per_s") for _, run in runs.iterrows()]
    return table.sort_values([SERIES, "load", "k"]).reset_index(drop=True)


def _repeat_values(run: pd.Series, metric: str) -> list[float]:
    """The run's per-repeat values of ``metric`` (its one recorded value for a record without repeats)."""
    values = run.get(f"repeats.{metric}")
    values = list(values) if isinstance(values, (list, tuple)) or hasattr(values, "tolist") else []
    if not values and pd.notna(run.get(metric)):
        values = [run.get(metric)]
    return [float(v) for v in values if v is not None and pd.notna(v)]


def _ratio(numerator: list[float], denominator: list[float]) -> dict:
    from specexp.measure.intervals import ratio_interval

    out = ratio_interval(numerator, denominator)
    return {key: (math.nan if value is None else value) for key, value in out.items()}


def best_k_table(runs: pd.DataFrame, metric: str = "output_tokens_per_s") -> pd.DataFrame:
    """Per series and load: the k with the highest mean ``metric``, its value, k = 0's, the speedup with its
    95% interval from the repeats of both points (``speedup_low`` / ``speedup_high``, ``repeats`` at the
    best k, ``baseline_repeats`` at k = 0), ``noisy`` (either run's timings flagged), and the runner-up:
    ``next_best_k``, ``next_best_speedup`` with its interval (``next_best_low`` / ``next_best_high``) and
    ``claim`` (:func:`specexp.analysis.theory_intervals.best_k_claim`: whether the runner-up lies inside the
    best's interval, or for k = 0 best, whether the runner-up's interval reaches 1)."""
    from specexp.analysis.theory_intervals import best_k_claim, measured_best

    table = load_table(runs)
    columns = [SERIES, "load", "best_k", metric, f"{metric}_k0", "speedup", "speedup_low", "speedup_high",
               "repeats", "baseline_repeats", "noisy", "next_best_k", "next_best_speedup", "next_best_low",
               "next_best_high", "claim"]
    rows = []
    for (series, load), group in table.groupby([SERIES, "load"], sort=True):
        best = group.loc[group[metric].idxmax()]
        base = group[group["k"] == 0]
        base_repeats = [v for values in base["repeats.output_tokens_per_s"] for v in values] if len(base) else []
        per_k = []
        for _, run in group.iterrows():
            ratio = _ratio(run["repeats.output_tokens_per_s"], base_repeats) if base_repeats else {}
            per_k.append({"k": int(run["k"]), "speedup": 1.0 if run["k"] == 0 else ratio.get("value", math.nan),
                          "speedup_low": math.nan if run["k"] == 0 else ratio.get("low", math.nan),
                          "speedup_high": math.nan if run["k"] == 0 else ratio.get("high", math.nan)})
        claim = measured_best(pd.DataFrame(per_k)) if base_repeats else {}
        mine = next((r for r in per_k if r["k"] == int(best["k"])), {})
        second = next((r for r in per_k if r["k"] == claim.get("next_best_k_measured")), {})
        rows.append({SERIES: series, "load": load, "best_k": int(best["k"]), metric: best[metric],
                     f"{metric}_k0": float(base[metric].mean()) if len(base) else None,
                     "speedup": mine.get("speedup") if base_repeats else None,
                     "speedup_low": mine.get("speedup_low", math.nan), "speedup_high": mine.get("speedup_high", math.nan),
                     "repeats": len(best["repeats.output_tokens_per_s"]), "baseline_repeats": len(base_repeats),
                     "noisy": bool(best["noisy"]) or bool(base["noisy"].any()),
                     "next_best_k": claim.get("next_best_k_measured"),
                     "next_best_speedup": claim.get("next_best_speedup_measured", math.nan),
                     "next_best_low": second.get("speedup_low", math.nan),
                     "next_best_high": second.get("speedup_high", math.nan),
                     "claim": best_k_claim(claim) if claim else "– (no k=0 run)"})
    return pd.DataFrame(rows, columns=columns)


def _steps(run_dir: str) -> pd.DataFrame:
    return pd.read_parquet(Path(run_dir) / "steps.parquet")


def _by_repeat(steps: pd.DataFrame) -> list[pd.DataFrame]:
    """A run's steps split by repeat (one part for a record without a ``repeat`` column)."""
    if "repeat" not in steps:
        return [steps]
    return [part for _, part in steps.groupby("repeat", sort=True)]


def _modelled(traces: pd.DataFrame, steps_by_k: dict[int, pd.DataFrame]) -> dict:
    """The oracle's figures on the deepest run's steps (``traces``), each depth's decode step costs and cost per
    prompt token from its own steps: ``model_best_static_k`` from every repeat's steps pooled, then per repeat (that repeat's costs at every depth) the speedup of that k and
    of the per-step oracle, and the oracle's mean k, each summarised over the repeats (mean, ``_std``,
    ``_low`` / ``_high``, ``_n``)."""
    from specexp.measure.intervals import repeat_summary

    parts = {k: _by_repeat(steps) for k, steps in steps_by_k.items()}

    def costs_of(steps: dict[int, pd.DataFrame]) -> tuple[dict, dict]:
        costs = step_costs(steps)
        return costs, {k: prefill_ms_per_token(frame, costs[k]) for k, frame in steps.items()}

    best_static = oracle_rounds([(traces, *costs_of(steps_by_k))])["best_static_k"][0]
    repeats = min(len(p) for p in parts.values())
    per_round = oracle_rounds([(traces, *costs_of({k: p[r] for k, p in parts.items()})) for r in range(repeats)],
                              best_static_k=best_static)
    row = {"model_best_static_k": best_static}
    for name in ("model_best_static_speedup", "oracle_speedup", "oracle_k_mean"):
        summary = repeat_summary(per_round[name])
        row[name] = summary["mean"]
        for stat in INTERVAL_STATS:
            row[f"{name}_{stat}"] = math.nan if summary[stat] is None else summary[stat]
    return row


def _filled_matches(traces: pd.DataFrame, run_dir: str, draft_pair, cache: dict) -> dict:
    """The run's observed matches, completed by one draft forward over each request's outputs (``cache``:
    the forwards already made, by prompt and output tokens: greedy runs of one pair share their outputs)."""
    import json

    from specexp.analysis.acceptance_replay import draft_matches
    from specexp.analysis.oracle import fill_matches

    lines = (Path(run_dir) / "outputs.jsonl").read_text().splitlines()
    outputs = {row["prompt_id"]: row for row in map(json.loads, lines)}
    filled = {}
    for pid, seen in request_matches(traces).items():
        prompt, output = outputs[pid]["prompt_token_ids"], outputs[pid]["output_token_ids"]
        key = (tuple(prompt), tuple(output))
        if key not in cache:
            cache[key] = draft_matches(*draft_pair, prompt, output, extra_tokens=0)
        filled[pid] = fill_matches(seen, cache[key])
    return filled


def oracle_table(runs: pd.DataFrame, draft_pair=None) -> pd.DataFrame:
    """Per series and load, from its deepest run's traces and every depth's measured step costs: the measured
    best speedup over k = 0 (with ``measured_speedup_low`` / ``_high`` from the repeats of both points), the
    modelled best static depth and its speedup (:func:`~specexp.analysis.oracle.per_step_oracle` on the deepest
    run's steps), the per-step oracle's speedup (both per repeat, then mean with ``_std``, ``_low`` / ``_high`` and ``_n``:
    :func:`_modelled`), and the acceptance length each measured k replays to
    from the deepest run (greedy; ``replay_exact``: no unobserved position reached). ``draft_pair``: the
    runs' (target, draft) as transformers models
    (:func:`specexp.analysis.acceptance_replay.load_pair`), to complete the unobserved positions with one
    draft forward a request, which makes every replay exact. Loads without a k = 0 run or without traces are
    left out."""
    table = with_series(runs)
    rows, forwards = [], {}
    if table.empty:
        return pd.DataFrame(rows)
    axis = load_axis(table)
    for (series, load), group in table.groupby([SERIES, axis], sort=True):
        if 0 not in set(group["k"]) or len(group) < 2:
            continue
        deepest = group.loc[group["k"].idxmax()]
        traces = load_traces(deepest["run_dir"])
        if traces.empty:
            continue
        measured = group.set_index("k")["output_tokens_per_s"]
        best_k = int(measured.idxmax())
        repeats = {int(r["k"]): _repeat_values(r, "output_tokens_per_s") for _, r in group.iterrows()}
        ratio = _ratio(repeats[best_k], repeats[0])
        row = {SERIES: series, "load": load, "max_k": int(deepest["k"]), "measured_best_k": best_k,
               "measured_speedup": measured.max() / measured.loc[0],
               "measured_speedup_low": math.nan if best_k == 0 else ratio["low"],
               "measured_speedup_high": math.nan if best_k == 0 else ratio["high"],
               "measured_repeats": len(repeats[best_k]), "baseline_repeats": len(repeats[0]),
               **_modelled(traces, {int(r.k): _steps(r.run_dir) for r in group.itertuples()})}
        greedy = group["sampling.temperature"].fillna(0).eq(0).all() if "sampling.temperature" in group else True
        standard = (group.get("speculator.rejection", pd.Series(["standard"])).fillna("standard") == "standard").all()
        if greedy and standard:
            matches = (_filled_matches(traces, deepest["run_dir"], draft_pair, forwards) if draft_pair is not None
                       else request_matches(traces))
            replay = static_k_table(matches, sorted(int(k) for k in group["k"]))
            row["replay_exact"] = bool(replay["exact"].all())
            for r in replay.itertuples():
                row[f"replay_al_k{r.k}"] = r.acceptance_length
        rows.append(row)
    return pd.DataFrame(rows)


def _cell_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else []


def _joined(values) -> str:
    present = sorted({str(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))})
    return ", ".join(present) or "–"


def measurement_summary(runs: pd.DataFrame) -> dict:
    """How the finished runs of ``runs`` were measured, from their records: ``num_runs``, ``repeats`` and
    ``warmup_requests`` (the distinct values, joined), ``order`` (interleaved / back to back), the first and
    last ``started_at``, ``cpu_count``, ``load_avg_1m`` (``min``/``median``/``max``/``n`` over every 1-minute
    load average read before a run's first repeat and after each repeat), ``busy_runs`` and ``disagree_runs``
    (runs the noise guards flagged: :mod:`specexp.measure.guards`), the guards' thresholds and ``measured_s``
    (the repeats' summed wall seconds); ``first_started_at`` / ``last_started_at``: the first and last repeat's
    start (the runs' start for records without repeats)."""
    import statistics

    from specexp.measure.guards import BUSY, DISAGREE

    runs = _ok(runs)
    loads = [float(v) for cell in runs.get("measurement.load_avg_1m", pd.Series(dtype=object))
             for v in _cell_list(cell) if v is not None]
    flags = [_cell_list(cell) for cell in runs.get("noise.flags", pd.Series([None] * len(runs), index=runs.index))]
    times = [(str(t), float(w or 0)) for starts, walls in zip(
        runs.get("measurement.repeat_times", pd.Series([None] * len(runs), index=runs.index)),
        runs.get("measurement.repeat_wall_s", pd.Series([None] * len(runs), index=runs.index)), strict=True)
        for t, w in zip(_cell_list(starts), _cell_list(walls), strict=False) if t]
    started = sorted(t for t, _ in times) or sorted(str(v) for v in runs.get("started_at", pd.Series(dtype=object))
                                                    .dropna())
    return {
        "num_runs": len(runs),
        "repeats": _joined(int(v) for v in runs.get("num_repeats", pd.Series(dtype=float)).dropna()),
        "order": _joined(str(v).replace("_", " ") for v in runs.get("measurement.order", pd.Series(dtype=object))
                         .dropna()) if "measurement.order" in runs and runs["measurement.order"].notna().any()
        else "recorded before repeats existed",
        "warmup_requests": _joined(int(v) for v in runs.get("measurement.warmup_requests", pd.Series(dtype=float))
                                   .dropna()),
        "first_started_at": started[0] if started else None,
        "last_started_at": started[-1] if started else None,
        "measured_s": sum(w for _, w in times),
        "cpu_count": _joined(int(v) for v in runs.get("measurement.cpu_count", pd.Series(dtype=float)).dropna()),
        "load_avg_1m": {"min": min(loads) if loads else None, "median": statistics.median(loads) if loads else None,
                        "max": max(loads) if loads else None, "n": len(loads)},
        "busy_runs": sum(BUSY in f for f in flags),
        "disagree_runs": sum(DISAGREE in f for f in flags),
        "busy_load_per_core": _joined(runs.get("measure.busy_load_per_core", pd.Series([1.0]))),
        "max_relative_std": float(runs["measure.max_relative_std"].dropna().iloc[0])
        if "measure.max_relative_std" in runs and runs["measure.max_relative_std"].notna().any() else 0.05,
    }
