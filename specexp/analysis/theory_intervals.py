"""Intervals for the theory fit of :mod:`specexp.analysis.theory` and for its "best k" claims.

- **α**: a seeded bootstrap over requests (:func:`specexp.measure.intervals.bootstrap_ratio`). The unit is a
  prompt: its successes and trials (the geometric model's, :func:`specexp.analysis.theory.acceptance_trials`)
  are summed over every run of the group that served it, and prompts are resampled with replacement. Records
  without per-request drafted counts (``drafted_per_position_per_request``, written since repeats exist) use
  ``accepted_per_position[i-1]`` as the trials at position i, which counts drafts cut short by max_new_tokens
  as trials; the interval is then rescaled to the fitted α and marked ``approximate``.
- **c**: per repeat r, the group's c from repeat r's decode steps (``steps.by_repeat.*``), then Student's t
  interval over the repeats (:func:`specexp.measure.intervals.repeat_summary`); NaN with one repeat.
- **best k (theory)**: the range of the best k over the corners (α low, c high) .. (α high, c low).
- **best k (measured)**: the k with the highest measured speedup, its interval, and whether the next-best
  k's speedup lies inside that interval (then the data do not tell the two apart).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specexp.measure.intervals import bootstrap_ratio, repeat_summary

BOOTSTRAP_SEED = 0


def _list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else []


def request_trials(histogram: list[int], drafted: list[int] | None) -> tuple[int, int]:
    """(successes, trials) of one request from its acceptance histogram and drafted-per-position counts
    (``None``: unknown, see the module docstring)."""
    from specexp.analysis.theory import acceptance_trials

    histogram = [int(n) for n in histogram]
    drafts = sum(histogram)
    accepted = [sum(histogram[i + 1:]) for i in range(len(histogram) - 1)]
    if drafted is None:
        drafted = [drafts] + accepted[:-1]
    return acceptance_trials(accepted, [int(d) for d in drafted], drafts)


def alpha_interval(spec_runs: pd.DataFrame, alpha: float, seed: int = BOOTSTRAP_SEED) -> dict:
    """``{"alpha_low", "alpha_high", "alpha_requests", "alpha_interval"}`` of a group's runs with k >= 1
    (``alpha_interval``: ``bootstrap``, ``approximate`` or ``none``)."""
    per_prompt: dict[str, list[int]] = {}
    exact = True
    for _, run in spec_runs.iterrows():
        histograms = run.get("acceptance_histogram_per_request")
        drafted = run.get("drafted_per_position_per_request")
        if not isinstance(histograms, dict):
            continue
        if not isinstance(drafted, dict) or not drafted:
            exact, drafted = False, {}
        for request_id, histogram in histograms.items():
            s, t = request_trials(_list(histogram), _list(drafted[request_id]) if request_id in drafted else None)
            totals = per_prompt.setdefault(str(request_id), [0, 0])
            totals[0] += s
            totals[1] += t
    none = {"alpha_low": math.nan, "alpha_high": math.nan, "alpha_requests": len(per_prompt), "alpha_interval": "none"}
    if not per_prompt or math.isnan(alpha):
        return none
    counts = np.array(list(per_prompt.values()), dtype=float)
    boot = bootstrap_ratio(counts[:, 0], counts[:, 1], seed)
    if boot["low"] is None:
        return none
    low, high = boot["low"], boot["high"]
    if not exact:
        fitted = counts[:, 0].sum() / counts[:, 1].sum()
        low, high = low * alpha / fitted, high * alpha / fitted
    return {"alpha_low": min(low, 1.0), "alpha_high": min(high, 1.0), "alpha_requests": len(per_prompt),
            "alpha_interval": "bootstrap" if exact else "approximate"}


def c_interval(group: pd.DataFrame) -> dict:
    """``{"c_low", "c_high", "c_repeats"}``: the group's c per repeat (median over its k >= 1 runs of
    draft forward ÷ the k=0 run's target decode step, both of that repeat), t interval over repeats."""
    base = group[group["k"] == 0]
    targets = [_list(v) for v in base.get("steps.by_repeat.decode_verify_ms", pd.Series(dtype=object))]
    targets = [t for t in targets if t]
    spec = group[group["k"] > 0]
    forwards = [_list(v) for v in spec.get("steps.by_repeat.draft_ms_per_forward", pd.Series(dtype=object))]
    forwards = [f for f in forwards if f]
    repeats = min([len(t) for t in targets] + [len(f) for f in forwards], default=0)
    if not targets or not forwards or repeats < 2:
        return {"c_low": math.nan, "c_high": math.nan, "c_repeats": repeats}
    per_repeat = []
    for r in range(repeats):
        target = np.nanmean([t[r] if t[r] is not None else math.nan for t in targets])
        ratios = [f[r] / target for f in forwards if f[r] is not None and target]
        if ratios:
            per_repeat.append(float(np.median(ratios)))
    summary = repeat_summary(per_repeat)
    return {"c_low": summary["low"] if summary["low"] is not None else math.nan,
            "c_high": summary["high"] if summary["high"] is not None else math.nan, "c_repeats": summary["n"]}


