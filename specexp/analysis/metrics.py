"""Derived metrics over loaded runs (docs/design.md §4): per-position acceptance, per-request acceptance,
speedup over k=0, step-time breakdown and graph-capture tables. Each takes the frame of
:func:`specexp.analysis.load_runs` and returns a new tidy frame; none reads files.
"""

from __future__ import annotations

import math

import pandas as pd

from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL, with_groups
from specexp.analysis.load import STEP_PHASES

RUN_ID_COLUMNS = ("run_dir", GROUP_KEY, GROUP_LABEL, "sweep_group", "k")


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """Finished runs (status ok, k recorded) only, with group columns."""
    if df.empty:
        return with_groups(df)
    df = df if GROUP_KEY in df else with_groups(df)
    ok = df["status"] == "ok" if "status" in df else pd.Series(True, index=df.index)
    return df[ok & df["k"].notna()] if "k" in df else df[ok]


def _ids(row) -> dict:
    return {c: row[c] for c in RUN_ID_COLUMNS if c in row}


def _list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else []


def per_position(df: pd.DataFrame) -> pd.DataFrame:
    """Acceptance per draft position, one row per (run, position), recomputed from the raw counts.

    Columns: the run's ids (``run_dir``, ``group_key``, ``group``, ``sweep_group``, ``k``), ``position``
    (0-based draft position i), ``accepted`` (drafts with positions 0..i all accepted), ``drafted``
    (drafts that proposed position i), ``num_drafts``, ``unconditional`` = accepted / num_drafts (sums over
    positions to acceptance_length - 1) and ``conditional`` = accepted[i] / accepted[i-1] (position 0:
    / num_drafts; NaN when the denominator is 0), and their 95% bootstrap intervals over requests
    (``unconditional_low`` ... ``conditional_high``; NaN for records without them). Runs with k = 0 or no
    drafts contribute no rows.
    """
    rows = []
    for _, run in _ok(df).iterrows():
        accepted, drafted = _list(run.get("accepted_per_position")), _list(run.get("drafted_per_position"))
        num_drafts = run.get("num_drafts") or 0
        bounds = {f"{name}_{side}": _list(run.get(f"intervals.acceptance.{source}.{side}"))
                  for name, source in (("unconditional", "per_position_acceptance"),
                                       ("conditional", "conditional_acceptance")) for side in ("low", "high")}
        for i, n in enumerate(accepted):
            if not num_drafts:
                break
            previous = num_drafts if i == 0 else accepted[i - 1]
            rows.append({
                **_ids(run), "position": i, "accepted": n, "drafted": drafted[i] if i < len(drafted) else None,
                "num_drafts": num_drafts, "unconditional": n / num_drafts,
                "conditional": n / previous if previous else math.nan,
                **{column: _at(values, i) for column, values in bounds.items()},
            })
    return pd.DataFrame(rows, columns=[*RUN_ID_COLUMNS, "position", "accepted", "drafted", "num_drafts",
                                       "unconditional", "conditional", *PER_POSITION_BOUNDS])


PER_POSITION_BOUNDS = ("unconditional_low", "unconditional_high", "conditional_low", "conditional_high")


def _at(values: list, i: int) -> float:
    value = values[i] if i < len(values) else None
    return float(value) if value is not None else math.nan


def per_request(df: pd.DataFrame) -> pd.DataFrame:
    """Acceptance per request, one row per (run, request), from ``acceptance_histogram_per_request``.

    Columns: run ids, ``request_id``, ``num_drafts`` (the request's verifications that carried drafts),
    ``num_accepted_tokens`` and ``acceptance_length`` = 1 + accepted / drafts (NaN without drafts).
    """
    rows = []
    for _, run in _ok(df).iterrows():
        histograms = run.get("acceptance_histogram_per_request")
        if not isinstance(histograms, dict):
            continue
        for request_id, histogram in histograms.items():
            histogram = _list(histogram)
            drafts = sum(histogram)
            accepted = sum(j * n for j, n in enumerate(histogram))
            rows.append({**_ids(run), "request_id": request_id, "num_drafts": drafts,
                         "num_accepted_tokens": accepted,
                         "acceptance_length": 1 + accepted / drafts if drafts else math.nan})
    return pd.DataFrame(rows, columns=[*RUN_ID_COLUMNS, "request_id", "num_drafts", "num_accepted_tokens",
                                       "acceptance_length"])


