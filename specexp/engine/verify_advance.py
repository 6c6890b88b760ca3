"""A steady verify batch's inputs advanced on the device (`engine.steady_inputs_on_device`).

When a step verifies the same rows as the step before (same requests in the same order, the same query length
each, every row a decode row that samples), its inputs differ from that step's only by what the step accepted:
each row starts `num_sampled` positions further (t_last + the accepted drafts are now in the cache) and feeds its
newest token, then the drafts the speculator has just proposed. Everything else the step reads stays in place: the
query layout, each token's row, the rejection sampler's `row_inputs` and the padding. So instead of staging the
step on the host after the read-back (about 0.2-0.3 ms of host work at batch 1, during which the device waits
when the draft is shorter), the host launches one kernel that moves the rows forward from the last step's
`step_out`, in place:

    start[r]        = seq_lens[r] - q[r] + num_sampled[r]          q[r] = qsl[r + 1] - qsl[r]
    seq_lens[r]     = start[r] + q[r]
    positions[t]    = start[r] + i                                 t = qsl[r] + i, i < q[r]
    slot_mapping[t] = block_table[r, positions[t] // B] * B + positions[t] % B
    input_ids[t]    = sampled[r, num_sampled[r] - 1] if i == 0 else draft_tokens[draft_rows[r], i - 1]
    num_accepted[r] = num_sampled[r]          a target with short-conv layers: the window its next verify reads

The step before may be a plain decode step (no drafts, q = 1) or a verify of any depth, as long as this step's
rows have its query lengths. Tokens past qsl[R] and rows past R (padding) are left alone. The host still decides
which steps are steady (`TargetStepInputs._stage_step`); a running request keeps the blocks it was admitted with,
so the block table stays in place too. Of its graph's conv metadata, a target with short-conv layers reads only each
row's accepted count anew (its conv window), so that is written too.

The draft's prefill of such a step (`advance_prefill_regions`) follows from the target's advanced buffers: row r's
region holds q[r] + 1 slots at positions start[r] .. start[r] + q[r] (its verify's tokens and the new one), with
start[r] = target seq_lens[r] - q[r]; its block table is the target's row. The region's input ids come from the
verify as before (`draft_advance.fill_prefill_ids`).
"""

from __future__ import annotations

import torch

from specexp.models.triton_support import AVAILABLE, tl, triton

