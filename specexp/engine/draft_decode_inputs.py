"""The inputs of the draft's decode steps (a mixin of `AutoRegressiveSpeculator`): after its prefill, each row's
new token's position, sequence length, block table and KV-write flag in the decode buffers, and for a draft with
conv state the scratch conv windows the decode steps run on (`speculator` module doc)."""

from __future__ import annotations

import torch

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor, graph_key
from specexp.engine.verified import StagedRows, VerifiedBatch
from specexp.models.short_conv_ops import seed_scratch_windows


class DraftDecodeInputs:
    """The decode-input half of `AutoRegressiveSpeculator` (its decode buffers, conv states and builders)."""

    def _load_decode_rows(self, num_reqs: int, num_reqs_padded: int, rows: StagedRows | None = None,
                          block_table: torch.Tensor | None = None) -> None:
        """Decode buffers for rows [0, num_reqs) and padding up to num_reqs_padded: one token per row, row r at
        position rows.start[r] + rows.num_valid[r] (its new token) with that seq_len + 1, writing its KV where
        rows.samples[r]; block_table int32[R, max_blocks] (CPU). Padding rows (all rows when rows is None: dummy
        rows) sit at position 0 with seq_len 0 and write no request's KV. Four device operations for real rows,
        four more where there is padding: this runs between the draft's prefill and decode graphs."""
        buffers = self.decode_buffers  # query_start_loc and token_req_indices: fixed at init (arange)
        first_pad = 0 if rows is None else num_reqs
        if first_pad < num_reqs_padded:
            buffers.positions[first_pad:num_reqs_padded].zero_()
            buffers.seq_lens[first_pad:num_reqs_padded].zero_()
            buffers.block_table[first_pad:num_reqs_padded].zero_()
            self.decode_writes[first_pad:num_reqs_padded].zero_()
        if rows is None:
            return
        positions = buffers.positions[:num_reqs]
        torch.add(rows.start, rows.num_valid, out=positions)
        torch.add(positions, 1, out=buffers.seq_lens[:num_reqs])  # int64 -> the int32 seq_lens, in one kernel
        buffers.block_table[:num_reqs].copy_(block_table, non_blocking=True)
        self.decode_writes[:num_reqs].copy_(rows.samples)

    def _prepare_decode_inputs(self, batch: VerifiedBatch, rows: StagedRows,
                               desc: BatchExecutionDescriptor) -> None:
        """Decode state before step 1: position of the new token, its seq_len, the block table, and the
        scratch conv windows ending at the new token."""
        num_reqs = batch.query_lens.numel()
        dev = self.device
        # Rows that sampled nothing (mid-prompt chunks) must not write KV.
        self._load_decode_rows(num_reqs, desc.num_reqs, rows, batch.block_table)
        conv = None
        if self.conv_states:
            slots = batch.conv_slots.to(torch.int64)
            scratch = slots + self.max_num_reqs
            staged = torch.stack((slots, scratch))
            slots_d, scratch_d = (staged.pin_memory() if self.pin_memory else staged).to(dev, non_blocking=True)
            seed_scratch_windows(self.conv_state_stack, slots_d, scratch_d, batch.num_sampled, self.conv_width)
            conv = self.decode_conv_builder.build(
                query_start_loc_cpu=torch.arange(num_reqs + 1, dtype=torch.int32),
                num_computed_tokens_cpu=torch.ones(num_reqs, dtype=torch.int32),
                num_decode_draft_tokens_cpu=torch.zeros(num_reqs, dtype=torch.int32),
                num_accepted_tokens_cpu=torch.ones(num_reqs, dtype=torch.int32),
                state_indices_cpu=scratch.to(torch.int32),
                num_reqs_padded=desc.num_reqs if desc.cg_mode == FULL else None,
            )
        if desc.cg_mode == FULL:
            self._decode_ctx = self._decode_graph_ctx[graph_key(desc)]
            return
        # desc.max_seq_len: propose's CPU upper bound of the last decode step's seq_len (num_valid <= q).
        attn = self.decode_buffers.attention_metadata(num_reqs, num_reqs, desc.max_seq_len, 1, num_reqs)
        self._decode_ctx = self._ctx(attn, conv)
