"""How a scheduled batch becomes the target's inputs in the native engine's persistent buffers.

One step's rows (decode rows first, then prefill chunks) turn into: the flat token ids and positions, the
attention metadata, the short-conv metadata (`ShortConvMetadataBuilder`), and per row a line of `row_inputs`
that the rejection sampler reads (the logits rows it scores, where its drafts wait in the speculator's draft
buffer, how many it may accept, whether it samples, its conv slot). The drafts themselves never leave the
device: one gather copies them from the draft buffer into the input ids.

A steady step (the rows of the step before, each one step further) is not staged from the host at all: one
kernel advances the last step's inputs on the device from what it accepted (`specexp.engine.verify_advance`,
`engine.steady_inputs_on_device`), and the rows' CPU facts are built after the verify is queued.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor
from specexp.engine.inputs import InputBuffers, build_step_inputs, host_tensor, stride_rows
from specexp.engine.launch_graphs import LaunchGraphs
from specexp.engine.scheduler import ScheduledBatch
from specexp.engine.verified import VerifiedBatch
from specexp.engine.verify_advance import advance_verify_rows_on_gpu, advances_in_triton


@dataclass
class StagedStep:
    """What the input buffers hold after a step staged from the host: its steady key (`_steady_key`), the buffers'
    `version` right after (any later load invalidates it) and the rows' block table on the host (int32[R,
    max_blocks], page-locked on a GPU; the speculator reads it on every step advanced from this one)."""

    key: tuple
    version: int
    block_table: torch.Tensor


class TargetStepInputs:
    """The input half of `NativeEngine` (a mixin: it fills the engine's `buffers`, `row_inputs` and conv
    builder). `_prepare_target_inputs` stages one step; `_verified_batch` hands its facts to the speculator."""

    _staged: StagedStep | None = None  # the last step staged from the host, while the buffers still hold it
    _advance_launches: LaunchGraphs | None = None  # the steady advance's graphs, made at the first steady step

    def _stage_step(self, batch: ScheduledBatch, desc: BatchExecutionDescriptor) -> dict | None:
        """Stage a step that runs alone (not in parts): on the device from the last step when it is steady (the
        same rows, each one step further; returns None: `_verified_batch` then builds the rows' CPU facts), else
        from the host (`_prepare_target_inputs`; returns its dict)."""
        key = self._steady_key(batch, desc)
        staged = self._staged
        if key is not None and staged is not None and staged.key == key and staged.version == self.buffers.version:
            self._advance_steady_rows(batch)
            return None
        prep = self._prepare_target_inputs(batch, desc)
        self._staged = StagedStep(key, self.buffers.version, prep["block_table"]) if key is not None else None
        return prep

    def _steady_key(self, batch: ScheduledBatch, desc: BatchExecutionDescriptor) -> tuple | None:
        """What a step's staged inputs depend on besides its rows' positions and tokens: the padded shape, and per
        row its request, query length, drafts it may accept, draft-buffer row, conv slot, pending-token row and block
        count (a running request keeps the blocks it was admitted with; were it given more, its table would differ).
        Equal keys on consecutive steps = a steady step. None when the step cannot be advanced on the device: the
        setting off, no graph (an eager step reads metadata built on the host), a prompt row or a row that does
        not sample. A target with conv state: its graph's conv metadata changes only in each row's accepted count.
        """
        if not self.cfg.steady_inputs_on_device or desc.cg_mode != FULL:
            return None
        key = [desc.num_reqs, desc.num_tokens]
        for row in batch.rows:
            req = row.request
            if row.is_prefill or not row.samples:
                return None
            key += (req.request_id, row.num_query_tokens, row.num_draft_tokens, req.draft_row, req.conv_slot,
                    req.pending_token_row, len(req.block_ids))
        return tuple(key)

    def _advance_steady_rows(self, batch: ScheduledBatch) -> None:
        """Advance the buffers from the last step to this one on the device (`verify_advance`): on a GPU replayed
        from one small graph per (rows, tokens, drafting) (`launch_graphs`: the launch sits on the host's critical
        path; everything else it reads is a persistent buffer or fixed for the engine; `engine.launch_graphs`)."""
        if self._advance_launches is None:
            # one kernel, no allocation
            self._advance_launches = LaunchGraphs(self.cfg.launch_graphs and advances_in_triton(self.step_out))
        drafting = self.drafting

        def launch() -> None:  # its arguments gathered only when it launches (eagerly, or to be captured)
            buffers, k = self.buffers, self.k
            advance_verify_rows_on_gpu(
                self.step_out, k + 1, batch.num_reqs, batch.num_tokens, buffers.query_start_loc,
                buffers.token_req_indices, buffers.seq_lens, buffers.positions, buffers.slot_mapping,
                buffers.input_ids, buffers.block_table, self.row_inputs[:, k + 1],
                self.speculator.draft_tokens if drafting else None, self.cfg.block_size,
                self.conv_builder.spec_graph_buffers.num_accepted_tokens if self.conv_states else None)

        self._advance_launches.run((batch.num_reqs, batch.num_tokens, drafting), launch)

    def _prepare_target_inputs(self, batch: ScheduledBatch, desc: BatchExecutionDescriptor,
                               buffers: InputBuffers | None = None, row_offset: int = 0, token_offset: int = 0,
                               row_stride: int | None = None) -> dict:
        """Stage one step of `batch`, as `desc` runs it (padded rows and tokens under FULL), into the persistent
        buffers; returns the step's CPU inputs (`cpu`), attention and conv metadata, and the per-row CPU
        tensors the speculator reads (`_verified_batch`); with row_stride also `real_input_ids`, the rows' tokens
        end to end (CPU).

        buffers: the input buffers to fill (None: the engine's); row_offset / token_offset: where the batch's
        first row sits in `row_inputs` and its first token in the forward's hidden states, for a batch staged as
        one segment of a joined forward (`specexp.engine.mixed_graphs`); row_stride: prompt chunks laid out in
        rows of that many slots (a joined graph's chunk segment, `inputs.stride_rows`)."""
        k, dev = self.k, self.device
        buffers = self.buffers if buffers is None else buffers
        rows = batch.rows
        token_lists, starts, block_ids = [], [], []
        for row in rows:
            req = row.request
            start = req.num_computed_tokens
            if row.is_prefill:
                token_lists.append(req.token_ids[start : start + row.num_query_tokens])
            else:  # the drafts are gathered on the device below
                token_lists.append([req.token_ids[-1]] + [0] * (row.num_query_tokens - 1))
            starts.append(start)
            block_ids.append(req.block_ids)
        flat = None  # strided rows: the step's real tokens end to end, before striding
        if row_stride is None:
            cpu = build_step_inputs(token_lists, starts, block_ids, self.cfg.block_size, self.max_blocks_per_req,
                                    desc.num_reqs, desc.num_tokens, pin_memory=self.pin_memory)
        else:
            flat = build_step_inputs(token_lists, starts, block_ids, self.cfg.block_size, self.max_blocks_per_req)
            cpu = stride_rows(flat, row_stride, desc.num_reqs, pin_memory=self.pin_memory)
        buffers.load(cpu, desc.num_reqs, desc.num_tokens)
        num_reqs, num_tokens = cpu.num_reqs, cpu.num_tokens
        attn = None  # a graph replays the attention metadata it was captured with
        if desc.cg_mode != FULL:
            attn = buffers.attention_metadata(num_reqs, num_tokens, max_seq_len=desc.max_seq_len,
                                              max_query_len=cpu.max_query_len, num_actual_tokens=num_tokens)
        facts = self._row_facts(batch, starts)
        conv = None
        if self.conv_states and row_stride is not None:  # a joined graph's chunk segment: its persistent buffers
            self.conv_builder.load_prompt_rows(query_lens=[r.num_query_tokens for r in rows],
                                               num_computed_tokens=starts,
                                               state_indices=[r.request.conv_slot for r in rows],
                                               row_tokens=row_stride)
        elif self.conv_states and desc.cg_mode == FULL and rows and rows[0].is_prefill:
            # a prompt-prefill graph (verify graphs take no prefill rows): its one-row persistent buffers
            self.conv_builder.load_prompt_row(query_len=rows[0].num_query_tokens, num_tokens_padded=desc.num_tokens,
                                              num_computed_tokens=starts[0], state_index=rows[0].request.conv_slot)
        elif self.conv_states:
            conv = self.conv_builder.build(
                query_start_loc_cpu=cpu.query_start_loc,
                num_computed_tokens_cpu=facts["starts_32"],
                num_decode_draft_tokens_cpu=facts["query_drafts"],
                num_accepted_tokens_cpu=facts["num_accepted"],
                state_indices_cpu=facts["slots"],
                num_reqs_padded=desc.num_reqs if desc.cg_mode == FULL else None,
            )
        # Per row, its line of `row_inputs` (verify rows score every query token, others their last one,
        # repeated; padding rows all zero), then, per draft in a query, the token it fills and its place in the
        # draft buffer (flat): one packed host-to-device copy.
        packed_rows, fill_tokens, fill_sources = [], [], []
        for row, start in zip(rows, cpu.query_start_loc.tolist()):
            req, last = row.request, row.num_query_tokens - 1
            scored = token_offset + start
            if row.is_prefill:  # columns min(c, last) for c in 0..K (K + 1 of them), without a loop per column
                packed_rows += [scored + last] * (k + 1)
            else:
                packed_rows += range(scored, scored + last + 1)
                packed_rows += [scored + last] * (k - last)
            packed_rows += [max(req.draft_row, 0), row.num_draft_tokens, int(row.samples), req.conv_slot]
            if row.is_prefill:
                continue
            if last > 0:  # its drafts, from the speculator's draft buffer
                fill_tokens += range(start + 1, start + 1 + last)
                fill_sources += range(req.draft_row * k, req.draft_row * k + last)
            if req.pending_token_row >= 0:  # its last token, from the in-flight step's (k = 0)
                fill_tokens.append(start)
                fill_sources.append(req.pending_token_row)
        width, rows_padded = k + 5, max(desc.num_reqs, num_reqs)
        packed_rows += [0] * ((rows_padded - num_reqs) * width)
        packed = host_tensor(packed_rows + fill_tokens + fill_sources, np.int64, pin_memory=self.pin_memory)
        self.row_inputs[row_offset : row_offset + rows_padded].copy_(
            packed[: rows_padded * width].view(rows_padded, width), non_blocking=True)
        if fill_tokens:
            # drafts: flat in the draft buffer; a pending token (k = 0): the in-flight step's, in step_out's
            # first column, which this step's sampling overwrites only after this gather
            source = self.speculator.draft_tokens.view(-1) if self.drafting else self.step_out[:, 0]
            fill = packed[rows_padded * width :].to(dev, non_blocking=True).view(2, -1)
            buffers.input_ids[fill[0]] = source[fill[1]]
        return {"cpu": cpu, "attn": attn, "conv": conv, "block_table": cpu.block_table,
                "real_input_ids": None if flat is None else flat.input_ids, **facts}

    def _row_facts(self, batch: ScheduledBatch, starts: list[int]) -> dict:
        """Per-row CPU facts, one tensor per dtype, for the speculator (VerifiedBatch) and the conv builder; plain
        decoding of an attention-only target needs none (None each). starts: each row's first position.

        Every decode row is a spec row (0..k drafts), even without speculation: its conv window then sits at
        num_accepted - 1, and the spec path is the one full graphs replay. The conv builder's draft count
        (`query_drafts`) is the drafts in each row's query (scored, not capped); -1 for a prompt row."""
        rows, num_reqs = batch.rows, batch.num_reqs
        facts = dict.fromkeys(("query_lens", "starts", "is_spec", "samples_cpu", "slots", "num_accepted",
                               "starts_32", "query_drafts"))
        if self.drafting:
            facts["query_lens"], facts["starts"] = host_tensor(
                [r.num_query_tokens for r in rows] + starts, np.int64).view(2, num_reqs).unbind(0)
            facts["is_spec"], facts["samples_cpu"] = host_tensor(
                [not r.is_prefill for r in rows] + [r.samples for r in rows], np.bool_).view(2, num_reqs).unbind(0)
        if self.drafting or self.conv_states:
            facts["slots"], facts["num_accepted"], facts["starts_32"], facts["query_drafts"] = host_tensor(
                [r.request.conv_slot for r in rows] + [r.request.num_accepted_tokens for r in rows] + starts
                + [r.num_query_tokens - 1 if not r.is_prefill else -1 for r in rows],
                np.int32).view(4, num_reqs).unbind(0)
        return facts

    def _verified_batch(self, batch: ScheduledBatch, prep: dict | None) -> VerifiedBatch:
        """What the speculator needs of a verified step: the rows' CPU facts and the device's sampled tokens. prep:
        `_prepare_target_inputs`'s, or None for a step advanced on the device (the facts are built here, after the
        verify was queued)."""
        advanced = prep is None
        if advanced:
            rows = batch.rows
            prep = self._row_facts(batch, [r.request.num_computed_tokens for r in rows])
            # the table the step's buffers hold, page-locked: the draft copies it to the device after its prefill
            prep["block_table"] = self._staged.block_table
        return VerifiedBatch(
            query_lens=prep["query_lens"],
            start_positions=prep["starts"],
            is_spec=prep["is_spec"],
            samples=prep["samples_cpu"],
            conv_slots=prep["slots"],
            num_accepted_prev=prep["num_accepted"],
            block_table=prep["block_table"],
            target_input_ids=self.buffers.input_ids[: batch.num_tokens],
            sampled=self.step_out[: batch.num_reqs, : self.k + 1],
            num_sampled=self.step_out[: batch.num_reqs, self.k + 1],
            target_buffers=self.buffers if advanced else None,
        )