if AVAILABLE:

    @triton.jit
    def _advance_verify_kernel(step_out_ptr, qsl_ptr, seq_lens_ptr, positions_ptr, slot_mapping_ptr, input_ids_ptr,
                               block_table_ptr, draft_rows_ptr, draft_tokens_ptr, num_accepted_ptr, stride_out,
                               num_sampled_col, stride_table, stride_draft_rows, stride_drafts, block_size,
                               HAS_DRAFTS: tl.constexpr, HAS_CONV: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        first = tl.load(qsl_ptr + r).to(tl.int64)
        q = tl.load(qsl_ptr + r + 1).to(tl.int64) - first
        num_sampled = tl.load(step_out_ptr + r * stride_out + num_sampled_col)
        start = tl.load(seq_lens_ptr + r).to(tl.int64) - q + num_sampled
        tl.store(seq_lens_ptr + r, (start + q).to(tl.int32))
        if HAS_CONV:
            tl.store(num_accepted_ptr + r, num_sampled.to(tl.int32))
        i = tl.arange(0, BLOCK)
        ok = i < q
        position = start + i
        tl.store(positions_ptr + first + i, position, mask=ok)
        block = tl.load(block_table_ptr + r * stride_table + position // block_size, mask=ok, other=0)
        tl.store(slot_mapping_ptr + first + i, block.to(tl.int64) * block_size + position % block_size, mask=ok)
        newest = tl.load(step_out_ptr + r * stride_out + tl.maximum(num_sampled - 1, 0))
        if HAS_DRAFTS:
            draft_row = tl.load(draft_rows_ptr + r * stride_draft_rows)
            drafts = tl.load(draft_tokens_ptr + draft_row * stride_drafts + i - 1, mask=ok & (i > 0), other=0)
            ids = tl.where(i == 0, newest, drafts)
        else:
            ids = tl.zeros((BLOCK,), dtype=tl.int64) + newest
        tl.store(input_ids_ptr + first + i, ids, mask=ok)


def advance_verify_rows(step_out: torch.Tensor, num_sampled_col: int, num_reqs: int, num_tokens: int,
                        query_start_loc: torch.Tensor, token_req_indices: torch.Tensor, seq_lens: torch.Tensor,
                        positions: torch.Tensor, slot_mapping: torch.Tensor, input_ids: torch.Tensor,
                        block_table: torch.Tensor, draft_rows: torch.Tensor, draft_tokens: torch.Tensor | None,
                        block_size: int, num_accepted: torch.Tensor | None = None) -> None:
    """Rows [0, R) (R = num_reqs) of a steady verify batch one step further, in place (see the module doc), in torch.

    step_out: int64[>=R, K + 3] (the last step's sampled tokens in columns 0..K, their count in num_sampled_col);
    query_start_loc: int32[>=R + 1], with T = num_tokens = query_start_loc[R]; token_req_indices: int64[>=T] (each
    token's row); seq_lens: int32[>=R]; positions, slot_mapping, input_ids: int64[>=T]; block_table:
    int32[>=R, max_blocks]; draft_rows: int64[>=R] (where each row's drafts wait in draft_tokens); draft_tokens:
    int64[rows, K] (None: every query is one token, no drafts); num_accepted: int32[>=R], a target's short-conv
    graph buffer (`SpecGraphBuffers.num_accepted_tokens`), set to each row's num_sampled (None: no conv state)."""
    if num_reqs == 0:
        return
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    num_sampled = step_out[:num_reqs, num_sampled_col]
    if num_accepted is not None:
        num_accepted[:num_reqs] = num_sampled.to(torch.int32)
    start = seq_lens[:num_reqs].to(torch.int64) - (qsl[1:] - qsl[:-1]) + num_sampled
    seq_lens[:num_reqs] = (start + qsl[1:] - qsl[:-1]).to(torch.int32)
    row = token_req_indices[:num_tokens]
    i = torch.arange(num_tokens, device=row.device) - qsl[row]
    position = start[row] + i
    positions[:num_tokens] = position
    block = block_table[row, position // block_size]
    slot_mapping[:num_tokens] = block.to(torch.int64) * block_size + position % block_size
    newest = step_out[:num_reqs].gather(1, (num_sampled - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    ids = newest[row]
    if draft_tokens is not None:
        drafts = draft_tokens[draft_rows[:num_reqs][row], (i - 1).clamp(min=0)]
        ids = torch.where(i == 0, ids, drafts)
    input_ids[:num_tokens] = ids


def advance_verify_rows_triton(step_out: torch.Tensor, num_sampled_col: int, num_reqs: int, num_tokens: int,
                               query_start_loc: torch.Tensor, token_req_indices: torch.Tensor,
                               seq_lens: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                               input_ids: torch.Tensor, block_table: torch.Tensor, draft_rows: torch.Tensor,
                               draft_tokens: torch.Tensor | None, block_size: int,
                               num_accepted: torch.Tensor | None = None) -> None:
    """:func:`advance_verify_rows` in one Triton kernel, one program a row (the same arguments, the same results;
    step_out, the block table and the draft buffer with contiguous rows; token_req_indices is not read)."""
    if num_reqs == 0:
        return
    for name, t in (("step_out", step_out), ("block_table", block_table), ("draft_tokens", draft_tokens)):
        if t is not None and t.stride(1) != 1:
            raise ValueError(f"verify_advance.advance_verify_rows_triton: {name}'s rows must be contiguous")
    drafts = draft_tokens if draft_tokens is not None else step_out
    width = step_out.shape[1] - 2  # K + 1: the longest query
    _advance_verify_kernel[(num_reqs,)](
        step_out, query_start_loc, seq_lens, positions, slot_mapping, input_ids, block_table, draft_rows, drafts,
        num_accepted if num_accepted is not None else seq_lens, step_out.stride(0), num_sampled_col,
        block_table.stride(0), draft_rows.stride(0), drafts.stride(0), block_size,
        HAS_DRAFTS=draft_tokens is not None, HAS_CONV=num_accepted is not None,
        BLOCK=max(triton.next_power_of_2(width), 2), num_warps=1)


def advances_in_triton(tensor: torch.Tensor) -> bool:
    """Whether the `*_on_gpu` advances here run their one Triton kernel on buffers like `tensor` (an engine's
    `step_out`, a draft's query start locations: CUDA tensors, Triton installed) rather than torch's ops."""
    return tensor.is_cuda and AVAILABLE


def advance_verify_rows_on_gpu(step_out: torch.Tensor, *rest) -> None:
    """:func:`advance_verify_rows_triton` where :func:`advances_in_triton`; :func:`advance_verify_rows` (torch)
    elsewhere."""
    if advances_in_triton(step_out):
        advance_verify_rows_triton(step_out, *rest)
    else:
        advance_verify_rows(step_out, *rest)


if AVAILABLE:

    @triton.jit
    def _prefill_regions_kernel(target_qsl_ptr, target_seq_lens_ptr, target_table_ptr, region_qsl_ptr, seq_lens_ptr,
                                positions_ptr, slot_mapping_ptr, block_table_ptr, start_ptr, stride_target_table,
                                stride_table, num_blocks, block_size, BLOCK: tl.constexpr, BLOCK_B: tl.constexpr):
        r = tl.program_id(0)
        q = (tl.load(target_qsl_ptr + r + 1) - tl.load(target_qsl_ptr + r)).to(tl.int64)
        start = tl.load(target_seq_lens_ptr + r).to(tl.int64) - q
        tl.store(start_ptr + r, start)
        tl.store(seq_lens_ptr + r, (start + q + 1).to(tl.int32))
        b = tl.arange(0, BLOCK_B)
        b_ok = b < num_blocks
        tl.store(block_table_ptr + r * stride_table + b,
                 tl.load(target_table_ptr + r * stride_target_table + b, mask=b_ok), mask=b_ok)
        i = tl.arange(0, BLOCK)
        ok = i <= q
        first = tl.load(region_qsl_ptr + r).to(tl.int64)
        position = start + i
        tl.store(positions_ptr + first + i, position, mask=ok)
        block = tl.load(target_table_ptr + r * stride_target_table + position // block_size, mask=ok, other=0)
        tl.store(slot_mapping_ptr + first + i, block.to(tl.int64) * block_size + position % block_size, mask=ok)


def advance_prefill_regions(target_qsl: torch.Tensor, target_seq_lens: torch.Tensor, target_block_table: torch.Tensor,
                            num_reqs: int, num_slots: int, region_qsl: torch.Tensor, region_rows: torch.Tensor,
                            seq_lens: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                            block_table: torch.Tensor, start: torch.Tensor, block_size: int,
                            max_region_slots: int) -> None:
    """The draft prefill's buffers for rows [0, R) of a steady step from the target's advanced ones, in place (see
    the module doc), in torch. max_region_slots: the longest region's slots (max q[r] + 1; the kernel's tile).

    target_qsl: int32[>=R + 1]; target_seq_lens: int32[>=R]; target_block_table: int32[>=R, B]; region_qsl:
    int32[>=R + 1] (each region's first slot; S = num_slots = the regions' slots, sum of q[r] + 1); region_rows:
    int64[>=S] (each slot's row); seq_lens: int32[>=R]; positions, slot_mapping: int64[>=S]; block_table:
    int32[>=R, B]; start: int64[>=R] (each row's first position, written)."""
    if num_reqs == 0:
        return
    tq = target_qsl[: num_reqs + 1].to(torch.int64)
    q = tq[1:] - tq[:-1]
    row_start = target_seq_lens[:num_reqs].to(torch.int64) - q
    start[:num_reqs] = row_start
    seq_lens[:num_reqs] = (row_start + q + 1).to(torch.int32)
    block_table[:num_reqs] = target_block_table[:num_reqs]
    row = region_rows[:num_slots]
    position = row_start[row] + torch.arange(num_slots, device=row.device) - region_qsl[row].to(torch.int64)
    positions[:num_slots] = position
    block = target_block_table[row, position // block_size]
    slot_mapping[:num_slots] = block.to(torch.int64) * block_size + position % block_size


def advance_prefill_regions_triton(target_qsl: torch.Tensor, target_seq_lens: torch.Tensor,
                                   target_block_table: torch.Tensor, num_reqs: int, num_slots: int,
                                   region_qsl: torch.Tensor, region_rows: torch.Tensor, seq_lens: torch.Tensor,
                                   positions: torch.Tensor, slot_mapping: torch.Tensor, block_table: torch.Tensor,
                                   start: torch.Tensor, block_size: int, max_region_slots: int) -> None:
    """:func:`advance_prefill_regions` in one Triton kernel, one program a row (the same arguments, the same results;
    region_rows is not read; both block tables with contiguous rows)."""
    if num_reqs == 0:
        return
    if target_block_table.stride(1) != 1 or block_table.stride(1) != 1:
        raise ValueError("verify_advance.advance_prefill_regions_triton: the block tables' rows must be contiguous")
    num_blocks = block_table.shape[1]
    _prefill_regions_kernel[(num_reqs,)](
        target_qsl, target_seq_lens, target_block_table, region_qsl, seq_lens, positions, slot_mapping, block_table,
        start, target_block_table.stride(0), block_table.stride(0), num_blocks, block_size,
        BLOCK=max(triton.next_power_of_2(max_region_slots), 2), BLOCK_B=max(triton.next_power_of_2(num_blocks), 2),
        num_warps=1)


def advance_prefill_regions_on_gpu(target_qsl: torch.Tensor, *rest) -> None:
    """:func:`advance_prefill_regions_triton` where :func:`advances_in_triton`; :func:`advance_prefill_regions`
    (torch) elsewhere."""
    if advances_in_triton(target_qsl):
        advance_prefill_regions_triton(target_qsl, *rest)
    else:
        advance_prefill_regions(target_qsl, *rest)
