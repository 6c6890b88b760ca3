"""The draft prefill of a steady step, staged on the device (`engine.steady_inputs_on_device`).

When the target's step was advanced on the device (`TargetStepInputs._stage_step`: the rows of the step before,
each one step further), the draft's prefill covers the same rows with the same region layout as its last one: only
each region's positions, KV slots, sequence length and start move, and they follow from the target's advanced
buffers (`verify_advance.advance_prefill_regions`). The host's staging of the regions (a CPU build and five
host-to-device copies between the verify and the draft's prefill graph) is then one kernel; the region ids are
filled from the verify as on every step (`draft_advance.fill_prefill_ids`), from the staged vector kept from the
last step (its per-slot and per-row layout is the same; its start column is rewritten in place).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor
from specexp.engine.verified import StagedRows, VerifiedBatch
from specexp.engine.verify_advance import advance_prefill_regions_on_gpu


@dataclass
class StagedPrefill:
    """The draft prefill staged last from the host, while its buffers still hold it: its layout key
    (`prefill_layout_key`), the prefill buffers' `version` right after, its staged vector on the device (int64[3 S +
    5 R]: `draft_advance.fill_prefill_ids`'s layout, then each row's start and samples flag) and its slots S."""

    key: tuple
    version: int
    staged: torch.Tensor
    num_slots: int

    def start(self, num_reqs: int) -> torch.Tensor:
        """int64[R]: each row's first position, in the staged vector (the decode steps read it)."""
        offset = 3 * self.num_slots + 3 * num_reqs
        return self.staged[offset : offset + num_reqs]

    def samples(self, num_reqs: int) -> torch.Tensor:
        """int64[R]: whether each row sampled a token, in the staged vector."""
        offset = 3 * self.num_slots + 4 * num_reqs
        return self.staged[offset : offset + num_reqs]


def prefill_layout_key(batch: VerifiedBatch, desc: BatchExecutionDescriptor, has_conv_state: bool) -> tuple | None:
    """What a graph-replayed prefill of verify rows lays out the same way on consecutive steady steps: the padded
    shape and each row's query length. None when it cannot be advanced on the device: no graph, a prompt row, or a
    draft with conv state (its conv metadata is built on the host)."""
    if desc.cg_mode != FULL or has_conv_state or not bool(batch.is_spec.all()):
        return None
    return (desc.num_reqs, desc.num_tokens, *batch.query_lens.tolist())


def advance_prefill(spec, batch: VerifiedBatch, desc: BatchExecutionDescriptor, last: StagedPrefill) -> StagedRows:
    """Stage a steady step's draft prefill on the device (`spec`: the `AutoRegressiveSpeculator`; batch: the verified
    step, advanced on the device, `batch.target_buffers` set; last: the prefill staged last, of this layout):
    the regions from the target's buffers, then their ids from the verify. Returns the rows' device facts, as
    `AutoRegressiveSpeculator._prepare_prefill_inputs` does."""
    num_reqs = batch.query_lens.numel()
    buffers, target = spec.prefill_buffers, batch.target_buffers
    advance_prefill_regions_on_gpu(
        target.query_start_loc, target.seq_lens, target.block_table, num_reqs, last.num_slots,
        buffers.query_start_loc, buffers.token_req_indices, buffers.seq_lens, buffers.positions,
        buffers.slot_mapping, buffers.block_table, last.start(num_reqs), spec.block_size,
        int(batch.query_lens.max()) + 1)
    num_valid = spec.fill_prefill_ids(last.staged, last.num_slots, num_reqs, batch.num_sampled, batch.sampled,
                                      batch.target_input_ids, buffers.input_ids,
                                      spec.last_token_indices[: desc.num_reqs], 0)
    return StagedRows(num_valid, last.start(num_reqs), last.samples(num_reqs))
