"""How sure a figure is: intervals over repeats, over requests, and for a ratio of two measured means.

Three kinds, each at 95% (:data:`CONFIDENCE`; the level is fixed so every record reads the same):

- **Over repeats** (:func:`repeat_summary`): a latency or throughput figure measured once per repeat gives
  ``mean``, ``std`` (sample standard deviation, n - 1) and Student's t interval ``mean ± t(0.975, n-1) · std
  / sqrt(n)``. With one repeat there is no spread to measure: ``std``, ``low`` and ``high`` are ``None``.
- **Over requests** (:func:`bootstrap_acceptance`): acceptance figures are ratios of counts pooled over a
  run's requests. The *resampling unit is the request* (one prompt's whole generation): ``resamples`` times,
  as many requests as the run had are drawn with replacement (numpy's PCG64 seeded with ``seed``), their
  acceptance histograms summed, and the figure recomputed; the interval is the 2.5th..97.5th percentile of
  those figures. Requests are the unit because drafts within one request are not independent (one hard
  prompt rejects many in a row); treating drafts as independent would make the interval too narrow.
- **Ratio of two means** (:func:`ratio_interval`, speedup = tokens/s at k ÷ tokens/s at k = 0): the delta
  method on the log scale with Welch's degrees of freedom, from each point's repeats; ``None`` bounds unless
  both points have at least two repeats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 1000
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile_975(df: float) -> float:
    """The 97.5th percentile of Student's t with ``df`` (>= 1, may be fractional) degrees of freedom: the t
    whose upper tail 0.5 · I_{df/(df+t²)}(df/2, 1/2) is 0.025, by bisection (to 1e-9)."""
    if df < 1:
        raise ValueError(f"degrees of freedom {df} < 1")
    lo, hi = 0.0, 20.0  # t(0.975, 1) = 12.706 is the largest
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        upper_tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + mid * mid))
        lo, hi = (mid, hi) if upper_tail > (1 - CONFIDENCE) / 2 else (lo, mid)
    return (lo + hi) / 2


def _present(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def repeat_summary(values: Sequence[float | None]) -> dict:
    """``{"mean", "std", "low", "high", "n"}`` of one figure's per-repeat values (``None`` values left out; all
    ``None`` but ``n`` when none is left; ``std``/``low``/``high`` ``None`` with a single value)."""
    present = _present(values)
    n = len(present)
    if n == 0:
        return {"mean": None, "std": None, "low": None, "high": None, "n": 0}
    mean = sum(present) / n
    if n == 1:
        return {"mean": mean, "std": None, "low": None, "high": None, "n": 1}
    std = math.sqrt(sum((v - mean) ** 2 for v in present) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return {"mean": mean, "std": std, "low": mean - half, "high": mean + half, "n": n}


def relative_std(values: Sequence[float | None]) -> float | None:
    """std / mean of the values (``None`` with fewer than two, or a zero mean)."""
    summary = repeat_summary(values)
    if summary["std"] is None or not summary["mean"]:
        return None
    return summary["std"] / abs(summary["mean"])


def ratio_interval(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> dict:
    """mean(numerator) / mean(denominator) with a 95% interval: ``{"value", "low", "high", "n_numerator",
    "n_denominator"}``. The log of the ratio has variance ≈ s_a²/(n_a·m_a²) + s_b²/(n_b·m_b²) (delta
    method); the interval is exp(log ratio ± t · se) with Welch–Satterthwaite degrees of freedom. Bounds are
    ``None`` unless both sides have at least two positive values."""
    a, b = _present(numerator), _present(denominator)
    out = {"value": None, "low": None, "high": None, "n_numerator": len(a), "n_denominator": len(b)}
    if not a or not b:
        return out
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    if mean_b == 0:
        return out
    out["value"] = mean_a / mean_b
    if len(a) < 2 or len(b) < 2 or mean_a <= 0 or mean_b <= 0:
        return out
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1) / (len(a) * mean_a ** 2)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1) / (len(b) * mean_b ** 2)
    se = math.sqrt(var_a + var_b)
    if se == 0:
        out["low"] = out["high"] = out["value"]
        return out
    df = (var_a + var_b) ** 2 / (var_a ** 2 / (len(a) - 1) + var_b ** 2 / (len(b) - 1))
    half = t_quantile_975(max(df, 1.0)) * se
    out["low"], out["high"] = out["value"] * math.exp(-half), out["value"] * math.exp(half)
    return out


# --------------------------------------------------------------------------------- bootstrap over requests


def _counts(histograms: Sequence[Sequence[int]]) -> np.ndarray:
    """Per request, ``[num_drafts, accepted_per_position[0], ..., accepted_per_position[k-1]]`` from its
    acceptance histogram (``histogram[j]`` = drafts with exactly j accepted: accepted_per_position[i] is the
    drafts with more than i accepted). Shape [num_requests, k + 1]."""
    hist = np.asarray([list(h) for h in histograms], dtype=float)
    at_least = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # at_least[:, j] = drafts with >= j accepted
    return at_least


def acceptance_figures(counts: np.ndarray) -> dict[str, np.ndarray]:
    """Acceptance figures of pooled count rows ``counts`` [..., k + 1] (see :func:`_counts`):
    ``acceptance_length`` [...], ``per_position_acceptance`` and ``conditional_acceptance`` [..., k]; NaN
    where a denominator is 0 (no drafts, or no draft reaching the position)."""
    drafts, accepted = counts[..., 0], counts[..., 1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        length = np.where(drafts > 0, 1.0 + accepted.sum(axis=-1) / drafts, np.nan)
        per_position = np.where(drafts[..., None] > 0, accepted / drafts[..., None], np.nan)
        previous = counts[..., :-1]
        conditional = np.where(previous > 0, accepted / previous, np.nan)
    return {"acceptance_length": length, "per_position_acceptance": per_position,
            "conditional_acceptance": conditional}


def _percentiles(samples: np.ndarray) -> tuple[list, list]:
    """2.5th and 97.5th percentiles over axis 0, ignoring NaN; ``None`` where every sample is NaN."""
    low, high = [], []
    columns = samples.reshape(samples.shape[0], -1)
    for column in columns.T:
        column = column[~np.isnan(column)]
        if column.size == 0:
            low.append(None)
            high.append(None)
        else:
            lo, hi = np.percentile(column, [100 * (1 - CONFIDENCE) / 2, 100 * (1 + CONFIDENCE) / 2])
            low.append(float(lo))
            high.append(float(hi))
    return low, high


def bootstrap_acceptance(histograms: Sequence[Sequence[int]], seed: int = 0,
                         resamples: int = DEFAULT_RESAMPLES) -> dict:
    """Seeded 95% bootstrap intervals, over requests, of a run's acceptance figures.

    ``histograms``: one acceptance histogram per request (length k + 1; ``histogram[j]`` = the request's drafts
    with exactly j tokens accepted). Returns ``{"unit": "request", "num_requests", "resamples", "seed",
    "acceptance_length": {"low", "high"}, "per_position_acceptance": {"low": [k], "high": [k]},
    "conditional_acceptance": {"low": [k], "high": [k]}}``; bounds are ``None`` where no resample defines the
    figure. The same ``seed`` and histograms always give the same intervals."""
    out = {"unit": "request", "num_requests": len(histograms), "resamples": resamples, "seed": seed}
    empty = {"low": None, "high": None}
    if not histograms or resamples < 1:
        return {**out, "acceptance_length": empty, "per_position_acceptance": empty,
                "conditional_acceptance": empty}
    counts = _counts(histograms)
    n = counts.shape[0]
    rng = np.random.Generator(np.random.PCG64(seed))
    picks = rng.integers(0, n, size=(resamples, n))
    weights = np.zeros((resamples, n))
    np.add.at(weights, (np.repeat(np.arange(resamples), n), picks.ravel()), 1.0)
    figures = acceptance_figures(weights @ counts)  # [resamples, k + 1] pooled counts per resample
    length_low, length_high = _percentiles(figures["acceptance_length"])
    result = {**out, "acceptance_length": {"low": length_low[0], "high": length_high[0]}}
    for name in ("per_position_acceptance", "conditional_acceptance"):
        low, high = _percentiles(figures[name])
        result[name] = {"low": low, "high": high}
    return result


def bootstrap_ratio(successes: np.ndarray, trials: np.ndarray, seed: int = 0,
                    resamples: int = DEFAULT_RESAMPLES) -> dict:
    """Seeded 95% bootstrap interval of Σ successes / Σ trials over units (one entry per unit, e.g. per
    request): ``{"low", "high", "num_units", "resamples", "seed"}`` (bounds ``None`` without trials)."""
    successes, trials = np.asarray(successes, dtype=float), np.asarray(trials, dtype=float)
    out = {"low": None, "high": None, "num_units": int(successes.size), "resamples": resamples, "seed": seed}
    if successes.size == 0 or trials.sum() == 0:
        return out
    rng = np.random.Generator(np.random.PCG64(seed))
    picks = rng.integers(0, successes.size, size=(resamples, successes.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        values = successes[picks].sum(axis=1) / trials[picks].sum(axis=1)
    low, high = _percentiles(values[:, None])
    out["low"], out["high"] = low[0], high[0]
    return out
