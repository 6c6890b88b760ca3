"""How a step's read-back becomes its requests' tokens: committing emitted tokens, stopping requests, counting.

All of it runs on the host, on the step's read-back as Python lists (`host_rows[r]`: the tokens row r emitted,
left-aligned in columns 0..K, their count in column K+1, and in column K+2 the drafts the row verified: at most
what it carried, fewer when the confidence rule masked some). A request stops at an EOS token (unless `ignore_eos`), at its
`max_new_tokens` or at `max_model_len`; `finish(request)` (the scheduler's) frees its cache the moment it stops.

Plain decoding with lookahead (k = 0, `engine.plain_decode_lookahead`) commits a step in two halves: its counts
when it is queued (`commit_provisional`: one placeholder token a row) and its tokens when its read-back lands,
one step later (`commit_read_back`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from specexp.engine.output import StepRecord
from specexp.engine.request import Request, RowTrace
from specexp.engine.scheduler import ScheduledBatch

Finish = Callable[[Request], None]


@dataclass(frozen=True)
class StopRule:
    """When a request stops: an EOS token (unless ignore_eos), max_new_tokens, or max_model_len tokens in all."""

    eos_token_ids: Collection[int]
    ignore_eos: bool
    max_model_len: int

    def is_eos(self, token: int) -> bool:
        return token in self.eos_token_ids and not self.ignore_eos


@dataclass
class StepCounts:
    """What a committed step emitted: output tokens, and (request, step) pairs that carried drafts, their draft
    tokens and how many of those were accepted."""

    num_output: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0


@dataclass
class InFlightStep:
    """A plain-decoding step queued but not read back yet (plain_decode_lookahead): its rows, where its
    read-back lands (`host`, once `done` has fired), and which rows were committed provisionally. Its emitted
    tokens stay in column 0 of the engine's `step_out` until the next step has gathered its input tokens."""

    batch: ScheduledBatch
    host: torch.Tensor
    done: torch.cuda.Event | None
    committed_rows: list[bool] = field(default_factory=list)


def append_tokens(req: Request, tokens: list[int], stop: StopRule) -> int:
    """Commit sampled tokens to `req`, stopping at EOS, max_new_tokens or max_model_len. Returns how many."""
    emitted = 0
    for token in tokens:
        req.token_ids.append(token)
        emitted += 1
        if stop.is_eos(token):
            req.finished, req.finish_reason = True, "eos"
        elif req.num_output_tokens >= req.max_new_tokens:
            req.finished, req.finish_reason = True, "length"
        elif len(req.token_ids) >= stop.max_model_len:
            req.finished, req.finish_reason = True, "max_model_len"
        if req.finished:
            break
    return emitted


def commit_step(batch: ScheduledBatch, host_rows: list[list[int]], k: int, now_s: float, stop: StopRule,
                finish: Finish, step_index: int) -> StepCounts:
    """Commit a step's emitted tokens (host_rows: per row, tokens [K+1], their count, the drafts it verified;
    k = K, the buffers' depth) to its requests; each request then has the step's k drafts pending
    (batch.num_speculative_tokens). now_s: seconds since the run started (first-token and finish times);
    step_index: the step's number in its `generate` call (each request's `trace`)."""
    counts = StepCounts()
    for r, row in enumerate(batch.rows):
        req = row.request
        n_sampled = host_rows[r][k + 1]
        num_verified = host_rows[r][k + 2]
        if row.is_prefill:
            req.num_computed_tokens += row.num_query_tokens
        else:
            req.num_computed_tokens += n_sampled  # t_last + accepted drafts are now in the cache
        if not row.samples:
            req.trace.append(RowTrace(step_index, row.num_query_tokens, row.is_prefill, 0, 0, 0))
            continue
        accepted = n_sampled - 1
        if num_verified > 0:
            req.verifies.append((num_verified, accepted))
            counts.num_drafts += 1
            counts.num_draft_tokens += num_verified
            counts.num_accepted += accepted
        req.num_accepted_tokens = n_sampled
        emitted = append_tokens(req, host_rows[r][:n_sampled], stop)
        req.emitted_per_step.append(emitted)
        req.trace.append(RowTrace(step_index, row.num_query_tokens, row.is_prefill, num_verified, accepted,
                                  emitted))
        counts.num_output += emitted
        if emitted and req.first_token_s is None:
            req.first_token_s = now_s
        if req.finished:
            req.finish_s = now_s
            finish(req)
        elif batch.num_speculative_tokens > 0:  # its drafts wait in row r of the speculator's draft buffer
            req.num_pending_drafts, req.draft_row = batch.num_speculative_tokens, r
        else:
            req.num_pending_drafts = 0
    return counts


