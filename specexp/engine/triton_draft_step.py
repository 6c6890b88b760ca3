"""The draft's per-step bookkeeping in Triton kernels (`engine.draft_step_kernel=triton`): before each decode
step after the first, every row feeds its last draft token one position further (`advance_draft_rows`); and
before its prefill, each region's input ids from the verify's tokens (`fill_prefill_ids`, below).

For each row r < R (one program per block of rows), as `AutoRegressiveSpeculator._decode` does it in torch:

    input_ids[r]    = draft_tokens[r, step - 1]
    positions[r]   += 1
    seq_lens[r]    += 1
    slot_mapping[r] = block_table[r, positions[r] // B] * B + positions[r] % B   where writes[r], else -1

In torch that is about eleven small kernels a draft step (a copy, two adds, a division, a gather, a cast, a
multiply, a remainder, an add, a select, a copy), inside the fused multi-step decode graph, where the draft's own
forward of a ~100M-parameter model is bound by its kernel count at batch 1.

Importable without Triton (`AVAILABLE` False); the kernel needs a CUDA device, or Triton's interpreter
(`TRITON_INTERPRET=1`) for CPU tensors.
"""

from __future__ import annotations

import torch

from specexp.models.triton_support import AVAILABLE, tl, triton

ROWS_PER_PROGRAM = 64

