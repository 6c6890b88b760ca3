"""How the draft's fused multi-step decode moves its rows one position further before each step after the first
(`engine.draft_step_kernel`): `advance(draft_tokens, step, input_ids, positions, seq_lens, block_table, writes,
slot_mapping, block_size)`, in place, in torch or in one Triton kernel (`specexp.engine.triton_draft_step`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specexp.engine import triton_draft_step


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


DRAFT_STEP_KERNELS: dict[str, Callable[..., None]] = {"torch": advance_draft_rows,
                                                      "triton": advance_draft_rows_on_gpu}
