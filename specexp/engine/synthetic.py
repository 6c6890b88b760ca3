"""Synthetic acceptance: which per-position acceptance a `synthetic` rejection sampler imposes.

Three ways to say it, at most one of the last two (vLLM 0.33's forms):

- `synthetic_acceptance_rate` a: every draft position is accepted with probability a given the ones before,
  whatever the tokens (specexp's own form): position i is reached with probability a^(i+1).
- `synthetic_acceptance_rates` [r_0, ..., r_{K-1}]: per position, the *unconditional* probability that drafts
  0..i are all accepted; non-increasing, each in [0, 1], one per draft position (K = num_speculative_tokens).
- `synthetic_acceptance_length` L in [1, K+1]: tokens per verification, bonus included; spread as vLLM does,
  with the least variance: r = [1, ..., 1, frac, 0, ..., 0] with L - 1 = (number of ones) + frac.

All three resolve to the unconditional rates r (:func:`synthetic_rates`); the sampler accepts position i
with the conditional probability r_i / r_{i-1} (:func:`conditional_rates`), so the expected acceptance
length is 1 + sum(r).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specexp.engine.config import EngineConfigError


def rates_from_length(length: float, k: int) -> list[float]:
    """vLLM's minimum-variance per-position rates (length k) of acceptance length `length` in [1, k+1]."""
    drafts = length - 1.0
    full = min(int(math.floor(drafts)), k)
    rates = [1.0] * full + ([drafts - full] if full < k else [])
    return (rates + [0.0] * k)[:k]


def synthetic_rates(k: int, rate: float, rates: Sequence[float] | None = None,
                    length: float | None = None) -> list[float]:
    """The unconditional per-position acceptance float[k] that a synthetic sampler imposes (module
    docstring); EngineConfigError with one line naming the bad value. k = 0: []."""
    if rates is not None and length is not None:
        raise EngineConfigError(
            f"speculator.synthetic_acceptance_rates={list(rates)} and synthetic_acceptance_length={length} are "
            "both set: set one of them (or neither, for synthetic_acceptance_rate)")
    if not 0.0 <= rate <= 1.0:
        raise EngineConfigError(f"speculator.synthetic_acceptance_rate={rate}: must be in [0, 1]")
    if k == 0:
        return []
    if rates is not None:
        values = list(rates)
        if len(values) != k:
            raise EngineConfigError(
                f"speculator.synthetic_acceptance_rates={values} has {len(values)} entries: give one per draft "
                f"position, {k} (speculator.num_speculative_tokens)")
        bad = [r for r in values if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0]
        if bad:
            raise EngineConfigError(f"speculator.synthetic_acceptance_rates={values}: entry {bad[0]!r} is not in"
                                    " [0, 1]")
        if any(b > a for a, b in zip(values, values[1:])):
            raise EngineConfigError(
                f"speculator.synthetic_acceptance_rates={values} increases: entry i is the unconditional "
                "probability that drafts 0..i are all accepted, so it never increases with i")
        return [float(r) for r in values]
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, (int, float)) or not 1.0 <= length <= k + 1:
            raise EngineConfigError(
                f"speculator.synthetic_acceptance_length={length!r}: must be in [1, {k + 1}] (tokens per "
                f"verification, bonus included, at k={k})")
        return rates_from_length(float(length), k)
    return [rate ** (i + 1) for i in range(k)]


def conditional_rates(rates: Sequence[float]) -> list[float]:
    """Per position, the probability of accepting it given drafts 0..i-1 were: r_i / r_{i-1} (r_{-1} = 1;
    0 past a position that is never reached)."""
    out, previous = [], 1.0
    for r in rates:
        out.append(r / previous if previous > 0 else 0.0)
        previous = r
    return out
