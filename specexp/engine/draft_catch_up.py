"""The draft's prefill over the last two verified slots of each row (`engine.draft_prefill_region=last_two`).

After a verify of v drafts with a of them accepted, an attention-only draft lacks the KV of at most two of the
row's committed tokens. Its decode steps of the last proposal fed t_last, d_1 .. d_{k-1} at positions
start .. start + k - 1 (start: t_last's position), so the cache already holds every committed token up to
position start + a - 1 (a <= k); what it lacks is d_a at start + a when every draft was accepted (d_k was never
fed) and the new token at start + a + 1. The region of the full layout (`speculator` module doc: v + 2 slots,
t_last onwards) recomputes the accepted ones too. A two-slot region, whatever v was,

    slot 2r:     the row's target input at index a (t_last when a = 0, else d_a)   at position start + a
    slot 2r + 1: the new token (correction or bonus), whose hidden state gives draft 0  at position start + a + 1

with seq_len start + a + 2, needs that KV and no more: the KV it writes at start + a is that token's (again, when
a < k), and everything past start + a + 1 is beyond the row's sequence until a later step writes it. Only a
draft's attention layers may be rebuilt this way: a short-conv layer's state is a window, not a cache by
position, so drafts with conv state keep the full region (`AutoRegressiveSpeculator`).

The row's start position comes from a seq_len-like vector plus a constant: the target's advanced seq_lens less
q on a steady step (`verify_advance`), or the region buffers' own seq_lens less 2 after the host loaded the rows at
their start (any other step). a + 1 = num_sampled (the tokens the verify emitted; at least 1 for a verify row,
taken as 1 if a row emitted none).

    place_last_two(...)                 torch (CPU, or eager on a GPU: about twenty small kernels)
    place_last_two_triton(...)          one Triton kernel, one program a row (`engine.draft_step_kernel=triton`)
    stage_last_two(spec, batch, desc)   a uniform verify batch's regions in the speculator's prefill buffers, the
                                        start taken either way above
    takes_last_two(region, has_conv)    whether a draft takes two-slot regions under the setting
"""

from __future__ import annotations

import torch

from specexp.engine.cudagraph import BatchExecutionDescriptor
from specexp.engine.errors import EngineConfigError
from specexp.engine.inputs import build_step_inputs
from specexp.engine.verified import StagedRows, VerifiedBatch
from specexp.models.triton_support import AVAILABLE, tl, triton

