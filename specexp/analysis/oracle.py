"""What choosing k could win: from one run at maximum depth K, the acceptance every static k <= K would have
had, the best static k, and the hindsight-oracle k of each step, turned into speedups with measured step costs.

**Matches (greedy).** A greedy run's step that drafts d tokens from output position p and accepts a of them
shows whether the draft's greedy token equals the output token at each position it proposed: p .. p+a-1
match, and p+a does not when a < d. A k-draft from p is the first k tokens of the K-draft (the draft is
greedy over the same prefix), so these matches decide what any k would accept. Two kinds of position are
not observed: output token 0 (sampled by the prefill, never drafted, under every k) and the position after
a fully accepted K-draft, which the target filled with its bonus token without asking the draft.
:func:`request_matches` marks the latter ``None``.

**Static k.** :func:`replay_static_k` replays the native engine's rule (token 0 undrafted, each later step
drafting ``min(k, tokens left - 1)``) over a request's matches, so each k follows its own trajectory, as a
run at that k does. It is exact unless the trajectory reaches an unobserved position; those are counted
(``num_unobserved``, read as a mismatch), and :func:`fill_matches` completes them from one forward of the
draft over the outputs (:func:`specexp.analysis.acceptance_replay.draft_matches`), which makes every k exact.
Outputs are taken as the request's whole length (EOS-stopped requests are replayed as if their last token
were the length limit).

**Per-step oracle.** On the K-run's own steps, depth k turns a row that drafted d and accepted a into
``min(a, k) + 1`` tokens (a prompt chunk's tokens stay) at the decode step cost ``cost(k, batch)`` measured for
that depth and batch size (:func:`step_costs`); the same output then takes decode time in proportion, and the
prompts cost what a prompt token cost in the run at that depth (:func:`prefill_ms_per_token`), once for the
whole output rather than spread over the K-run's fewer steps. One k per step for the whole batch, chosen in
hindsight to minimise the decode time per token (:func:`per_step_oracle`, Dinkelbach's iteration: the exact
optimum of the ratio): the upper bound any per-step k-selection policy can reach on these steps. Speedups are
over k = 0 on the same requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from specexp.analysis.acceptance_replay import DraftCounts
from specexp.analysis.traces import output_positions


def request_matches(traces: pd.DataFrame) -> dict[str, list[bool | None]]:
    """Per request (``prompt_id``), ``matches[i]`` for each output position i: True / False where a step of
    the run observed whether the draft's greedy token equals output token i, None where none did. Length:
    the request's output tokens. Traces of a greedy run with standard rejection."""
    out: dict[str, list[bool | None]] = {}
    starts = output_positions(traces)
    for row, start in zip(traces.itertuples(index=False), starts, strict=True):
        matches = out.setdefault(str(row.prompt_id), [])
        end = start + int(row.num_emitted_tokens)
        matches.extend([None] * (end - len(matches)))
        drafted, accepted = int(row.num_draft_tokens), int(row.num_accepted_tokens)
        for i in range(start, min(start + accepted, end)):
            matches[i] = True
        if drafted and accepted < drafted and start + accepted < end:
            matches[start + accepted] = False
    return out


def fill_matches(observed: Sequence[bool | None], complete: Sequence[bool]) -> list[bool]:
    """``observed`` with each None replaced by ``complete``'s value at that position; a position both know
    must agree (else ValueError: ``complete`` was not computed for this run's outputs)."""
    filled = []
    for i, seen in enumerate(observed):
        if seen is not None and bool(complete[i]) != seen:
            raise ValueError(f"position {i}: the run observed match={seen}, the draft forward says {complete[i]}")
        filled.append(bool(complete[i]) if seen is None else seen)
    return filled


@dataclass
class StaticReplay(DraftCounts):
    """What a static k does over some requests: the draft counters (:class:`DraftCounts`), ``num_row_steps``
    (steps that ran a request after its prefill: verifications and plain decodes), ``num_output_tokens``, and
    ``num_unobserved`` (unobserved positions the replay reached, read as mismatches: 0 = exact)."""

    num_row_steps: int = 0
    num_output_tokens: int = 0
    num_unobserved: int = 0

    def add(self, other: StaticReplay) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.accepted_per_position = [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position,
                                                              strict=True)]
        self.num_row_steps += other.num_row_steps
        self.num_output_tokens += other.num_output_tokens
        self.num_unobserved += other.num_unobserved


def replay_static_k(matches: Sequence[bool | None], k: int) -> StaticReplay:
    """A static depth k over one request of ``len(matches)`` output tokens, under the native rule (module
    docstring); a None reached counts in ``num_unobserved`` and ends the accepted prefix."""
    num_output = len(matches)
    replay = StaticReplay(k, num_output_tokens=num_output)
    produced = 1 if num_output else 0  # the prefill samples token 0
    while produced < num_output:
        budget = min(k, num_output - produced - 1)
        replay.num_row_steps += 1
        if budget <= 0:  # a plain decode step
            produced += 1
            continue
        accepted = 0
        while accepted < budget:
            seen = matches[produced + accepted]
            if seen is None:
                replay.num_unobserved += 1
            if not seen:
                break
            replay.accepted_per_position[accepted] += 1
            accepted += 1
        replay.num_drafts += 1
        replay.num_draft_tokens += budget
        produced += accepted + 1
    return replay


