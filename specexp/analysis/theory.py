"""Leviathan et al.'s model of speculative decoding (Fast Inference from Transformers via Speculative
Decoding, 2023, §3.1-3.3), fitted to measured runs.

Model: each draft token is accepted independently with probability α, given that all earlier ones were.
With k drafts per verification and cost ratio c = (time of one draft forward) ÷ (time of one target
forward), the expected tokens emitted per verification and the expected wall-time speedup over plain
decoding are

    expected_acceptance_length(α, k) = (1 - α^(k+1)) / (1 - α)
    expected_speedup(α, c, k)        = (1 - α^(k+1)) / ((1 - α)(k·c + 1))

The speedup formula assumes a target forward over k+1 tokens costs as much as over 1 token (memory-bound
decoding). Where it does not — always on CPU, and at large k on a GPU — measured speedup falls short;
:func:`with_theory` therefore also gives ``verify_cost_ratio`` (verify time at depth k ÷ at k=0) and the
speedup the model predicts once that measured growth is put in the denominator.

How α and c are estimated (per comparison group, i.e. one depth curve; see :mod:`specexp.analysis.groups`):

- **α**: maximum-likelihood estimate of the geometric model from the per-position counts of every run
  with k >= 1: α = Σ successes / Σ trials, where successes = Σ_i accepted_per_position[i] and the trials at
  position i are the drafts that put position i to the test: num_drafts for i = 0, else
  min(accepted_per_position[i-1], drafted_per_position[i]) (all earlier positions accepted and position i
  drafted). A draft cut short by max_new_tokens thus counts only the positions it proposed.
- **c**: for each run with k >= 1, ``steps.draft_ms_per_forward`` (mean draft_ms ÷ k over decode steps
  where every request carried k drafts; one draft forward drafts one token for the whole batch) ÷
  ``steps.decode_verify_ms`` of the group's k=0 run (the mean time of one plain target decode step). The
  group's c is the median over its runs. Without steps.parquet (runs read from W&B) the run-level means
  ``draft_ms.mean / k`` and ``verify_ms.mean`` are used instead (prefill steps included); without a k=0 run
  the run's own verify time stands in for the target step (``c_source`` records which).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specexp.analysis.groups import GROUP_KEY, GROUP_LABEL
from specexp.analysis.metrics import _list, speedup

DEFAULT_K_MAX = 16


def expected_acceptance_length(alpha: float, k: int | np.ndarray) -> float | np.ndarray:
    """(1 - α^(k+1)) / (1 - α): expected tokens per verification with k drafts (k+1 when α = 1)."""
    k = np.asarray(k, dtype=float)
    if alpha is None or (isinstance(alpha, float) and math.isnan(alpha)):
        out = np.full_like(k, np.nan)
    elif alpha >= 1.0:
        out = k + 1.0
    else:
        out = (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)
    return float(out) if out.ndim == 0 else out


def expected_speedup(alpha: float, c: float, k: int | np.ndarray, verify_cost: float | np.ndarray = 1.0):
    """(1 - α^(k+1)) / ((1 - α)(k·c + verify_cost)); ``verify_cost`` = 1 is Leviathan's formula (a verify
    costs one target step), a measured ratio gives the model with verify-cost growth."""
    k = np.asarray(k, dtype=float)
    if c is None or (isinstance(c, float) and math.isnan(c)):
        return np.full_like(k, np.nan) if k.ndim else math.nan
    out = expected_acceptance_length(alpha, k) / (k * c + np.asarray(verify_cost, dtype=float))
    return float(out) if np.ndim(out) == 0 else out


def best_k(alpha: float, c: float, k_max: int = DEFAULT_K_MAX) -> int | None:
    """The k in 0..k_max with the largest expected speedup (None when α or c is unknown)."""
    ks = np.arange(k_max + 1)
    values = expected_speedup(alpha, c, ks)
    if np.isnan(values).all():
        return None
    return int(ks[int(np.nanargmax(values))])


def acceptance_trials(accepted: list[int], drafted: list[int], num_drafts: int) -> tuple[int, int]:
    """(successes, trials) of the geometric model from one run's per-position counts (module docstring)."""
    successes = trials = 0
    for i, n in enumerate(accepted):
        reached = num_drafts if i == 0 else min(accepted[i - 1], drafted[i] if i < len(drafted) else 0)
        successes += n
        trials += reached
    return successes, trials