if AVAILABLE:

    @triton.jit
    def _advance_kernel(draft_tokens_ptr, input_ids_ptr, positions_ptr, seq_lens_ptr, block_table_ptr, writes_ptr,
                        slot_mapping_ptr, num_rows, column, stride_drafts, stride_table, block_size,
                        BLOCK: tl.constexpr):
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = rows < num_rows
        tl.store(input_ids_ptr + rows, tl.load(draft_tokens_ptr + rows * stride_drafts + column, mask=ok), mask=ok)
        position = tl.load(positions_ptr + rows, mask=ok, other=0) + 1
        tl.store(positions_ptr + rows, position, mask=ok)
        tl.store(seq_lens_ptr + rows, tl.load(seq_lens_ptr + rows, mask=ok, other=0) + 1, mask=ok)
        block = tl.load(block_table_ptr + rows * stride_table + position // block_size, mask=ok, other=0)
        slot = block.to(tl.int64) * block_size + position % block_size
        writes = tl.load(writes_ptr + rows, mask=ok, other=0) != 0
        tl.store(slot_mapping_ptr + rows, tl.where(writes, slot, -1), mask=ok)


    # Launched eagerly with sizes and view offsets that change from step to step: one compiled variant for all of
    # them (no specialisation on an int's value or a pointer's alignment), so no step compiles mid-run.
    @triton.jit(do_not_specialize=["num_slots", "num_reqs", "num_rows", "stride_num_sampled", "stride_sampled",
                                   "stride_target", "token_offset"],
                do_not_specialize_on_alignment=["staged_ptr", "num_sampled_ptr", "sampled_ptr", "target_ids_ptr",
                                                "input_ids_ptr", "rows_ptr", "num_valid_ptr"])
    def _prefill_ids_kernel(staged_ptr, num_sampled_ptr, sampled_ptr, target_ids_ptr, input_ids_ptr, rows_ptr,
                            num_valid_ptr, num_slots, num_reqs, num_rows, stride_num_sampled, stride_sampled,
                            stride_target, token_offset, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        # staged: region_row, region_i, src (num_slots each), then query_lens, is_spec, region_start (num_reqs each)
        lens_ptr = staged_ptr + 3 * num_slots
        spec_ptr = lens_ptr + num_reqs
        start_ptr = spec_ptr + num_reqs
        slot_ok = i < num_slots
        row = tl.load(staged_ptr + i, mask=slot_ok, other=0)
        index = tl.load(staged_ptr + num_slots + i, mask=slot_ok, other=0)
        src = tl.load(staged_ptr + 2 * num_slots + i, mask=slot_ok, other=0)
        sampled = tl.load(num_sampled_ptr + row * stride_num_sampled, mask=slot_ok, other=0)
        valid = tl.where(tl.load(spec_ptr + row, mask=slot_ok, other=0) != 0, sampled,
                         tl.load(lens_ptr + row, mask=slot_ok, other=0))
        new_token = tl.load(sampled_ptr + row * stride_sampled + tl.maximum(sampled - 1, 0), mask=slot_ok, other=0)
        target = tl.load(target_ids_ptr + src * stride_target, mask=slot_ok & (index < valid), other=0)
        ids = tl.where(index < valid, target, tl.where(index == valid, tl.maximum(new_token, 0), 0))
        tl.store(input_ids_ptr + tl.load(start_ptr + row, mask=slot_ok, other=0) + index, ids, mask=slot_ok)
        # per row: the last valid slot's index in the forward, and the row's valid count; padding rows 0
        req_ok = i < num_reqs
        sampled = tl.load(num_sampled_ptr + i * stride_num_sampled, mask=req_ok, other=0)
        valid = tl.where(tl.load(spec_ptr + i, mask=req_ok, other=0) != 0, sampled,
                         tl.load(lens_ptr + i, mask=req_ok, other=0))
        tl.store(num_valid_ptr + i, valid, mask=req_ok)
        last = tl.load(start_ptr + i, mask=req_ok, other=0) + token_offset + valid
        tl.store(rows_ptr + i, tl.where(req_ok, last, 0), mask=i < num_rows)


def advance_draft_rows(draft_tokens: torch.Tensor, step: int, input_ids: torch.Tensor, positions: torch.Tensor,
                       seq_lens: torch.Tensor, block_table: torch.Tensor, writes: torch.Tensor,
                       slot_mapping: torch.Tensor, block_size: int) -> None:
    """Rows [0, R) (R = input_ids.shape[0]) one position further, in place (see the module doc).

    draft_tokens: int64[>=R, K] (column step - 1 read); input_ids, positions, slot_mapping: int64[R];
    seq_lens: int32[R]; block_table: int32[>=R, max_blocks] (rows contiguous); writes: bool[R] (rows that write
    their KV). Capturable in a CUDA graph (one launch)."""
    num_rows = input_ids.shape[0]
    if num_rows == 0:
        return
    if not 1 <= step <= draft_tokens.shape[1] or block_table.stride(1) != 1 or draft_tokens.stride(1) != 1:
        raise ValueError(f"triton_draft_step.advance_draft_rows: step {step} of draft columns "
                         f"{draft_tokens.shape[1]}; block table and draft buffer rows must be contiguous")
    block = min(ROWS_PER_PROGRAM, max(triton.next_power_of_2(num_rows), 2))
    _advance_kernel[(triton.cdiv(num_rows, block),)](
        draft_tokens, input_ids, positions, seq_lens, block_table, writes.view(torch.uint8), slot_mapping,
        num_rows, step - 1, draft_tokens.stride(0), block_table.stride(0), block_size, BLOCK=block, num_warps=1)


def fill_prefill_ids(staged: torch.Tensor, num_slots: int, num_reqs: int, num_sampled: torch.Tensor,
                     sampled: torch.Tensor, target_input_ids: torch.Tensor, input_ids: torch.Tensor,
                     rows: torch.Tensor, token_offset: int) -> torch.Tensor:
    """:func:`specexp.engine.draft_advance.fill_prefill_ids` in one Triton kernel (same arguments, same
    results; any strides but the sampled tokens' rows contiguous). Capturable in a CUDA graph (one launch)."""
    if sampled.stride(1) != 1:
        raise ValueError("triton_draft_step.fill_prefill_ids: the sampled tokens' rows must be contiguous")
    num_valid = torch.empty(num_reqs, dtype=num_sampled.dtype, device=staged.device)
    span = max(num_slots, rows.shape[0], 1)
    block = min(1024, max(triton.next_power_of_2(span), 16))
    _prefill_ids_kernel[(triton.cdiv(span, block),)](
        staged, num_sampled, sampled, target_input_ids, input_ids, rows, num_valid, num_slots, num_reqs,
        rows.shape[0], num_sampled.stride(0), sampled.stride(0), target_input_ids.stride(0), token_offset,
        BLOCK=block, num_warps=4)
    return num_valid
