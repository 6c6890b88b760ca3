"""Speedup over no speculation, measured and as Leviathan et al. predict it: (1 - a^(k+1)) / ((1 - a)(k c + 1))
for acceptance rate a, depth k and cost ratio c (draft step / target step). Shared by gpu_cudagraphs.py (which
measures) and cudagraphs_report.py (which re-derives the figures from a result's raw runs). Standalone rather
than `specexp.analysis.theory.expected_speedup` (the same formula) because the GPU benchmarks must run with only
torch, safetensors and tokenizers, and specexp.analysis needs pandas."""

from __future__ import annotations

import statistics


def expected_acceptance_length(a: float, k: int) -> float:
    """Expected tokens per step, (1 - a^(k+1)) / (1 - a): the formula's numerator; a in [0, 1), k >= 0."""
    return (1 - a ** (k + 1)) / (1 - a)


def leviathan_speedup(a: float, k: int, c: float) -> float:
    """Expected tokens per step over the step's cost in target steps (k c + 1); a in [0, 1), k >= 0, c > 0."""
    return expected_acceptance_length(a, k) / (k * c + 1)


def realized_speedup(acceptance_length: float, k: int, c: float) -> float:
    """The formula with the tokens per step a run realized in place of their expectation: acceptance_length /
    (k c + 1). Measured over this, a speedup says how far the engine's step costs are from the formula's alone,
    whatever the run's acceptance draws came to (a seeded synthetic run at a = 0.8 realizes 0.98-1.02 of the
    expected length on 8 x 128 tokens)."""
    return acceptance_length / (k * c + 1)


def add_theory(rows: list[dict], c: float) -> None:
    """Set each end-to-end row's `speedup` (its median tokens/s over the k = 0 baseline), `theory_speedup` and
    `within_15pct_of_theory` (rows with a synthetic acceptance rate only; None for k = 0).

    The formula is a ratio of two factors, and each row also gets both as measured and as predicted, so a miss
    says which one missed: tokens per step (`acceptance_length` vs `theory_acceptance_length`) and a step's
    cost in plain decode steps (`step_cost_in_plain_steps`: its median step over the median step of the k = 0
    rows, vs `theory_step_cost_in_plain_steps` = k c + 1; rows that timed their steps only).

    A step's cost splits further into what the formula prices at 1 and at c (rows that timed their phases):
    `verify_cost_in_plain_steps` (the verify of k + 1 tokens, sampling included, over the median k = 0 step; the
    formula's 1) and `draft_cost_per_token_in_plain_steps` (the draft phase over k, k >= 1; the formula's c).

    The formula prices decoding only, while a request's wall time also holds its prompt's prefill step, which
    costs more with a draft (its prefill of the prompt joins the target's). Rows that timed their steps
    also get the decode phase alone: `decode_ms_per_request` (wall time less the prefill steps),
    `decode_speedup` (the k = 0 rows' median of it over the row's; every request emits the same number of
    tokens at every k, as the benchmark's do) and `decode_within_15pct_of_theory`.

    The baseline is the median of every k = 0 run of the pair, whatever its row's acceptance rate: without a
    draft nothing depends on the rate, so those rows are one configuration measured several times, and a single
    slow k = 0 row would otherwise move every speedup of its rate. rows: dicts with `k`, `acceptance_rate`,
    `output_tokens_per_s` and `output_tokens_per_s_runs` (tokens/s of each run)."""
    runs = [tps for r in rows if r["k"] == 0 for tps in r.get("output_tokens_per_s_runs", [r["output_tokens_per_s"]])]
    if not runs:
        return
    base = statistics.median(runs)
    plain_steps = [r["step_ms_p50"] for r in rows if r["k"] == 0 and r.get("step_ms_p50")]
    plain_step_ms = statistics.median(plain_steps) if plain_steps else None
    plain_decode = [ms for r in rows if r["k"] == 0 and (ms := _decode_ms_per_request(r))]
    plain_decode_ms = statistics.median(plain_decode) if plain_decode else None
    for r in rows:
        r["baseline_tokens_per_s"] = base
        r["speedup"] = r["output_tokens_per_s"] / base
        a, k = r["acceptance_rate"], r["k"]
        if plain_step_ms is not None and r.get("step_ms_p50"):
            r["step_cost_in_plain_steps"] = r["step_ms_p50"] / plain_step_ms
            r["theory_step_cost_in_plain_steps"] = k * c + 1
            if r.get("verify_ms_p50") is not None:
                r["verify_cost_in_plain_steps"] = r["verify_ms_p50"] / plain_step_ms
            if k > 0 and r.get("draft_ms_p50") is not None:
                r["draft_cost_per_token_in_plain_steps"] = r["draft_ms_p50"] / k / plain_step_ms
        decode_ms = _decode_ms_per_request(r)
        if plain_decode_ms is not None and decode_ms:
            r["decode_ms_per_request"] = decode_ms
            r["decode_speedup"] = plain_decode_ms / decode_ms
        if a is not None:
            r["theory_acceptance_length"] = expected_acceptance_length(a, k)
            r["theory_speedup"] = leviathan_speedup(a, k, c)
            # a k = 0 row is (part of) the baseline itself: its spread is noise, not a prediction to check
            r["within_15pct_of_theory"] = None if k == 0 else within_tolerance(r["speedup"], r["theory_speedup"])
            if "decode_speedup" in r:
                r["decode_within_15pct_of_theory"] = (
                    None if k == 0 else within_tolerance(r["decode_speedup"], r["theory_speedup"]))


def count_within(rows: list[dict], c: float, tolerance: float = 0.15) -> tuple[int, int]:
    """(points within `tolerance` of the formula at cost ratio c, points checked): the rows with k >= 1 and a
    synthetic acceptance rate, their `speedup` (set by add_theory) against leviathan_speedup(a, k, c). For
    asking how a verdict depends on how c was measured."""
    checked = [r for r in rows if r["k"] > 0 and r.get("acceptance_rate") is not None and "speedup" in r]
    within = sum(within_tolerance(r["speedup"], leviathan_speedup(r["acceptance_rate"], r["k"], c), tolerance)
                 for r in checked)
    return within, len(checked)


def within_tolerance(measured: float, predicted: float, tolerance: float = 0.15) -> bool:
    """measured / predicted is within `tolerance` of 1."""
    return abs(measured / predicted - 1) <= tolerance


def _decode_ms_per_request(row: dict) -> float | None:
    """A request's wall ms less its prefill steps' (None for rows that did not time them)."""
    if "wall_ms_per_request" not in row or "prefill_step_ms_mean" not in row:
        return None
    return row["wall_ms_per_request"] - row["prefill_steps_per_request"] * row["prefill_step_ms_mean"]
