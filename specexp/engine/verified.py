"""What the target's step hands the draft speculator: the verified rows (`VerifiedBatch`), and the per-row device
facts the draft's prefill stages for its decode steps (`StagedRows`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexp.engine.inputs import InputBuffers


@dataclass(frozen=True)
class StagedRows:
    """Device facts per row of one propose call, staged with the draft prefill's inputs: num_valid int64[R]
    (region slots holding committed inputs), start int64[R] (each row's start position), samples int64[R]
    (nonzero: the row sampled a token this step)."""

    num_valid: torch.Tensor
    start: torch.Tensor
    samples: torch.Tensor


@dataclass
class VerifiedBatch:
    """What the target step hands the speculator (R rows of the step just verified).

    query_lens, start_positions: int64[R] (CPU); is_spec: bool[R] (CPU; decode/verify rows);
    samples: bool[R] (CPU; rows that emitted tokens); conv_slots, num_accepted_prev: int32[R] (CPU);
    block_table: int32[R, B] (CPU). target_input_ids: int64[T] (device); sampled: int64[R, k+1] and
    num_sampled: int64[R] (device, from the rejection sampler). target_buffers: the target's input buffers when the
    step was advanced on the device (`verify_advance`; the draft's prefill follows from them), else None.
    """

    query_lens: torch.Tensor
    start_positions: torch.Tensor
    is_spec: torch.Tensor
    samples: torch.Tensor
    conv_slots: torch.Tensor
    num_accepted_prev: torch.Tensor
    block_table: torch.Tensor
    target_input_ids: torch.Tensor
    sampled: torch.Tensor
    num_sampled: torch.Tensor
    # The target's input buffers when the step was advanced on the device (a steady step), else None.
    target_buffers: InputBuffers | None = None


def is_uniform_verify(batch: VerifiedBatch) -> bool:
    """Whether every row of `batch` is a verify row (decode row) of one query length (one v): a uniform batch."""
    lens = batch.query_lens
    return lens.numel() > 0 and bool(batch.is_spec.all()) and bool((lens == lens[0]).all())
