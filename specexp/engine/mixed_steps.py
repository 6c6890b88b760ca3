"""Mixed steps in parts: a step whose batch holds prompt chunks beside verify rows runs as graph replays, not as
one eager forward.

Under load nearly every step that admits a request puts the new prompt's chunk beside the running verify rows.
One forward over that batch has a shape no graph was captured for, so it ran eagerly and bound by the host (on
an H200, 2026-12-02: 17.7 ms for such a step of Llama-3.2-1B + a 100M draft at 16 rows, k = 4, against 2.9 ms
for a pure verify step). No layer mixes tokens of different rows, and each row's KV blocks and conv-state slot
are its own, so running the rows in parts gives the same tokens:

- target: the verify rows (all of one query length, v + 1 tokens) replay their verify graph, then each prompt
  chunk replays the prompt-prefill graph that holds it (`engine.cudagraph_prefill_tokens`);
- draft: the verify rows' regions replay the draft-prefill graph of (rows, v), each chunk's region a draft
  prompt graph, and then ONE decode graph drafts for every row of the step, as in a pure step.

Every part writes its rows' results at the front of the buffers its graph reads and writes (`step_out` and
`row_inputs` in the target; `draft_tokens`, `draft_probs`, `draft_lengths` in the draft). The verify part runs
first (its staging gathers a k = 0 step's pending token from `step_out`, which a prompt part overwrites, and its
padded rows write past the verify rows); each prompt part's row then moves to its place in the batch, and row 0
is restored last, so what follows the step (the read-back, the commit, the next step's gathers) sees one batch
in the scheduler's order (verify rows first, then prefill chunks).

A step of several prompt chunks and no verify row (requests admitted together: the first step of a closed loop,
a wave of requests that finished together) runs the same way, its chunks alone: one joined graph beside an inert
verify row (`mixed_graphs`), else a prompt graph per chunk. Such steps are counted apart
(`num_prompt_batches_graphed`); a lone chunk replays its prompt graph as a step of its own.

A batch runs in parts only when every part has a captured graph: the target and the draft decide on their own,
and a batch that does not qualify runs as one eager forward, as before. `mixed_steps_in_parts` counts the
target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexp.engine.cudagraph import BatchExecutionDescriptor, CudaGraphManager
from specexp.engine.scheduler import ScheduledBatch
from specexp.engine.verified import StagedRows, VerifiedBatch


@dataclass(frozen=True)
class MixedParts:
    """How a mixed batch runs: rows [0, num_verify) replay the graph of `verify`; prompt row i (batch row
    num_verify + i) replays `prompts[i]` (its descriptor and the prompt-graph manager that holds it). Or, when
    `joined` is set, everything replays one joined graph: (its verify segment's descriptor, its manager, its chunk
    shape (M, C); `specexp.engine.mixed_graphs`), and verify/prompts are unused."""

    num_verify: int
    verify: BatchExecutionDescriptor | None
    prompts: list[tuple[BatchExecutionDescriptor, CudaGraphManager]]
    joined: tuple[BatchExecutionDescriptor, CudaGraphManager, tuple[int, int]] | None = None


def split_point(is_verify: list[bool], query_lens: list[int]) -> int | None:
    """How many leading rows are verify rows when a batch is verify rows of one query length followed by at
    least one prompt chunk (the scheduler's order), 0 for a batch of two or more prompt chunks alone; None for
    any other batch (pure verify, one lone chunk: its prompt graph, or rows out of order)."""
    num_verify = next((i for i, verify in enumerate(is_verify) if not verify), len(is_verify))
    if num_verify == len(is_verify) or any(is_verify[num_verify:]):
        return None
    if num_verify == 0:
        return 0 if len(is_verify) >= 2 else None
    if any(q != query_lens[0] for q in query_lens[:num_verify]):
        return None
    return num_verify


class GraphedStepCounts:
    """How many steps (the target's) or draft prefills (the draft's) replayed graphs beyond a uniform batch's: mixed
    ones joined (`mixed_graphs`) or in parts, and those of several prompt chunks alone, either way."""

    num_mixed_joined: int = 0
    num_mixed_in_parts: int = 0
    num_prompt_batches_graphed: int = 0

    def _count_mixed(self, num_verify: int, joined: bool) -> None:
        """Count one such step: chunks alone on their own, a mixed one as joined or in parts."""
        if not num_verify:
            self.num_prompt_batches_graphed += 1
        elif joined:
            self.num_mixed_joined += 1
        else:
            self.num_mixed_in_parts += 1

    def reset_graphed_step_counts(self) -> None:
        """Zero the counts (a new run's figures)."""
        self.num_mixed_joined = self.num_mixed_in_parts = self.num_prompt_batches_graphed = 0


class TargetMixedSteps(GraphedStepCounts):
    """The target half (a mixin of `NativeEngine`: it reads the engine's graphs and buffers and calls its
    `_prepare_target_inputs`)."""

    def _mixed_parts(self, batch: ScheduledBatch) -> MixedParts | None:
        """The parts `batch` runs in, counted as replays by their managers; None (nothing counted) unless it is
        a mixed batch (or a batch of several prompt chunks alone) whose verify rows and prompt chunks all have
        captured graphs."""
        if not self.use_graphs or not self.prefill_graphs.managers:
            return None
        rows = batch.rows
        num_verify = split_point([not r.is_prefill for r in rows], [r.num_query_tokens for r in rows])
        if num_verify is None:
            return None
        ends = [r.request.num_computed_tokens + r.num_query_tokens for r in rows]
        v = rows[0].num_query_tokens - 1 if num_verify else None  # None: chunks alone, any captured v
        joined = self.mixed_graphs.lookup(num_verify, v, [r.num_query_tokens for r in rows[num_verify:]], max(ends))
        if joined is not None:  # one joined graph holds the whole step
            self._count_mixed(num_verify, joined=True)
            desc = joined[0]
            joined[1].dispatch(num_verify, num_verify * (desc.num_speculative_tokens + 1), True, max(ends),
                               k=desc.num_speculative_tokens)  # counts the replay
            return MixedParts(num_verify, None, [], joined)
        if num_verify and self.verify_graphs.lookup(num_verify, max(ends[:num_verify]), v) is None:
            return None
        prompts = list(zip(rows[num_verify:], ends[num_verify:]))
        if not all(self.prefill_graphs.holds(row.num_query_tokens, end) for row, end in prompts):
            return None
        self._count_mixed(num_verify, joined=False)
        verify = None
        if num_verify:
            verify = self.verify_graphs.dispatch(num_verify, num_verify * (v + 1), True, max(ends[:num_verify]), k=v)
        return MixedParts(num_verify, verify,
                          [self.prefill_graphs.dispatch(row.num_query_tokens, end) for row, end in prompts])

    def _verify_in_parts(self, batch: ScheduledBatch, parts: MixedParts) -> VerifiedBatch | None:
        """Stage and replay every part (verify rows, if any, then each prompt chunk), leaving `step_out[:R]` and
        `row_inputs[:R]` in the batch's row order; returns what the speculator needs of the whole batch (None
        without a speculator)."""
        self._staged = None  # the parts leave `row_inputs` and `step_out` as no single step staged them
        if parts.joined is not None:
            return self._verify_joined(batch, parts.num_verify, parts.joined)
        rows, k, nv = batch.rows, batch.num_speculative_tokens, parts.num_verify
        preps, input_ids, first = [], [], None
        if nv:
            preps.append(self._prepare_target_inputs(ScheduledBatch(rows[:nv], k), parts.verify))
            self.verify_graphs.replay(parts.verify)
            input_ids.append(self.buffers.input_ids[: preps[0]["cpu"].num_tokens].clone())
            first = self.step_out[0].clone(), self.row_inputs[0].clone()
        for i, (row, (desc, manager)) in enumerate(zip(rows[nv:], parts.prompts)):
            preps.append(self._prepare_target_inputs(ScheduledBatch([row], k), desc))
            manager.replay(desc)
            if nv + i == 0:  # chunks alone: the first chunk's result is row 0's, kept while the others run there
                first = self.step_out[0].clone(), self.row_inputs[0].clone()
            else:
                self.step_out[nv + i].copy_(self.step_out[0])
                self.row_inputs[nv + i].copy_(self.row_inputs[0])
            input_ids.append(self.buffers.input_ids[: row.num_query_tokens].clone())
        self.step_out[0].copy_(first[0])
        self.row_inputs[0].copy_(first[1])
        if not self.drafting:
            return None
        return self._joined_verified(batch, preps, input_ids)

    def _joined_verified(self, batch: ScheduledBatch, preps: list[dict], input_ids: list[torch.Tensor]
                         ) -> VerifiedBatch:
        """What the speculator needs of a batch staged in parts: each part's staging (`preps`, in batch order)
        and target input ids, joined, and the device's sampled tokens (already in batch order)."""

        def joined(name: str) -> torch.Tensor:
            return torch.cat([prep[name] for prep in preps])

        num_reqs = batch.num_reqs
        # The draft copies the block table to the device without blocking: from pageable memory such a copy
        # first waits for the device to drain, which would leave the GPU idle while the host stages the draft.
        block_table = torch.cat([prep["cpu"].block_table for prep in preps])
        return VerifiedBatch(
            query_lens=joined("query_lens"), start_positions=joined("starts"), is_spec=joined("is_spec"),
            samples=joined("samples_cpu"), conv_slots=joined("slots"), num_accepted_prev=joined("num_accepted"),
            block_table=block_table.pin_memory() if self.pin_memory else block_table,
            target_input_ids=torch.cat(input_ids),
            sampled=self.step_out[:num_reqs, : self.k + 1], num_sampled=self.step_out[:num_reqs, self.k + 1],
        )


def rows_of(batch: VerifiedBatch, start: int, stop: int) -> VerifiedBatch:
    """Rows [start, stop) of a verified batch, with their target tokens."""
    offsets = [0, *torch.cumsum(batch.query_lens, 0).tolist()]
    return VerifiedBatch(
        query_lens=batch.query_lens[start:stop], start_positions=batch.start_positions[start:stop],
        is_spec=batch.is_spec[start:stop], samples=batch.samples[start:stop],
        conv_slots=batch.conv_slots[start:stop], num_accepted_prev=batch.num_accepted_prev[start:stop],
        block_table=batch.block_table[start:stop], target_input_ids=batch.target_input_ids[offsets[start]:offsets[stop]],
        sampled=batch.sampled[start:stop], num_sampled=batch.num_sampled[start:stop],
    )


class DraftMixedSteps(GraphedStepCounts):
    """The draft half (a mixin of `AutoRegressiveSpeculator`: its prefill graphs, prompt graphs and buffers)."""

    def _prefill_parts(self, batch: VerifiedBatch) -> MixedParts | None:
        """The parts of the draft's prefill of `batch`, counted as replays; None (nothing counted) unless it is a
        mixed batch (or several chunks alone) whose verify rows' regions and chunk regions all have captured
        graphs."""
        if not self.prompt_graphs.managers:
            return None
        query_lens = batch.query_lens.tolist()
        num_verify = split_point(batch.is_spec.tolist(), query_lens)
        if num_verify is None:
            return None
        ends = (batch.start_positions + batch.query_lens + 1).tolist()  # a region: q + 1 slots from the start
        v = query_lens[0] - 1 if num_verify else None  # None: chunks alone, any captured v
        joined = self.mixed_graphs.lookup(num_verify, v, [q + 1 for q in query_lens[num_verify:]], max(ends))
        if joined is not None:  # one joined graph holds the whole prefill
            self._count_mixed(num_verify, joined=True)
            desc = joined[0]
            joined[1].dispatch(num_verify, num_verify * (desc.num_speculative_tokens + 2), True, max(ends),
                               k=desc.num_speculative_tokens)  # counts the replay
            return MixedParts(num_verify, None, [], joined)
        # verify rows' regions: v + 2 slots, or two at every v (`draft_catch_up`), one graph for every v
        region_v = 0 if self.last_two_regions else v
        if num_verify and self.prefill_graphs.lookup(num_verify, max(ends[:num_verify]), region_v) is None:
            return None
        prompts = list(zip(query_lens[num_verify:], ends[num_verify:]))
        if not all(self.prompt_graphs.holds(q + 1, end) for q, end in prompts):
            return None
        self._count_mixed(num_verify, joined=False)
        verify = None
        if num_verify:
            verify = self.prefill_graphs.dispatch(num_verify, num_verify * (region_v + 2), True, max(ends[:num_verify]),
                                                  k=region_v)
        return MixedParts(num_verify, verify, [self.prompt_graphs.dispatch(q + 1, end) for q, end in prompts])

    def _prefill_in_parts(self, batch: VerifiedBatch, parts: MixedParts) -> StagedRows:
        """Stage and replay the draft prefill of every part (verify rows, if any, then each chunk's region),
        leaving row r's draft 0 (and its probabilities and draft length) at row r; returns the rows' device facts
        for the decode steps, in the batch's order."""
        if parts.joined is not None:
            return self._prefill_joined(batch, parts.num_verify, parts.joined)
        nv = parts.num_verify
        per_row = [t for t in (self.draft_tokens, self.draft_probs, self.draft_lengths) if t is not None]
        staged, first = [], None
        if nv:
            staged.append(self._prepare_prefill_inputs(rows_of(batch, 0, nv), parts.verify))
            self.on_prefill_begin(nv)
            self.prefill_graphs.replay(parts.verify)
            self.on_prefill_end(nv)
            first = [t[0].clone() for t in per_row]
        for i, (desc, manager) in enumerate(parts.prompts):
            staged.append(self._prepare_prefill_inputs(rows_of(batch, nv + i, nv + i + 1), desc))
            self.on_prefill_begin(1)
            manager.replay(desc)
            self.on_prefill_end(1)
            if nv + i == 0:  # chunks alone: the first chunk's draft is row 0's, kept while the others run there
                first = [t[0].clone() for t in per_row]
                continue
            for t in per_row:
                t[nv + i].copy_(t[0])
        for t, saved in zip(per_row, first):
            t[0].copy_(saved)
        return StagedRows(*(torch.cat([getattr(s, name) for s in staged]) for name in ("num_valid", "start", "samples")))