def fit_alpha(df: pd.DataFrame) -> tuple[float, int]:
    """(α, trials): the pooled maximum-likelihood α of the runs in ``df`` (NaN, 0 without drafts)."""
    successes = trials = 0
    for _, run in df.iterrows():
        accepted, num_drafts = _list(run.get("accepted_per_position")), _number(run.get("num_drafts"))
        if not accepted or math.isnan(num_drafts) or num_drafts == 0:
            continue
        s, t = acceptance_trials(accepted, _list(run.get("drafted_per_position")), int(num_drafts))
        successes, trials = successes + s, trials + t
    return (successes / trials if trials else math.nan), trials


def _number(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def _column(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` as floats (all NaN when absent)."""
    if name not in df:
        return pd.Series(math.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def _target_step_ms(group: pd.DataFrame) -> tuple[float, str]:
    """Mean time of one plain target decode step in the group (k=0 run), and where it came from."""
    baseline = group[group["k"] == 0]
    decode = _column(baseline, "steps.decode_verify_ms").dropna()
    if len(decode):
        return float(decode.mean()), "decode steps"
    overall = _column(baseline, "verify_ms.mean").dropna()
    return (float(overall.mean()), "all steps") if len(overall) else (math.nan, "none")


def run_cost_ratio(run, target_step_ms: float) -> tuple[float, str]:
    """(c, source) of one run with k >= 1 (module docstring)."""
    k = int(run["k"])
    per_forward, source = _number(run.get("steps.draft_ms_per_forward")), "decode steps"
    if math.isnan(per_forward):
        per_forward, source = _number(run.get("draft_ms.mean")) / k, "all steps"
    target = target_step_ms
    if math.isnan(target):
        target = _number(run.get("steps.decode_verify_ms"))
        if math.isnan(target):
            target = _number(run.get("verify_ms.mean"))
        source += ", own verify (no k=0 run)"
    return (per_forward / target if target else math.nan), source


def fit_theory(df: pd.DataFrame, k_max: int = DEFAULT_K_MAX) -> pd.DataFrame:
    """One row per comparison group: ``group_key``, ``group``, ``sweep_group``, ``alpha``, ``alpha_trials``,
    ``c``, ``c_source``, ``target_step_ms``, ``draft_forward_ms`` (c × target_step_ms), ``best_k_theory``
    (argmax of the expected speedup over 0..k_max), ``best_speedup_theory``, ``best_k_measured`` and
    ``best_speedup_measured`` (argmax of measured speedup; NaN without a k=0 run).

    Their intervals (:mod:`specexp.analysis.theory_intervals`): ``alpha_low``/``alpha_high`` (bootstrap over
    requests; ``alpha_requests`` prompts, ``alpha_interval`` says how), ``c_low``/``c_high`` (over
    ``c_repeats`` repeats), ``best_k_theory_range`` (the best k over the interval's corners), and for the
    measured best k ``best_speedup_low``/``high``, ``next_best_k_measured``, ``next_best_speedup_measured`` and
    ``next_best_inside`` (whether the runner-up lies inside the best's interval)."""
    from specexp.analysis import theory_intervals as ti

    runs = speedup(df)
    columns = [GROUP_KEY, GROUP_LABEL, "sweep_group", "alpha", "alpha_low", "alpha_high", "alpha_trials",
               "alpha_requests", "alpha_interval", "c", "c_low", "c_high", "c_repeats", "c_source", "target_step_ms",
               "draft_forward_ms", "best_k_theory", "best_k_theory_range", "best_speedup_theory", "best_k_measured",
               "best_speedup_measured", "best_speedup_low", "best_speedup_high", "next_best_k_measured",
               "next_best_speedup_measured", "next_best_inside"]
    rows = []
    for key, group in runs.groupby(GROUP_KEY, sort=False):
        spec = group[group["k"] > 0]
        alpha, trials = fit_alpha(spec)
        target_ms, target_source = _target_step_ms(group)
        ratios = [run_cost_ratio(run, target_ms) for _, run in spec.iterrows()]
        values = [r for r, _ in ratios if not math.isnan(r)]
        c = float(np.median(values)) if values else math.nan
        k_best = best_k(alpha, c, k_max)
        bounds = {**ti.alpha_interval(spec, alpha), **ti.c_interval(group)}
        rows.append({
            GROUP_KEY: key, GROUP_LABEL: group[GROUP_LABEL].iloc[0], "sweep_group": group["sweep_group"].iloc[0],
            "alpha": alpha, "alpha_trials": trials, "c": c, **bounds,
            "c_source": ratios[0][1] if ratios else target_source, "target_step_ms": target_ms,
            "draft_forward_ms": c * target_ms if not math.isnan(c) else math.nan,
            "best_k_theory": k_best,
            "best_k_theory_range": ti.best_k_range(bounds["alpha_low"], bounds["alpha_high"], bounds["c_low"],
                                                   bounds["c_high"], c, k_max),
            "best_speedup_theory": expected_speedup(alpha, c, k_best) if k_best is not None else math.nan,
            **ti.measured_best(group),
        })
    return pd.DataFrame(rows, columns=columns)


def theory_curve(fits: pd.DataFrame, k_max: int = 8) -> pd.DataFrame:
    """Leviathan's curves per group for k = 0..k_max: ``group_key``, ``group``, ``k``,
    ``theory_acceptance_length``, ``theory_speedup``."""
    rows = []
    for _, fit in fits.iterrows():
        for k in range(k_max + 1):
            rows.append({GROUP_KEY: fit[GROUP_KEY], GROUP_LABEL: fit[GROUP_LABEL], "k": k,
                         "theory_acceptance_length": expected_acceptance_length(fit["alpha"], k),
                         "theory_speedup": expected_speedup(fit["alpha"], fit["c"], k)})
    return pd.DataFrame(rows, columns=[GROUP_KEY, GROUP_LABEL, "k", "theory_acceptance_length", "theory_speedup"])


def with_theory(df: pd.DataFrame, fits: pd.DataFrame | None = None) -> pd.DataFrame:
    """The finished runs with measured ``speedup`` and, at each run's k, ``alpha``, ``c``,
    ``theory_acceptance_length``, ``theory_speedup`` (Leviathan), ``verify_cost_ratio`` (decode verify
    time at this k ÷ at k=0) and ``theory_speedup_verify_cost`` (the model with that measured verify cost
    in place of 1)."""
    runs = speedup(df)
    fits = fit_theory(df) if fits is None else fits
    runs = runs.merge(fits[[GROUP_KEY, "alpha", "c", "target_step_ms"]], on=GROUP_KEY, how="left")
    verify = _column(runs, "steps.decode_verify_ms").fillna(_column(runs, "verify_ms.mean"))
    runs["verify_cost_ratio"] = verify / runs["target_step_ms"]
    runs.loc[runs["k"] == 0, "verify_cost_ratio"] = 1.0
    runs["theory_acceptance_length"] = [expected_acceptance_length(a, k) for a, k in zip(runs["alpha"], runs["k"])]
    runs["theory_speedup"] = [expected_speedup(a, c, k) for a, c, k in zip(runs["alpha"], runs["c"], runs["k"])]
    runs["theory_speedup_verify_cost"] = [
        expected_speedup(a, c, k, v) for a, c, k, v in zip(runs["alpha"], runs["c"], runs["k"],
                                                           runs["verify_cost_ratio"])
    ]
    return runs
