"""The draft's device-side bookkeeping, in torch or in Triton kernels (`engine.draft_step_kernel`,
`specexp.engine.triton_draft_step`):

- `advance(draft_tokens, step, input_ids, positions, seq_lens, block_table, writes, slot_mapping, block_size)`:
  how the fused multi-step decode moves its rows one position further before each step after the first, in place;
- `fill_prefill_ids(staged, num_slots, num_reqs, num_sampled, sampled, target_input_ids, input_ids, rows,
  token_offset) -> num_valid`: the input ids of the draft's prefill regions from what the verify accepted
  (about fifteen small kernels in torch, eager between the verify and the draft's prefill graph; one in Triton);
  `prefill_regions(query_lens, row_stride)` lays out, on the host, the region slots it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specexp.engine import triton_draft_step
from specexp.engine.draft_catch_up import place_last_two, place_last_two_on_gpu


def advance_draft_rows(draft_tokens: torch.Tensor, step: int, input_ids: torch.Tensor, positions: torch.Tensor,
                       seq_lens: torch.Tensor, block_table: torch.Tensor, writes: torch.Tensor,
                       slot_mapping: torch.Tensor, block_size: int) -> None:
    """Rows [0, R) (R = input_ids.shape[0]) one position further, in place: each feeds draft token step - 1
    (draft_tokens int64[>=R, K]) at its next position (positions int64[R] and seq_lens int32[R] + 1), its KV slot
    from its block table (int32[R, max_blocks]) where it writes (writes bool[R]), else slot -1 (slot_mapping
    int64[R])."""
    num_rows = input_ids.shape[0]
    input_ids.copy_(draft_tokens[:num_rows, step - 1])
    positions.add_(1)
    seq_lens.add_(1)
    blocks = block_table.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1).to(torch.int64)
    slot_mapping.copy_(torch.where(writes, blocks * block_size + positions % block_size, -1))


def advance_draft_rows_on_gpu(draft_tokens: torch.Tensor, step: int, input_ids: torch.Tensor, *rest) -> None:
    """:func:`advance_draft_rows` in one Triton kernel for CUDA tensors (`triton_draft_step`); torch otherwise."""
    if input_ids.is_cuda and triton_draft_step.AVAILABLE:
        triton_draft_step.advance_draft_rows(draft_tokens, step, input_ids, *rest)
    else:
        advance_draft_rows(draft_tokens, step, input_ids, *rest)


def prefill_regions(query_lens: list[int], row_stride: int | None = None
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """The draft prefill's region slots for rows of `query_lens` target inputs: region r holds q_r + 1 slots.
    Returns (region_row, region_i, src, region_start): per slot its row, its index in the region and the target
    input it copies (the row's i-th, its last for the extra slot); per row its first slot (consecutive regions,
    or r * row_stride)."""
    region_row, region_i, src, region_start = [], [], [], []
    target_start = 0
    for r, q in enumerate(query_lens):
        region_start.append(len(region_row) if row_stride is None else r * row_stride)
        region_row += [r] * (q + 1)
        region_i += range(q + 1)
        src += [target_start + min(i, q - 1) for i in range(q + 1)]
        target_start += q
    return region_row, region_i, src, region_start


def fill_prefill_ids(staged: torch.Tensor, num_slots: int, num_reqs: int, num_sampled: torch.Tensor,
                     sampled: torch.Tensor, target_input_ids: torch.Tensor, input_ids: torch.Tensor,
                     rows: torch.Tensor, token_offset: int) -> torch.Tensor:
    """The draft prefill's inputs from a verify, on the device. Region slot s (of num_slots) belongs to row
    region_row[s] at index region_i[s] of its region and copies target input src[s]; staged is int64[3 S + 3 R +
    ...]: region_row, region_i, src (S each), then per row (R = num_reqs) query_len, is_spec, region_start (the
    row's first slot in input_ids; further columns are ignored). A row keeps its first num_valid inputs (verify
    rows: num_sampled[r], the last input and the accepted drafts; prompt rows: query_len), then feeds its newest
    token (sampled[r, num_sampled[r] - 1], at least 0), then 0s:

        input_ids[region_start[r] + i] = target_input_ids[src] if i < num_valid[r], new token if i == it, else 0
        rows[r] = region_start[r] + token_offset + num_valid[r] for r < R; rows[R:] = 0

    num_sampled int64[R], sampled int64[R, k + 1], target_input_ids int64[T] (device); input_ids, rows int64,
    written in place. Returns num_valid int64[R]."""
    region_row, region_i, src = staged[: 3 * num_slots].view(3, num_slots)
    query_lens, is_spec, region_start = staged[3 * num_slots : 3 * num_slots + 3 * num_reqs].view(3, num_reqs)
    num_valid = torch.where(is_spec != 0, num_sampled, query_lens)
    last_col = (num_sampled - 1).clamp(min=0).unsqueeze(1)
    new_token = sampled.gather(1, last_col).squeeze(1).clamp(min=0)
    valid_here = num_valid[region_row]
    ids = torch.where(region_i < valid_here, target_input_ids[src],
                      torch.where(region_i == valid_here, new_token[region_row], 0))
    input_ids[region_start[region_row] + region_i] = ids
    torch.add(region_start + token_offset, num_valid, out=rows[:num_reqs])
    rows[num_reqs:].zero_()
    return num_valid


def fill_prefill_ids_on_gpu(staged: torch.Tensor, *rest) -> torch.Tensor:
    """:func:`fill_prefill_ids` in one Triton kernel for CUDA tensors (`triton_draft_step`); torch otherwise."""
    if staged.is_cuda and triton_draft_step.AVAILABLE:
        return triton_draft_step.fill_prefill_ids(staged, *rest)
    return fill_prefill_ids(staged, *rest)


@dataclass(frozen=True)
class DraftStepKernels:
    """What one `engine.draft_step_kernel` setting runs: `advance` and `fill_prefill_ids` (see the module doc), and
    `place_last_two` (the two-slot prefill regions, `draft_catch_up`)."""

    advance: Callable[..., None]
    fill_prefill_ids: Callable[..., torch.Tensor]
    place_last_two: Callable[..., torch.Tensor]


DRAFT_STEP_KERNELS: dict[str, DraftStepKernels] = {
    "torch": DraftStepKernels(advance_draft_rows, fill_prefill_ids, place_last_two),
    "triton": DraftStepKernels(advance_draft_rows_on_gpu, fill_prefill_ids_on_gpu, place_last_two_on_gpu),
}