def best_k_range(alpha_low: float, alpha_high: float, c_low: float, c_high: float, c: float, k_max: int) -> str:
    """The theory's best k over the fit's interval corners, ``"2-4"`` (``"3"`` when they agree; ``"–"``
    without an α interval)."""
    from specexp.analysis.theory import best_k

    if any(math.isnan(v) for v in (alpha_low, alpha_high)) or math.isnan(c):
        return "–"
    hi_c = c if math.isnan(c_high) else c_high
    lo_c = c if math.isnan(c_low) else c_low
    ks = [best_k(alpha_low, hi_c, k_max), best_k(alpha_high, lo_c, k_max)]
    ks = [k for k in ks if k is not None]
    if not ks:
        return "–"
    return str(min(ks)) if min(ks) == max(ks) else f"{min(ks)}-{max(ks)}"


def measured_best(group: pd.DataFrame) -> dict:
    """The measured best k of a group and whether the next-best k lies inside its speedup interval:
    ``best_k_measured``, ``best_speedup_measured``, ``best_speedup_low``/``high``, ``next_best_k_measured``,
    ``next_best_speedup_measured`` and ``next_best_inside`` (True, False, or None without an interval)."""
    measured = group.dropna(subset=["speedup"]).sort_values("speedup", ascending=False, kind="stable")
    out = {"best_k_measured": None, "best_speedup_measured": math.nan, "best_speedup_low": math.nan,
           "best_speedup_high": math.nan, "next_best_k_measured": None, "next_best_speedup_measured": math.nan,
           "next_best_inside": None}
    if measured.empty:
        return out
    best = measured.iloc[0]
    out.update(best_k_measured=int(best["k"]), best_speedup_measured=float(best["speedup"]),
               best_speedup_low=float(best.get("speedup_low", math.nan)),
               best_speedup_high=float(best.get("speedup_high", math.nan)))
    if len(measured) > 1:
        second = measured.iloc[1]
        out.update(next_best_k_measured=int(second["k"]), next_best_speedup_measured=float(second["speedup"]))
        low = out["best_speedup_low"]
        if int(best["k"]) == 0:  # the reference has no interval of its own: use the runner-up's
            upper = float(second.get("speedup_high", math.nan))
            out["next_best_inside"] = None if math.isnan(upper) else bool(upper >= 1.0)
        else:
            out["next_best_inside"] = None if math.isnan(low) else bool(second["speedup"] >= low)
    return out


def best_k_claim(fit) -> str:
    """One line for a group's measured best k: ``k=2 (1.31 [1.20, 1.43]); next best k=3 (1.28) is inside
    its interval: not told apart`` (or "outside: k=2 is best", or "no interval: 1 repeat")."""
    k = fit.get("best_k_measured")
    if k is None or (isinstance(k, float) and math.isnan(k)):
        return "– (no k=0 run)"
    value, low, high = fit.get("best_speedup_measured"), fit.get("best_speedup_low"), fit.get("best_speedup_high")
    bounds = "" if low is None or math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
    text = f"k={int(k)} ({value:.2f}{bounds})"
    second = fit.get("next_best_k_measured")
    if second is None or (isinstance(second, float) and math.isnan(second)):
        return text
    inside = fit.get("next_best_inside")
    if isinstance(inside, float) and math.isnan(inside):
        inside = None
    if int(k) == 0 and inside is not None:  # the reference: is 1 inside the runner-up's interval?
        verdict = ("its interval reaches 1: not told apart" if inside else
                   "its interval stays below 1: k=0 is best")
        return f"{text}; next best k={int(second)} ({fit.get('next_best_speedup_measured'):.2f}): {verdict}"
    verdict = {True: "inside the interval: not told apart", False: f"outside the interval: k={int(k)} is best",
               None: "no interval (one repeat): not tested"}[None if inside is None else bool(inside)]
    return f"{text}; next best k={int(second)} ({fit.get('next_best_speedup_measured'):.2f}) {verdict}"