def _repeat_values(run, metric: str) -> list[float]:
    """The run's per-repeat values of ``metric`` (``repeats.<metric>``; its one value for older records)."""
    values = _list(run.get(f"repeats.{metric}"))
    if not values and pd.notna(run.get(metric)):
        values = [run.get(metric)]
    return [float(v) for v in values if v is not None and pd.notna(v)]


def _speedup_bounds(runs: pd.DataFrame, metric: str) -> tuple[list, list]:
    """Per run, the 95% interval of its speedup from its repeats and its group's k=0 repeats (pooled over
    the group's k=0 runs): :func:`specexp.measure.intervals.ratio_interval`. NaN for k=0 runs (the reference)
    and where either side has fewer than two repeats."""
    from specexp.measure.intervals import ratio_interval

    baselines: dict = {}
    for _, run in runs[runs["k"] == 0].iterrows():
        baselines.setdefault(run[GROUP_KEY], []).extend(_repeat_values(run, metric))
    low, high = [], []
    for _, run in runs.iterrows():
        base = baselines.get(run[GROUP_KEY], [])
        bounds = ratio_interval(_repeat_values(run, metric), base) if run["k"] != 0 and base else {}
        low.append(bounds.get("low") if bounds.get("low") is not None else math.nan)
        high.append(bounds.get("high") if bounds.get("high") is not None else math.nan)
    return low, high


def speedup(df: pd.DataFrame, metric: str = "output_tokens_per_s") -> pd.DataFrame:
    """Finished runs with ``baseline_<metric>`` and ``speedup`` = metric ÷ the same metric of the k=0 run
    of the same comparison group (same sweep group, pair, workload, backend, engine and sampling; see
    :mod:`specexp.analysis.groups`). ``speedup`` is NaN for a group without a k=0 run; a k=0 run's
    speedup is exactly 1.0. With several k=0 runs in a group their mean is the baseline.

    ``speedup_low`` / ``speedup_high``: its 95% interval from the repeats of both points (delta method on the
    log ratio, :func:`specexp.measure.intervals.ratio_interval`); NaN at k=0 and with a single repeat on
    either side. ``speedup_repeats``: the repeats at this point; ``baseline_repeats``: at k=0."""
    runs = _ok(df).copy()
    if runs.empty:
        for column in (f"baseline_{metric}", "speedup", "speedup_low", "speedup_high"):
            runs[column] = pd.Series(dtype=float)
        return runs
    values = pd.to_numeric(runs[metric], errors="coerce") if metric in runs else pd.Series(math.nan, index=runs.index)
    baseline = values[runs["k"] == 0].groupby(runs[GROUP_KEY]).mean()
    runs[f"baseline_{metric}"] = runs[GROUP_KEY].map(baseline).astype(float)
    runs["speedup"] = values / runs[f"baseline_{metric}"]
    runs.loc[(runs["k"] == 0) & values.notna(), "speedup"] = 1.0
    runs["speedup_low"], runs["speedup_high"] = _speedup_bounds(runs, metric)
    runs["speedup_repeats"] = [len(_repeat_values(run, metric)) for _, run in runs.iterrows()]
    base_counts = {key: sum(len(_repeat_values(run, metric)) for _, run in group.iterrows())
                   for key, group in runs[runs["k"] == 0].groupby(GROUP_KEY)}
    runs["baseline_repeats"] = runs[GROUP_KEY].map(base_counts)
    return runs.reset_index(drop=True)


