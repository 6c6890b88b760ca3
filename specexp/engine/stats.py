"""Acceptance counting and latency summaries (docs/design.md §4). Pure Python: no torch, no numpy.

Every backend counts the same way: after each target verification of a request it calls

    stats.record(request_id, num_draft_tokens, num_accepted_tokens)

where ``num_draft_tokens`` is how many draft tokens that verification carried (0..k) and
``num_accepted_tokens`` how many of them the rejection sampler accepted (a prefix, 0..num_draft_tokens; the
bonus/correction token is *not* counted). A verification with 0 draft tokens is not a draft and changes
nothing. Metrics (names match vLLM where vLLM has one):

- ``num_drafts``: (request, step) pairs that carried >= 1 draft token.
- ``num_draft_tokens``, ``num_accepted_tokens``: totals.
- ``drafted_per_position[i]``: drafts that proposed a token at position i (i = 0..k-1).
- ``accepted_per_position[i]``: drafts whose positions 0..i were all accepted. Never increases with i.
- ``acceptance_length = 1 + num_accepted_tokens / num_drafts`` (tokens emitted per verification, bonus
  included; 1.0 when there were no drafts).
- ``draft_acceptance_rate = num_accepted_tokens / num_draft_tokens``.
- ``per_position_acceptance[i] = accepted_per_position[i] / num_drafts`` (unconditional; sums to
  ``acceptance_length - 1``).
- ``conditional_acceptance[i] = accepted_per_position[i] / accepted_per_position[i-1]`` (position 0:
  ``/ num_drafts``).
- ``acceptance_histogram[j]``: drafts with exactly j accepted tokens (j = 0..k).
- ``acceptance_histogram_by_draft_length[d][j]``: drafts of exactly d draft tokens with j of them accepted
  (d = 0..k, j = 0..d; row 0 stays [0]): where the depth varies per step (``specexp.engine.depth``), the
  acceptance of each draft length apart.

A ratio whose denominator is 0 is ``None`` (JSON null), never 0.

Latency: :func:`request_latency` turns one request's timestamps into ``ttft_ms``/``tpot_ms``/``e2e_ms``;
:func:`latency_summary` gives each as ``{"mean", "p50", "p90", "p99"}`` plus ``output_tokens_per_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


@dataclass
class AcceptanceCounts:
    """Raw acceptance counters for one request or a whole run; arrays have length ``k`` (``k + 1`` for the
    histogram), where ``k`` is the maximum number of draft tokens per verification."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    acceptance_histogram: list[int] = field(default_factory=list)
    acceptance_histogram_by_draft_length: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if k < 0:
            raise ValueError(f"num_speculative_tokens={k} < 0: use 0 (no speculation) or more")
        self.drafted_per_position = self.drafted_per_position or [0] * k
        self.accepted_per_position = self.accepted_per_position or [0] * k
        self.acceptance_histogram = self.acceptance_histogram or [0] * (k + 1)
        self.acceptance_histogram_by_draft_length = (self.acceptance_histogram_by_draft_length
                                                     or [[0] * (d + 1) for d in range(k + 1)])

    def add(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verification that carried ``num_draft_tokens`` drafts, ``num_accepted_tokens`` accepted."""
        k = self.num_speculative_tokens
        if not 0 <= num_draft_tokens <= k:
            raise ValueError(f"num_draft_tokens={num_draft_tokens} outside 0..{k} (num_speculative_tokens)")
        if not 0 <= num_accepted_tokens <= num_draft_tokens:
            raise ValueError(
                f"num_accepted_tokens={num_accepted_tokens} outside 0..num_draft_tokens={num_draft_tokens}"
            )
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_draft_tokens):
            self.drafted_per_position[i] += 1
        for i in range(num_accepted_tokens):
            self.accepted_per_position[i] += 1
        self.acceptance_histogram[num_accepted_tokens] += 1
        self.acceptance_histogram_by_draft_length[num_draft_tokens][num_accepted_tokens] += 1

    def merge(self, other: AcceptanceCounts) -> None:
        """Add ``other``'s counts (same ``num_speculative_tokens``) into these."""
        if other.num_speculative_tokens != self.num_speculative_tokens:
            raise ValueError(
                f"cannot merge counts for k={other.num_speculative_tokens} into k={self.num_speculative_tokens}"
            )
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for mine, theirs in (
            (self.drafted_per_position, other.drafted_per_position),
            (self.accepted_per_position, other.accepted_per_position),
            (self.acceptance_histogram, other.acceptance_histogram),
        ):
            for i, n in enumerate(theirs):
                mine[i] += n
        for mine, theirs in zip(self.acceptance_histogram_by_draft_length, other.acceptance_histogram_by_draft_length,
                                strict=True):
            for j, n in enumerate(theirs):
                mine[j] += n

    def metrics(self) -> dict:
        """The §4 acceptance metrics of these counts (a JSON-ready dict; ratios ``None`` when undefined)."""
        drafts = self.num_drafts
        accepted = self.accepted_per_position
        conditional = [
            _ratio(accepted[i], drafts if i == 0 else accepted[i - 1]) for i in range(len(accepted))
        ]
        return {
            "num_drafts": drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(accepted),
            "acceptance_length": 1.0 + self.num_accepted_tokens / drafts if drafts else 1.0,
            "draft_acceptance_rate": _ratio(self.num_accepted_tokens, self.num_draft_tokens),
            "per_position_acceptance": [_ratio(a, drafts) for a in accepted],
            "conditional_acceptance": conditional,
            "acceptance_histogram": list(self.acceptance_histogram),
            "acceptance_histogram_by_draft_length": [list(h) for h in self.acceptance_histogram_by_draft_length],
        }


class AcceptanceStats:
    """Acceptance counts of a run, kept per request and in total.

    Usage::

        stats = AcceptanceStats(num_speculative_tokens=k)
        stats.record("req-0", num_draft_tokens=k, num_accepted_tokens=2)   # after each verification
        stats.metrics()                 # run-level dict of §4 acceptance metrics
        stats.request_metrics("req-0")  # the same for one request
        stats.histograms_per_request()  # {request_id: acceptance_histogram}
    """

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.total = AcceptanceCounts(num_speculative_tokens)
        self.per_request: dict[str, AcceptanceCounts] = {}

    def record(self, request_id: str, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verification of ``request_id``: ``num_draft_tokens`` proposed (0..k), the first
        ``num_accepted_tokens`` of them accepted (bonus/correction token excluded)."""
        counts = self.per_request.get(request_id)
        if counts is None:
            counts = self.per_request[request_id] = AcceptanceCounts(self.num_speculative_tokens)
        counts.add(num_draft_tokens, num_accepted_tokens)
        self.total.add(num_draft_tokens, num_accepted_tokens)

    def metrics(self) -> dict:
        """Run-level acceptance metrics (see the module docstring)."""
        return self.total.metrics()

    def request_metrics(self, request_id: str) -> dict:
        """Acceptance metrics of one request (all zero / ``None`` if it was never verified with drafts)."""
        return self.per_request.get(request_id, AcceptanceCounts(self.num_speculative_tokens)).metrics()

    def histograms_per_request(self) -> dict[str, list[int]]:
        """``{request_id: acceptance_histogram}`` (length ``k + 1`` each), in recording order."""
        return {rid: list(c.acceptance_histogram) for rid, c in self.per_request.items()}


# ----------------------------------------------------------------------------------------------- latency


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: list[float | None]) -> dict[str, float | None]:
    """``{"mean", "p50", "p90", "p99"}`` of the non-``None`` values (all ``None`` if there are none)."""
    present = [v for v in values if v is not None]
    mean = sum(present) / len(present) if present else None
    return {"mean": mean, **{f"p{q}": percentile(present, q) for q in (50, 90, 99)}}


LATENCY_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms")


def request_latency(arrival_s: float, first_token_s: float, end_s: float, num_output_tokens: int,
                    scheduled_s: float | None = None) -> dict:
    """One request's latency from ``time.perf_counter()`` stamps (seconds), every backend the same way.

    Returns ``ttft_ms`` (arrival -> first output token, queueing included), ``e2e_ms`` (arrival -> last
    token), ``tpot_ms`` (mean time per output token after the first; ``None`` with fewer than 2 output
    tokens) and ``queue_ms`` (arrival -> first scheduled, the part of ttft spent waiting for a batch slot;
    ``None`` when ``scheduled_s`` is not known).
    """
    ttft_ms = (first_token_s - arrival_s) * 1e3
    e2e_ms = (end_s - arrival_s) * 1e3
    tpot_ms = (e2e_ms - ttft_ms) / (num_output_tokens - 1) if num_output_tokens > 1 else None
    queue_ms = (scheduled_s - arrival_s) * 1e3 if scheduled_s is not None else None
    return {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2e_ms": e2e_ms, "queue_ms": queue_ms}


def latency_summary(requests: list[dict], num_output_tokens: int, duration_s: float) -> dict:
    """Run-level latency metrics.

    ``requests``: one dict per request with ``ttft_ms``/``tpot_ms``/``e2e_ms``/``queue_ms`` (as
    :func:`request_latency` returns). ``num_output_tokens``: generated tokens over the run. ``duration_s``:
    wall time of the whole generation phase (first arrival -> last request end; model loading excluded).
    Returns ``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``queue_ms`` (each ``{"mean","p50","p90","p99"}``) and
    ``output_tokens_per_s``.
    """
    return {
        **{key: distribution([r.get(key) for r in requests]) for key in LATENCY_KEYS},
        "output_tokens_per_s": _ratio(num_output_tokens, duration_s),
    }