def commit_provisional(step: InFlightStep, stop: StopRule, finish: Finish, step_index: int) -> StepCounts:
    """Plain-decoding lookahead: commit a queued step's counts before its tokens are read back. Each row that
    samples emits exactly one token: a placeholder in token_ids until `commit_read_back`, which the next step's
    input gathers from the device. Rows of requests that stopped at EOS in the step before are discarded.
    Requests that reach max_new_tokens or max_model_len stop here. step_index: as `commit_step`'s."""
    counts = StepCounts()
    for r, row in enumerate(step.batch.rows):
        req = row.request
        step.committed_rows.append(not req.finished)
        if req.finished:  # the step ran its row all the same: it emits nothing
            req.trace.append(RowTrace(step_index, row.num_query_tokens, row.is_prefill, 0, 0, 0))
            continue
        req.num_computed_tokens += row.num_query_tokens  # one token a decode row
        if not row.samples:
            req.trace.append(RowTrace(step_index, row.num_query_tokens, row.is_prefill, 0, 0, 0))
            continue
        req.token_ids.append(0)
        req.pending_token_row = r
        req.num_accepted_tokens = 1
        req.emitted_per_step.append(1)
        req.trace.append(RowTrace(step_index, row.num_query_tokens, row.is_prefill, 0, 0, 1))
        counts.num_output += 1
        if req.num_output_tokens >= req.max_new_tokens:
            req.finished, req.finish_reason = True, "length"
        elif len(req.token_ids) >= stop.max_model_len:
            req.finished, req.finish_reason = True, "max_model_len"
        if req.finished:
            finish(req)
    return counts


def commit_read_back(step: InFlightStep, now_s: float, stop: StopRule, finish: Finish) -> None:
    """Plain-decoding lookahead: put a queued step's read-back tokens (its `host`, landed) in place of the
    placeholders; a request whose token is EOS stops here. now_s: seconds since the run started."""
    host_rows = step.host.tolist()
    for r, row in enumerate(step.batch.rows):
        req = row.request
        if not (step.committed_rows[r] and row.samples):
            continue
        token = host_rows[r][0]
        req.token_ids[-1] = token  # no placeholder has been added after this one
        req.pending_token_row = -1
        if req.first_token_s is None:
            req.first_token_s = now_s
        if stop.is_eos(token):
            if not req.finished:
                finish(req)
            req.finished, req.finish_reason = True, "eos"
        if req.finished and req.finish_s is None:
            req.finish_s = now_s


def step_record(index: int, batch: ScheduledBatch, t_start: float, counts: StepCounts) -> StepRecord:
    """The record of step `index`, its wall time from t_start (perf_counter seconds) up to now; the phase
    times are filled in once the step's draft has finished (`NativeEngine.finish_timing`)."""
    return StepRecord(
        step=index, num_reqs=batch.num_reqs, num_tokens=batch.num_tokens,
        num_speculative_tokens=batch.num_speculative_tokens,
        num_prefill_tokens=sum(r.num_query_tokens for r in batch.rows if r.is_prefill),
        num_drafts=counts.num_drafts, num_draft_tokens=counts.num_draft_tokens,
        num_accepted_tokens=counts.num_accepted, num_output_tokens=counts.num_output,
        schedule_ms=0.0, verify_ms=0.0, sample_ms=0.0, draft_ms=0.0,
        step_ms=(time.perf_counter() - t_start) * 1e3, start_s=t_start,
    )
