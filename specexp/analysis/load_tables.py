"""Tables of serving-load sweeps (``+exp=load_sweep``, ``+exp=rate_sweep``): one row per run along the load
axis, the best k at each load, and the oracle bound against the best static depth and what was measured.

The *load axis* is ``workload.max_concurrency`` (a closed loop) or ``workload.request_rate`` (Poisson), the
one that varies; a *series* is every other experiment-defining setting but k (pair, backend, ...): runs of
one series at one load differ only in k.

    runs = specexp.analysis.load_sweep("experiments/runs")
    load_table(runs)                               # throughput, TPOT, per-user tokens/s, verify share ...
    best_k_table(runs)                             # the fastest k at each load
    oracle_table(runs)                             # measured best vs modelled best static vs per-step oracle
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specexp.analysis.groups import comparison_columns
from specexp.analysis.metrics import _ok
from specexp.analysis.oracle import per_step_oracle, request_matches, static_k_table, step_costs
from specexp.analysis.traces import load_traces

LOAD_AXES = ("workload.max_concurrency", "workload.request_rate")
BURST_AXIS = "engine.max_num_seqs"  # all requests at once: the batch limit is the load
SERIES = "series"
LOAD_COLUMNS = ("output_tokens_per_s", "requests_per_s", "tokens_per_s_per_user.p50", "tpot_ms.p50", "tpot_ms.p99",
                "ttft_ms.p50", "queue_ms.p50", "num_reqs_per_step.mean", "batch_occupancy.mean", "verify_share.mean",
                "goodput_requests_per_s", "acceptance_length")


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


def load_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: series, load, k and the :data:`LOAD_COLUMNS` it has, sorted by series, load, k."""
    runs = with_series(runs)
    if runs.empty:
        return pd.DataFrame(columns=[SERIES, "load", "k", *LOAD_COLUMNS])
    axis = load_axis(runs)
    table = runs.assign(load=runs[axis])[[SERIES, "load", "k", *[c for c in LOAD_COLUMNS if c in runs]]]
    return table.sort_values([SERIES, "load", "k"]).reset_index(drop=True)


def best_k_table(runs: pd.DataFrame, metric: str = "output_tokens_per_s") -> pd.DataFrame:
    """Per series and load: the k with the highest ``metric``, its value, k = 0's and the speedup."""
    table = load_table(runs)
    rows = []
    for (series, load), group in table.groupby([SERIES, "load"], sort=True):
        best = group.loc[group[metric].idxmax()]
        base = group.loc[group["k"] == 0, metric]
        rows.append({SERIES: series, "load": load, "best_k": int(best["k"]), metric: best[metric],
                     f"{metric}_k0": float(base.iloc[0]) if len(base) else None,
                     "speedup": float(best[metric] / base.iloc[0]) if len(base) and base.iloc[0] else None})
    return pd.DataFrame(rows, columns=[SERIES, "load", "best_k", metric, f"{metric}_k0", "speedup"])


def _steps(run_dir: str) -> pd.DataFrame:
    return pd.read_parquet(Path(run_dir) / "steps.parquet")


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
    best speedup over k = 0, the modelled best static depth and its speedup (:func:`per_step_oracle` on the
    deepest run's steps), the per-step oracle's speedup, and the acceptance length each measured k replays to
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
        oracle = per_step_oracle(traces, step_costs({int(r.k): _steps(r.run_dir) for r in group.itertuples()}))
        measured = group.set_index("k")["output_tokens_per_s"]
        best_static = oracle.best_static_k
        row = {SERIES: series, "load": load, "max_k": int(deepest["k"]),
               "measured_best_k": int(measured.idxmax()), "measured_speedup": measured.max() / measured.loc[0],
               "model_best_static_k": best_static,
               "model_best_static_speedup": oracle.speedup(oracle.static_tokens_per_s[best_static]),
               "oracle_speedup": oracle.speedup(oracle.oracle_tokens_per_s),
               "oracle_k_mean": sum(oracle.oracle_k) / len(oracle.oracle_k)}
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