def static_k_table(matches: dict[str, Sequence[bool | None]], ks: Iterable[int]) -> pd.DataFrame:
    """One row per k: the replayed counters summed over every request (``acceptance_length``,
    ``accepted_per_position``, ``num_row_steps``, ..., and ``exact``: no unobserved position reached)."""
    rows = []
    for k in ks:
        total = StaticReplay(k)
        for request in matches.values():
            total.add(replay_static_k(request, k))
        rows.append({"k": k, "num_drafts": total.num_drafts, "num_draft_tokens": total.num_draft_tokens,
                     "num_accepted_tokens": total.num_accepted_tokens,
                     "accepted_per_position": total.accepted_per_position,
                     "acceptance_length": total.acceptance_length, "num_row_steps": total.num_row_steps,
                     "num_output_tokens": total.num_output_tokens, "num_unobserved": total.num_unobserved,
                     "exact": total.num_unobserved == 0})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ step costs


def step_costs(steps_by_k: dict[int, pd.DataFrame]) -> dict[int, dict[int, float]]:
    """Measured decode step cost in ms by depth and batch size, ``{k: {num_reqs: mean step_ms}}``, from each
    depth's steps.parquet (steps that emitted tokens): the mean of the steps with no prompt token at each batch
    size that has any; a batch size that only ran steps with prompt tokens gets the decode cost interpolated from
    the sizes around it (:func:`cost_at`), not its own steps' mean, which would charge their prefill as decode
    time and hide it from :func:`prefill_ms_per_token`. A depth with no decode-only step at all (or steps without
    ``num_prefill_tokens``) keeps every step's mean."""
    costs = {}
    for k, steps in steps_by_k.items():
        timed = steps.dropna(subset=["step_ms"])
        sizes = sorted(int(b) for b in timed["num_reqs"].unique())
        if "num_prefill_tokens" in timed and (timed["num_prefill_tokens"] == 0).any():
            decode = timed[timed["num_prefill_tokens"] == 0]
            measured = {int(b): float(ms) for b, ms in decode.groupby("num_reqs")["step_ms"].mean().items()}
            costs[k] = {b: measured[b] if b in measured else cost_at(measured, b) for b in sizes}
        else:
            costs[k] = {int(b): float(ms) for b, ms in timed.groupby("num_reqs")["step_ms"].mean().items()}
    return costs


def prefill_ms_per_token(steps: pd.DataFrame, costs: dict[int, float]) -> float:
    """What a prompt token costs at one depth, ms: over a run's steps that hold prompt tokens, what they took
    beyond a decode step of their batch size (``costs``: that depth's :func:`step_costs`; each step's excess at
    least 0), per prompt token they ran. It holds the target's prefill and, at k > 0, the draft's; 0 when no
    step prefilled (or ``steps`` has no ``num_prefill_tokens``)."""
    if "num_prefill_tokens" not in steps:
        return 0.0
    prefill = steps[steps["num_prefill_tokens"] > 0].dropna(subset=["step_ms"])
    if prefill.empty:
        return 0.0
    excess = sum(max(float(ms) - cost_at(costs, int(b)), 0.0) for ms, b in zip(prefill["step_ms"], prefill["num_reqs"]))
    return excess / float(prefill["num_prefill_tokens"].sum())


def cost_at(costs: dict[int, float], batch: int) -> float:
    """The cost of a step of ``batch`` rows: measured at that size, else linear between the nearest measured
    sizes (the nearest one beyond them)."""
    if batch in costs:
        return costs[batch]
    sizes = sorted(costs)
    below = [b for b in sizes if b < batch]
    above = [b for b in sizes if b > batch]
    if not below or not above:
        return costs[below[-1] if below else above[0]]
    lo, hi = below[-1], above[0]
    return costs[lo] + (costs[hi] - costs[lo]) * (batch - lo) / (hi - lo)


# ----------------------------------------------------------------------------------- per-step oracle


def step_tokens(traces: pd.DataFrame, ks: Sequence[int]) -> pd.DataFrame:
    """Per step of the run, the tokens it would have emitted at each depth of ``ks`` (columns ``tokens_k<k>``),
    its batch size and the prompt tokens it ran (``num_prompt_tokens``): a row that drafted and accepted a emits ``min(a, k) + 1`` (at most what it emitted),
    any other row what it emitted."""
    drafted = traces["num_draft_tokens"] > 0
    emitted = traces["num_emitted_tokens"]
    frame = pd.DataFrame({"step": traces["step"], "num_reqs": traces["num_reqs"],
                          "num_prompt_tokens": traces["num_query_tokens"].where(traces["is_prefill"], 0)})
    for k in ks:
        at_k = (traces["num_accepted_tokens"].clip(upper=k) + 1).clip(upper=emitted)
        frame[f"tokens_k{k}"] = at_k.where(drafted, emitted)
    return frame.groupby("step").agg({"num_reqs": "first", "num_prompt_tokens": "sum",
                                      **{f"tokens_k{k}": "sum" for k in ks}}).reset_index()