def step_breakdown(df: pd.DataFrame) -> pd.DataFrame:
    """Mean time per engine step by phase, one row per (run, phase): columns run ids, ``phase``
    (schedule/draft/verify/sample), ``ms``, ``source``. Uses decode steps from steps.parquet
    (``steps.decode_<phase>``) when loaded, else the run-level ``<phase>.mean`` (all steps, prefill
    included: ``source`` says which). A phase a backend does not time (hf has no schedule phase) is NaN."""
    rows = []
    for _, run in _ok(df).iterrows():
        decode = pd.notna(run.get("steps.decode_verify_ms"))
        for phase in STEP_PHASES:
            value = run.get(f"steps.decode_{phase}") if decode else run.get(f"{phase}.mean")
            rows.append({**_ids(run), "phase": phase.removesuffix("_ms"),
                         "ms": float(value) if value is not None and pd.notna(value) else math.nan,
                         "source": "decode steps" if decode else "all steps"})
    return pd.DataFrame(rows, columns=[*RUN_ID_COLUMNS, "phase", "ms", "source"])


def _capture_rows(per_size) -> list[dict]:
    """Normalise ``graph_capture_per_size`` to ``[{"manager", "size", "max_seq_len", "num_speculative_tokens",
    "capture_bytes", "capture_s"}]`` (``max_seq_len``: the graph's key-length bucket; ``num_speculative_tokens``:
    the k its graph is specialised to; None when not recorded).

    Accepted shapes: a list of dicts (keys ``manager``, ``size``/``num_reqs``/``batch_size``/
    ``num_tokens``, ``capture_bytes``/``bytes``/``graph_capture_bytes``, ``capture_s``/``s``/
    ``graph_capture_s``); or ``{manager: {size: {...same keys...} or bytes}}``.
    """
    def pick(entry: dict, *names):
        return next((entry[n] for n in names if n in entry and entry[n] is not None), None)

    def one(manager, size, entry) -> dict:
        if not isinstance(entry, dict):
            entry = {"capture_bytes": entry}
        return {
            "manager": str(pick(entry, "manager") or manager),
            "size": pick(entry, "size", "num_reqs", "batch_size", "num_tokens") if size is None else size,
            "max_seq_len": pick(entry, "max_seq_len"),
            "num_speculative_tokens": pick(entry, "num_speculative_tokens"),
            "capture_bytes": pick(entry, "capture_bytes", "bytes", "graph_capture_bytes", "free_memory_bytes"),
            "capture_s": pick(entry, "capture_s", "s", "graph_capture_s"),
        }

    if isinstance(per_size, list):
        return [one(None, None, e) for e in per_size if isinstance(e, dict)]
    rows = []
    if isinstance(per_size, dict):
        for manager, sizes in per_size.items():
            if isinstance(sizes, dict) and not {"capture_bytes", "bytes"} & set(sizes):
                for size, entry in sizes.items():
                    rows.append(one(manager, int(size) if str(size).isdigit() else size, entry))
            elif isinstance(sizes, list):
                rows.extend(one(manager, None, e) for e in sizes if isinstance(e, dict))
            else:
                rows.append(one(manager, None, sizes))
    return rows


def graph_capture(df: pd.DataFrame) -> pd.DataFrame:
    """CUDA-graph capture cost per (run, manager, captured size, k, key-length bucket): run ids,
    ``engine.max_num_seqs``, ``manager``, ``size``, ``max_seq_len``, ``num_speculative_tokens``, ``capture_bytes``,
    ``capture_s``. Empty on CPU runs (their graph metrics are null)."""
    rows = []
    for _, run in _ok(df).iterrows():
        for entry in _capture_rows(run.get("graph_capture_per_size")):
            rows.append({**_ids(run), "engine.max_num_seqs": run.get("engine.max_num_seqs"), **entry})
    out = pd.DataFrame(rows, columns=[*RUN_ID_COLUMNS, "engine.max_num_seqs", "manager", "size", "max_seq_len",
                                      "num_speculative_tokens", "capture_bytes", "capture_s"])
    for column in ("capture_bytes", "capture_s"):
        out[column] = pd.to_numeric(out[column], errors="coerce")
    return out


def has_graph_data(df: pd.DataFrame) -> bool:
    """Whether any finished run recorded graph-capture metrics (false on CPU, where they are null)."""
    runs = _ok(df)
    return "graph_capture_bytes" in runs and runs["graph_capture_bytes"].notna().any()
