"""How deep the speculator drafts each step (its k), and which (batch size, k) keys the CUDA graphs need for that.

K = `speculator.num_speculative_tokens` sizes every buffer, cache and conv state; each step runs a k in 0..K,
picked by the run's depth policy once the scheduler has chosen the step's rows:

    static (the default)                     k = K every step
    num_speculative_tokens_per_batch_size    k = the schedule's k at the step's batch size: the rows scheduled,
                                             prefill chunks included (vLLM 0.33's dynamic speculative decoding)
    draft_confidence_threshold               k = K; each row's drafts after its first one whose draft probability
                                             is below the threshold are masked out of verification
    adaptive: goodput                        k = the k that maximises the sampling rows' expected
                                             tokens per ms of step (`specexp.engine.goodput`)

A step's k does two things. Its verify rows carry at most k of their pending drafts: 1 + min(pending, k) tokens,
so a row may carry fewer than k (drafts proposed by a step of smaller k, or masked by the confidence rule, or
trimmed near the end of its request); and the speculator proposes k drafts for every row (the draft prefill
samples draft 0, then k - 1 draft decode steps). With k = 0 the draft prefill still runs, so the draft's KV keeps
up with the committed tokens, and nothing is proposed.

Which graphs a policy needs (`graph_keys`): a step of n rows runs at the smallest capture size s >= n, at one of
the policy's k for n rows (`step_depths`). Its verify rows carry v = min(k_prev, k) drafts, where k_prev is the
previous step's k, which may have come from any batch size (requests finish and arrive between steps):

    draft decode   (s, k)   for k of a step padded to s, k >= 2 (k - 1 decode steps, one fused graph)
    target verify  (s, v)   for v = min(k', k): k of a step padded to s, k' any k the policy takes (v + 1 tokens)
    draft prefill  (s, v)   the same v (each verify row's region of v + 2 slots)

`speculator.cudagraph_num_speculative_tokens` may leave some k out of the capture: a step that needs one runs
eagerly, and its manager counts it per (size, k).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from specexp.engine.config import EngineConfigError

SCHEDULE_KEY = "speculator.num_speculative_tokens_per_batch_size"


class DepthConfigError(EngineConfigError):
    """A depth setting that cannot run; the message is one line naming the entry and what would be valid."""


@dataclass(frozen=True)
class BatchSizeSchedule:
    """vLLM 0.33's `num_speculative_tokens_per_batch_size`: inclusive [start_bs, end_bs, k] ranges, sorted and
    non-overlapping, the first starting at batch size 1; a batch size in a gap or past the last range takes the k
    of the range before it; every k at most max_k (K)."""

    ranges: tuple[tuple[int, int, int], ...]
    max_k: int

    def k_for(self, num_reqs: int) -> int:
        """The step's k for a batch of num_reqs rows (>= 1)."""
        k = self.ranges[0][2]
        for start, _, range_k in self.ranges:
            if num_reqs < start:
                break
            k = range_k
        return min(k, self.max_k)