@dataclass
class OracleResult:
    """``tokens_per_s`` of each static depth and of the per-step oracle on one run's steps, the oracle's k per
    step (``oracle_k``, aligned with ``steps``), and speedups over k = 0 (when 0 is among the depths)."""

    steps: pd.DataFrame
    static_tokens_per_s: dict[int, float]
    oracle_tokens_per_s: float
    oracle_k: list[int]

    @property
    def best_static_k(self) -> int:
        return max(self.static_tokens_per_s, key=self.static_tokens_per_s.get)

    def speedup(self, tokens_per_s: float) -> float | None:
        base = self.static_tokens_per_s.get(0)
        return tokens_per_s / base if base else None


def per_step_oracle(traces: pd.DataFrame, costs: dict[int, dict[int, float]], max_iterations: int = 50,
                    prefill_ms: dict[int, float] | None = None) -> OracleResult:
    """The per-step hindsight oracle over the steps of ``traces`` (a run at depth K >= every k of ``costs``),
    with ``costs`` from :func:`step_costs` (decode steps): the k per step maximising the run's tokens per unit time.

    Every depth serves the same requests: T output tokens and the prompts' P tokens. At depth k the decode steps
    cost ``cost(k, batch)`` and emit ``tokens_k`` (:func:`step_tokens`), so T tokens take T * sum(cost_k) /
    sum(tokens_k) of decoding, and the prompts P * ``prefill_ms[k]`` (:func:`prefill_ms_per_token` of the run at
    k; free when None): tokens/s of k = T / (P * prefill_ms[k] + T * sum(cost_k) / sum(tokens_k)). The oracle picks
    each step's k to minimise the decode time per token (Dinkelbach's iteration on tokens / time), prefilling at
    the cheapest k > 0's cost when it drafts at all, or is static k = 0 when that is faster."""
    ks = sorted(costs)
    steps = step_tokens(traces, ks)
    tokens = {k: steps[f"tokens_k{k}"].to_numpy(dtype=float) for k in ks}
    times = {k: steps["num_reqs"].map(lambda b, k=k: cost_at(costs[k], int(b))).to_numpy(dtype=float) for k in ks}
    total = float(traces["num_emitted_tokens"].sum())
    prompt_ms = {k: (prefill_ms or {}).get(k, 0.0) * float(steps["num_prompt_tokens"].sum()) for k in ks}

    def tokens_per_s(prefill: float, decode_tokens_per_ms: float) -> float:
        return 1e3 * total / (prefill + total / decode_tokens_per_ms)

    decode_rate = {k: tokens[k].sum() / times[k].sum() for k in ks}
    static = {k: tokens_per_s(prompt_ms[k], decode_rate[k]) for k in ks}
    best = max(decode_rate, key=decode_rate.get)
    choice = [best] * len(steps)
    ratio = decode_rate[best]
    for _ in range(max_iterations):  # Dinkelbach: argmax_k tokens - ratio * time per step, then the new ratio
        choice = [max(ks, key=lambda k, s=s: tokens[k][s] - ratio * times[k][s]) for s in range(len(steps))]
        new_ratio = sum(tokens[k][s] for s, k in enumerate(choice)) / sum(times[k][s] for s, k in enumerate(choice))
        converged = new_ratio <= ratio * (1 + 1e-12)  # >= ratio: the choice before scores 0, this one its maximum
        ratio = max(ratio, new_ratio)
        if converged:
            break
    drafting = [k for k in ks if k > 0]
    oracle = tokens_per_s(min(prompt_ms[k] for k in drafting), ratio) if drafting and any(choice) else static[0]
    if 0 in static and static[0] > oracle:
        oracle, choice = static[0], [0] * len(steps)
    steps = steps.assign(oracle_k=choice)
    return OracleResult(steps, static, oracle, choice)


def oracle_rounds(rounds: Iterable[tuple[pd.DataFrame, dict[int, dict[int, float]], dict[int, float]]],
                  best_static_k: int | None = None) -> dict[str, list]:
    """:func:`per_step_oracle` on each measured round: ``rounds`` of (the deepest run's traces, every depth's
    :func:`step_costs`, every depth's :func:`prefill_ms_per_token`). Per round, in lists: ``best_static_k`` (the
    given k, else that round's best), ``model_best_static_speedup`` (that k's over k = 0),
    ``oracle_speedup`` and ``oracle_k_mean`` (the per-step oracle's speedup over k = 0 and mean k)."""
    out = {"best_static_k": [], "model_best_static_speedup": [], "oracle_speedup": [], "oracle_k_mean": []}
    for traces, costs, prefill in rounds:
        result = per_step_oracle(traces, costs, prefill_ms=prefill)
        best = result.best_static_k if best_static_k is None else best_static_k
        out["best_static_k"].append(best)
        out["model_best_static_speedup"].append(result.speedup(result.static_tokens_per_s[best]))
        out["oracle_speedup"].append(result.speedup(result.oracle_tokens_per_s))
        out["oracle_k_mean"].append(sum(result.oracle_k) / len(result.oracle_k))
    return out