if AVAILABLE:

    # Launched eagerly with a row count, an offset and view offsets that change between steps: one compiled
    # variant for all of them, so no step compiles mid-run.
    @triton.jit(do_not_specialize=["num_reqs", "seq_offset", "q", "stride_num_sampled", "stride_sampled",
                                   "stride_table", "stride_src_table"],
                do_not_specialize_on_alignment=["seq_src_ptr", "num_sampled_ptr", "sampled_ptr", "target_ids_ptr",
                                                "table_ptr", "src_table_ptr", "positions_ptr", "seq_lens_ptr",
                                                "slot_mapping_ptr", "input_ids_ptr", "rows_ptr", "start_ptr",
                                                "num_valid_ptr"])
    def _last_two_kernel(seq_src_ptr, num_sampled_ptr, sampled_ptr, target_ids_ptr, table_ptr, src_table_ptr,
                         positions_ptr, seq_lens_ptr, slot_mapping_ptr, input_ids_ptr, rows_ptr, start_ptr,
                         num_valid_ptr, num_reqs, seq_offset, q, stride_num_sampled, stride_sampled, stride_table,
                         stride_src_table, num_blocks, block_size, COPY_TABLE: tl.constexpr, BLOCK_B: tl.constexpr):
        r = tl.program_id(0)
        real = r < num_reqs  # rows past R are padding: no region, draft 0 read from slot 0
        tl.store(rows_ptr + r, tl.where(real, 2 * r + 1, 0))
        start = tl.load(seq_src_ptr + r, mask=real, other=0).to(tl.int64) + seq_offset
        num_valid = tl.maximum(tl.load(num_sampled_ptr + r * stride_num_sampled, mask=real, other=1), 1)
        if COPY_TABLE:
            b = tl.arange(0, BLOCK_B)
            b_ok = (b < num_blocks) & real
            tl.store(table_ptr + r * stride_table + b, tl.load(src_table_ptr + r * stride_src_table + b, mask=b_ok),
                     mask=b_ok)
        i = tl.arange(0, 2)
        ok = (i < 2) & real
        position = start + num_valid - 1 + i
        # from the source table: its copy above may not be visible to this program's other threads yet
        block = tl.load(src_table_ptr + r * stride_src_table + position // block_size, mask=ok, other=0)
        tl.store(positions_ptr + 2 * r + i, position, mask=ok)
        tl.store(slot_mapping_ptr + 2 * r + i, block.to(tl.int64) * block_size + position % block_size, mask=ok)
        last_input = tl.load(target_ids_ptr + r * q + num_valid - 1, mask=real, other=0)
        newest = tl.maximum(tl.load(sampled_ptr + r * stride_sampled + num_valid - 1, mask=real, other=0), 0)
        tl.store(input_ids_ptr + 2 * r + i, tl.where(i == 0, last_input, newest), mask=ok)
        tl.store(seq_lens_ptr + r, (start + num_valid + 1).to(tl.int32), mask=real)
        tl.store(start_ptr + r, start, mask=real)
        tl.store(num_valid_ptr + r, num_valid, mask=real)


def place_last_two(seq_src: torch.Tensor, seq_offset: int, num_reqs: int, q: int, num_sampled: torch.Tensor,
                   sampled: torch.Tensor, target_input_ids: torch.Tensor, block_table: torch.Tensor, block_size: int,
                   positions: torch.Tensor, seq_lens: torch.Tensor, slot_mapping: torch.Tensor,
                   input_ids: torch.Tensor, rows: torch.Tensor, start: torch.Tensor, num_valid: torch.Tensor,
                   src_table: torch.Tensor | None = None) -> torch.Tensor:
    """The two-slot regions of R = num_reqs uniform verify rows (q target inputs each), in place, in torch (see the
    module doc). Returns num_valid[:R].

    seq_src: int[>=R], start[r] = seq_src[r] + seq_offset; num_sampled int64[>=R]; sampled int64[>=R, K + 1];
    target_input_ids int64[R * q] (row r's at r * q); block_table int32[>=R, B] (the region buffers'; with
    src_table int32[>=R, B] given, its rows are copied in first). Written: positions, slot_mapping, input_ids
    int64[>=2R] (row r's slots at 2r, 2r + 1); seq_lens int32[>=R]; rows int64 (the draft-0 slot per row, 2r + 1;
    0 for rows past R); start, num_valid int64[>=R] (t_last's position; num_sampled at least 1)."""
    rows[num_reqs:].zero_()
    if num_reqs == 0:
        return num_valid[:0]
    if src_table is not None:
        block_table[:num_reqs].copy_(src_table[:num_reqs])
    row_start = seq_src[:num_reqs].to(torch.int64) + seq_offset
    valid = num_sampled[:num_reqs].clamp(min=1)
    first = row_start + valid - 1
    position = torch.stack((first, first + 1), dim=1).view(-1)  # [2R]
    slot_row = torch.arange(2 * num_reqs, device=position.device) // 2
    block = block_table[slot_row, position // block_size].to(torch.int64)
    positions[: 2 * num_reqs] = position
    slot_mapping[: 2 * num_reqs] = block * block_size + position % block_size
    row_ids = torch.arange(num_reqs, device=position.device)
    last_input = target_input_ids[row_ids * q + valid - 1]
    newest = sampled[:num_reqs].gather(1, (valid - 1).unsqueeze(1)).squeeze(1).clamp(min=0)
    input_ids[: 2 * num_reqs] = torch.stack((last_input, newest), dim=1).view(-1)
    seq_lens[:num_reqs] = (first + 2).to(seq_lens.dtype)
    rows[:num_reqs] = 2 * row_ids + 1
    start[:num_reqs] = row_start
    num_valid[:num_reqs] = valid
    return num_valid[:num_reqs]


def place_last_two_triton(seq_src: torch.Tensor, seq_offset: int, num_reqs: int, q: int, num_sampled: torch.Tensor,
                          sampled: torch.Tensor, target_input_ids: torch.Tensor, block_table: torch.Tensor,
                          block_size: int, positions: torch.Tensor, seq_lens: torch.Tensor,
                          slot_mapping: torch.Tensor, input_ids: torch.Tensor, rows: torch.Tensor, start: torch.Tensor,
                          num_valid: torch.Tensor, src_table: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`place_last_two` in one Triton kernel, one program per line of `rows` (the same arguments and results;
    block tables and `sampled` with contiguous rows; num_sampled may be strided, e.g. a column of the step's
    read-back buffer)."""
    for name, t in (("block_table", block_table), ("src_table", src_table), ("sampled", sampled)):
        if t is not None and t.stride(1) != 1:
            raise ValueError(f"draft_catch_up.place_last_two_triton: {name}'s rows must be contiguous")
    if rows.numel():
        table = src_table if src_table is not None else block_table
        num_blocks = block_table.shape[1]
        _last_two_kernel[(rows.numel(),)](
            seq_src, num_sampled, sampled, target_input_ids, block_table, table, positions, seq_lens, slot_mapping,
            input_ids, rows, start, num_valid, num_reqs, seq_offset, q, num_sampled.stride(0), sampled.stride(0),
            block_table.stride(0), table.stride(0), num_blocks, block_size, COPY_TABLE=src_table is not None,
            BLOCK_B=max(triton.next_power_of_2(num_blocks), 2), num_warps=1)
    return num_valid[:num_reqs]


def place_last_two_on_gpu(seq_src: torch.Tensor, *rest, **kwargs) -> torch.Tensor:
    """:func:`place_last_two_triton` for CUDA tensors where Triton is installed; :func:`place_last_two` elsewhere."""
    if seq_src.is_cuda and AVAILABLE:
        return place_last_two_triton(seq_src, *rest, **kwargs)
    return place_last_two(seq_src, *rest, **kwargs)


def takes_last_two(prefill_region: str, has_conv_state: bool) -> bool:
    """Whether a draft's prefill takes two-slot regions under `engine.draft_prefill_region` (auto: where the draft
    has no conv state); EngineConfigError for "last_two" with a draft that has conv state."""
    if prefill_region == "last_two" and has_conv_state:
        raise EngineConfigError("engine.draft_prefill_region=last_two rebuilds the draft's KV only: this draft has "
                                "short-conv layers, whose state needs the full region; use 'auto' or 'full'")
    return prefill_region != "full" and not has_conv_state


def stage_last_two(spec, batch: VerifiedBatch, desc: BatchExecutionDescriptor) -> StagedRows:
    """Fill the draft prefill's buffers with uniform verify rows' two-slot regions, padded to desc (`spec`: the
    `AutoRegressiveSpeculator`). The host loads the rows at their start positions unless the buffers still hold
    this layout and the target's were advanced on the device (a steady step): then the one device step places
    every region from the target's advanced seq_lens and block table. Returns the rows' device facts for the
    decode steps (`StagedRows`)."""
    num_reqs = batch.query_lens.numel()
    q = int(batch.query_lens[0])
    buffers = spec.prefill_buffers
    target = batch.target_buffers
    if target is not None and spec.last_two_layout == (desc.num_reqs, num_reqs, buffers.version):
        seq_src, seq_offset, src_table = target.seq_lens, -q, target.block_table
    else:
        cpu = build_step_inputs([[0, 0]] * num_reqs, batch.start_positions.tolist(), batch.block_table.tolist(),
                                spec.block_size, buffers.block_table.shape[1], desc.num_reqs, desc.num_tokens,
                                pin_memory=spec.pin_memory)
        buffers.load(cpu, desc.num_reqs, desc.num_tokens)
        spec.last_two_layout = (desc.num_reqs, num_reqs, buffers.version)
        seq_src, seq_offset, src_table = buffers.seq_lens, -2, None  # loaded: start + 2
    start, num_valid, samples = spec.last_two_rows
    spec.place_last_two(seq_src, seq_offset, num_reqs, q, batch.num_sampled, batch.sampled,
                        batch.target_input_ids, buffers.block_table, spec.block_size, buffers.positions,
                        buffers.seq_lens, buffers.slot_mapping, buffers.input_ids,
                        spec.last_token_indices[: desc.num_reqs], start, num_valid, src_table=src_table)
    return StagedRows(num_valid[:num_reqs], start[:num_reqs], samples[:num_reqs])