def parse_batch_size_schedule(entries, max_k: int) -> BatchSizeSchedule:
    """Validate a schedule (a list of [start_bs, end_bs, k]) against K = max_k, with vLLM's validator's rules
    (k >= 0, k <= K, first range at 1, sorted, non-overlapping); raises `DepthConfigError` naming the entry."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise DepthConfigError(f"{SCHEDULE_KEY}={entries!r}: must be a non-empty list of [start_bs, end_bs, k] "
                               "ranges (or null for none)")
    ranges: list[tuple[int, int, int]] = []
    for i, entry in enumerate(entries):
        name = f"{SCHEDULE_KEY}[{i}]={list(entry) if isinstance(entry, (list, tuple)) else entry!r}"
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or any(not isinstance(v, int) or isinstance(v, bool) for v in entry)):
            raise DepthConfigError(f"{name}: must be [start_bs, end_bs, k], three integers")
        start, end, k = entry
        if k < 0:
            raise DepthConfigError(f"{name}: k={k} must be >= 0 (0 = no drafts at that batch size)")
        if k > max_k:
            raise DepthConfigError(f"{name}: k={k} > speculator.num_speculative_tokens={max_k} (the largest k, "
                                   f"which sizes the buffers): use k <= {max_k} or raise num_speculative_tokens")
        if start < 1 or end < start:
            raise DepthConfigError(f"{name}: needs 1 <= start_bs <= end_bs (inclusive batch sizes)")
        if i == 0 and start != 1:
            raise DepthConfigError(f"{name}: the first range must start at batch size 1")
        if ranges and start < ranges[-1][0]:
            raise DepthConfigError(f"{name}: ranges must be sorted by start_bs, and this one starts before "
                                   f"{list(ranges[-1])}")
        if ranges and start <= ranges[-1][1]:
            raise DepthConfigError(f"{name}: overlaps {list(ranges[-1])} (ranges must not overlap)")
        ranges.append((start, end, k))
    return BatchSizeSchedule(tuple(ranges), max_k)


def schedule_from_best_k(best_k: dict[int, int]) -> tuple[tuple[int, int, int], ...]:
    """A schedule (`num_speculative_tokens_per_batch_size` ranges [start_bs, end_bs, k]) that gives each batch size
    b of `best_k` ({b: k}, b >= 1, k >= 0) its k: b's range runs from the batch size before it + 1 to b (the first
    from 1), neighbouring ranges with one k are one range, and past the largest b its k carries (the schedule's
    tail rule). E.g. {1: 3, 4: 2, 16: 2, 64: 1} -> ((1, 1, 3), (2, 16, 2), (17, 64, 1))."""
    ranges: list[tuple[int, int, int]] = []
    start = 1
    for b in sorted(best_k):
        if b < 1 or best_k[b] < 0:
            raise ValueError(f"schedule_from_best_k: batch size {b} with k {best_k[b]}: needs b >= 1 and k >= 0")
        if ranges and ranges[-1][2] == best_k[b]:
            ranges[-1] = (ranges[-1][0], b, best_k[b])
        else:
            ranges.append((start, b, best_k[b]))
        start = b + 1
    return tuple(ranges)


class StaticDepth:
    """k = K every step (also the confidence-threshold mode, whose masking happens per row on the device)."""

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k

    def step_k(self, rows) -> int:
        return self.max_k

    def reset(self) -> None:
        """A new run (nothing to forget)."""

    def step_depths(self, num_reqs: int) -> frozenset[int]:
        """Every k a step of num_reqs rows may take."""
        return frozenset({self.max_k})


class ScheduledDepth:
    """k = the schedule's k at the step's batch size (the rows scheduled, prefill chunks included)."""

    def __init__(self, schedule: BatchSizeSchedule) -> None:
        self.schedule = schedule
        self.max_k = schedule.max_k

    def step_k(self, rows) -> int:
        return self.schedule.k_for(len(rows))

    def reset(self) -> None:
        """A new run (nothing to forget)."""

    def step_depths(self, num_reqs: int) -> frozenset[int]:
        return frozenset({self.schedule.k_for(num_reqs)})


@dataclass(frozen=True)
class GraphKeys:
    """The (capture size, k) keys of each k-specialised graph manager (see the module docstring), and the keys
    `captured_depths` left out of them (those steps run eagerly and are counted)."""

    verify: tuple[tuple[int, int], ...]
    decode: tuple[tuple[int, int], ...]
    left_out_verify: tuple[tuple[int, int], ...] = ()
    left_out_decode: tuple[tuple[int, int], ...] = ()

    def draft_prefill_sizes(self) -> tuple[int, ...]:
        """The capture sizes of the verify keys: a draft prefill of two-slot regions (`draft_catch_up`) captures one
        graph a size for every k (a size whose every k was left out runs it eagerly)."""
        return tuple(sorted({size for size, _ in self.verify}))


def graph_keys(step_depths: Callable[[int], Collection[int]], capture_sizes: list[int], max_num_seqs: int,
               captured_depths: Collection[int] | None = None, mixed_parts: bool = False) -> GraphKeys:
    """The keys a policy with `step_depths(num_reqs)` can produce when batches are padded to `capture_sizes`
    (batch sizes 1..max_num_seqs), less those whose k is not in captured_depths (None: keep every k).

    mixed_parts: mixed steps run in parts (`specexp.engine.mixed_steps`), so the verify rows of a step of n rows
    may be a batch of any size below n at that step's k: each verify key (size, v) is also kept at every
    smaller capture size."""
    sizes = sorted(set(capture_sizes))
    every_k = set().union(*(step_depths(n) for n in range(1, max_num_seqs + 1)))
    verify, decode = set(), set()
    smaller = 0
    for size in sizes:
        at_size = set().union(*(step_depths(n) for n in range(smaller + 1, min(size, max_num_seqs) + 1)))
        smaller = size
        decode |= {(size, k) for k in at_size if k >= 2}
        verify |= {(size, min(prev, k)) for k in at_size for prev in every_k}
    if mixed_parts:
        verify |= {(size, v) for _, v in verify for size in sizes if size <= max(s for s, w in verify if w == v)}
    keep = (lambda key: True) if captured_depths is None else (lambda key: key[1] in captured_depths)
    return GraphKeys(
        verify=tuple(sorted(key for key in verify if keep(key))),
        decode=tuple(sorted(key for key in decode if keep(key))),
        left_out_verify=tuple(sorted(key for key in verify if not keep(key))),
        left_out_decode=tuple(sorted(key for key in decode if not keep(key))),
    )


def describe_graph_cost(keys: GraphKeys, static: GraphKeys, num_buckets: int, depths: Collection[int],
                        last_two_regions: bool = False) -> str:
    """The start-up line saying what the depth policy's graphs cost: keys captured per manager (x buckets), next
    to what a static K would capture, and the keys left out. last_two_regions: the draft's prefill takes two-slot
    regions (`draft_catch_up`), one key a size for every k."""
    def draft_prefill(ks: GraphKeys) -> int:
        return len(ks.draft_prefill_sizes()) if last_two_regions else len(ks.verify)

    def count(ks: GraphKeys) -> int:
        return len(ks.verify) + draft_prefill(ks) + len(ks.decode)

    prefill = draft_prefill(keys)
    line = (f"depth policy needs CUDA graphs for k in {sorted(depths)}: {count(keys) * num_buckets} graphs "
            f"(target verify {len(keys.verify)}, draft prefill {prefill}, draft decode {len(keys.decode)} "
            f"keys x {num_buckets} key-length buckets); a static k would capture {count(static) * num_buckets}")
    left_out_prefill = (len({size for size, _ in keys.left_out_verify} - set(keys.draft_prefill_sizes()))
                        if last_two_regions else len(keys.left_out_verify))
    left_out = len(keys.left_out_verify) + left_out_prefill + len(keys.left_out_decode)
    if left_out:
        line += f"; {left_out} keys left out by speculator.cudagraph_num_speculative_tokens run eagerly"
    return line


def depth_policy(speculator, max_k: int):
    """The depth policy of a `SpeculatorConfig` (validated) at K = max_k: `step_k(rows)` gives a step's k,
    `step_depths(num_reqs)` every k a step of num_reqs rows may take. The goodput policy's step costs are set by
    the engine once it has measured them (`GoodputDepth.costs`)."""
    if speculator.num_speculative_tokens_per_batch_size is not None:
        return ScheduledDepth(parse_batch_size_schedule(speculator.num_speculative_tokens_per_batch_size, max_k))
    if speculator.adaptive == "goodput":
        from specexp.engine.goodput import GoodputDepth

        return GoodputDepth(max_k, None, speculator.goodput_settings())
    return StaticDepth(max_k)
