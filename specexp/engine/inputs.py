"""Flattened step inputs: CPU construction from scheduled rows, and the persistent device buffers that
attention metadata (and, later, CUDA graphs) read.

Layout of one step with rows r0 (verify, q=3), r1 (decode, q=1), r2 (prefill chunk, q=4):

    token:     0  1  2 | 3 | 4  5  6  7          padded tokens (graphs): slot -1, row 0
    row:       r0 r0 r0| r1| r2 r2 r2 r2
    query_start_loc = [0, 3, 4, 8]  (+ flat tail for padded rows);  seq_lens[r] = start_position + q
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specexp.models.metadata import AttentionMetadata


@dataclass
class StepInputsCPU:
    """CPU tensors of one flattened batch of R rows and T tokens.

    input_ids, positions: int64[T]; query_start_loc: int32[R+1]; seq_lens: int32[R];
    block_table: int32[R, B]; slot_mapping: int64[T]; token_req_indices: int64[T].
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    token_req_indices: torch.Tensor
    # The step as `InputBuffers.load` copies it, padded to the (rows, tokens) it was built for (None: load
    # copies the fields one by one and pads on the device).
    padded: PaddedStep | None = None
    # The longest row's query length, when the builder knew it (None: derived from query_start_loc).
    known_max_query_len: int | None = None

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.numel()

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def max_query_len(self) -> int:
        if self.known_max_query_len is not None:
            return self.known_max_query_len
        lens = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return int(lens.max()) if lens.numel() else 0


@dataclass
class PaddedStep:
    """A step padded to R_pad rows and T_pad tokens: tokens int64[4, T_pad] (input ids, positions, slots,
    token rows; padding 0, 0, -1, 0), query_start_loc int32[R_pad + 1] (flat tail), seq_lens int32[R_pad]
    (padding 0), block_table int32[R_pad, B] (padding NULL)."""

    tokens: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.numel()

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


def host_tensor(values: list[int], dtype: np.dtype, pin_memory: bool = False) -> torch.Tensor:
    """A CPU tensor of `values` (a flat list of ints), page-locked when `pin_memory`. Converted through numpy:
    `torch.tensor(list)` costs about three times as much host time per element."""
    tensor = torch.from_numpy(np.array(values, dtype=dtype))
    return tensor.pin_memory() if pin_memory else tensor


def build_step_inputs(
    token_ids: list[list[int]], start_positions: list[int], block_ids: list[list[int]], block_size: int,
    max_blocks_per_req: int, num_reqs_padded: int | None = None, num_tokens_padded: int | None = None,
    *, pin_memory: bool = False,
) -> StepInputsCPU:
    """Flatten rows: row r runs tokens `token_ids[r]` at positions `start_positions[r] + i`; padded to
    num_reqs_padded rows / num_tokens_padded tokens (None: no padding) for a graph's persistent buffers.

    The rows are laid end to end as Python lists (one extend per field and row, no per-token Python work), then
    converted once per dtype through numpy, where the slot of every token (`block_table[row, pos //
    block_size] * block_size + pos % block_size`) is one gather: the per-token loop and `torch.tensor` over
    lists were most of the host's step time at large batches. The fields are slices of two tensors, one per
    dtype.

    pin_memory: build the tensors in page-locked memory (CUDA engines): a copy to the GPU from pageable memory
    may first wait for the stream to drain, which would hold the host while the device still runs earlier work.
    """
    ids: list[int] = []
    positions: list[int] = []
    token_req: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    table: list[int] = []
    null_row = [0] * max_blocks_per_req  # NULL block past a row's own
    for r, (row_tokens, start, blocks) in enumerate(zip(token_ids, start_positions, block_ids, strict=True)):
        num = len(row_tokens)
        ids += row_tokens
        positions += range(start, start + num)
        token_req += [r] * num
        query_start_loc.append(query_start_loc[-1] + num)
        seq_lens.append(start + num)
        table += blocks[:max_blocks_per_req]
        table += null_row[: max_blocks_per_req - min(len(blocks), max_blocks_per_req)]
    num_tokens, num_reqs = len(ids), len(seq_lens)
    pad_tokens = max((num_tokens_padded or num_tokens) - num_tokens, 0)
    pad_reqs = max((num_reqs_padded or num_reqs) - num_reqs, 0)
    t_pad, r_pad = num_tokens + pad_tokens, num_reqs + pad_reqs
    rows_np = np.zeros(2 * r_pad + 1 + r_pad * max_blocks_per_req, dtype=np.int32)
    rows_np[: num_reqs + 1] = query_start_loc
    rows_np[num_reqs + 1 : r_pad + 1] = num_tokens
    rows_np[r_pad + 1 : r_pad + 1 + num_reqs] = seq_lens
    table_np = rows_np[2 * r_pad + 1 :].reshape(r_pad, max_blocks_per_req)
    table_np[:num_reqs].flat = table
    tokens_np = np.zeros((4, t_pad), dtype=np.int64)
    tokens_np[0, :num_tokens] = ids
    tokens_np[1, :num_tokens] = positions
    tokens_np[3, :num_tokens] = token_req
    pos, req = tokens_np[1, :num_tokens], tokens_np[3, :num_tokens]
    tokens_np[2, :num_tokens] = table_np[req, pos // block_size].astype(np.int64) * block_size + pos % block_size
    tokens_np[2, num_tokens:] = -1
    return _step_from_arrays(tokens_np, rows_np, num_reqs, num_tokens, r_pad, max_blocks_per_req,
                             max((len(t) for t in token_ids), default=0), pin_memory)


def _step_from_arrays(tokens_np: np.ndarray, rows_np: np.ndarray, num_reqs: int, num_tokens: int,
                      num_reqs_padded: int, max_blocks: int, max_query_len: int, pin_memory: bool) -> StepInputsCPU:
    """The StepInputsCPU over a padded step's two arrays, laid out as PaddedStep's: tokens_np int64[4, T_pad];
    rows_np int32[query_start_loc R_pad + 1 | seq_lens R_pad | block_table R_pad * max_blocks]. Its fields view the
    first num_reqs rows / num_tokens tokens; `padded` holds all of them."""
    r_pad = num_reqs_padded
    tokens, rows = torch.from_numpy(tokens_np), torch.from_numpy(rows_np)
    if pin_memory:
        tokens, rows = tokens.pin_memory(), rows.pin_memory()
    # slices, not rows.split: a step stages two of these, and the split's Python wrapper costs more than three slices
    qsl_pad, seq_pad = rows[: r_pad + 1], rows[r_pad + 1 : 2 * r_pad + 1]
    table_pad = rows[2 * r_pad + 1 :].view(r_pad, max_blocks)
    input_ids, positions, slot_mapping, token_req_indices = tokens[:, :num_tokens].unbind(0)
    return StepInputsCPU(input_ids, positions, qsl_pad[: num_reqs + 1], seq_pad[:num_reqs], table_pad[:num_reqs],
                         slot_mapping, token_req_indices, PaddedStep(tokens, qsl_pad, seq_pad, table_pad),
                         max_query_len)


def stride_rows(cpu: StepInputsCPU, row_stride: int, num_reqs_padded: int, *, pin_memory: bool = False
                ) -> StepInputsCPU:
    """The rows of an unpadded step laid out uniformly, for a graph that holds `num_reqs_padded` rows of
    `row_stride` tokens each (joined mixed steps' prompt chunks, `specexp.engine.mixed_graphs`): row r's q_r tokens
    at [r*s, r*s + q_r), the rest of its s slots padding (id 0, position 0, slot -1, row r), and rows past R whole
    padded rows (seq_len 0, NULL blocks). query_start_loc int32[R + 1] = [0, s, 2s, ...]: an attention op reads the
    batch as uniform, each real token attending by its position. The token fields span the real rows' R * s slots;
    `padded` holds all num_reqs_padded * s. Raises ValueError when a row holds more than s tokens."""
    num_reqs = cpu.num_reqs
    qsl = cpu.query_start_loc.numpy().astype(np.int64)
    lens = np.diff(qsl)
    if num_reqs > num_reqs_padded or (lens > row_stride).any():
        raise ValueError(f"{num_reqs} rows of up to {int(lens.max(initial=0))} tokens do not fit "
                         f"{num_reqs_padded} rows of {row_stride}")
    t_pad = num_reqs_padded * row_stride
    dest = np.arange(cpu.num_tokens) + np.repeat(np.arange(num_reqs) * row_stride - qsl[:-1], lens)
    tokens_np = np.zeros((4, t_pad), dtype=np.int64)
    tokens_np[2] = -1
    tokens_np[3] = np.arange(t_pad) // row_stride
    src = cpu.padded.tokens if cpu.padded is not None else torch.stack(
        (cpu.input_ids, cpu.positions, cpu.slot_mapping, cpu.token_req_indices))
    tokens_np[:, dest] = src[:, : cpu.num_tokens].numpy()
    tokens_np[3, dest] = np.repeat(np.arange(num_reqs), lens)
    max_blocks = cpu.block_table.shape[1]
    rows_np = np.zeros(2 * num_reqs_padded + 1 + num_reqs_padded * max_blocks, dtype=np.int32)
    rows_np[: num_reqs_padded + 1] = np.arange(num_reqs_padded + 1) * row_stride
    rows_np[num_reqs_padded + 1 : num_reqs_padded + 1 + num_reqs] = cpu.seq_lens.numpy()
    table_np = rows_np[2 * num_reqs_padded + 1 :].reshape(num_reqs_padded, max_blocks)
    table_np[:num_reqs] = cpu.block_table.numpy()
    return _step_from_arrays(tokens_np, rows_np, num_reqs, num_reqs * row_stride, num_reqs_padded, max_blocks,
                             row_stride, pin_memory)


class InputBuffers:
    """Device tensors of a step, allocated once at their maximum sizes and refreshed in place.

    A step (or a graph replay) reads the first `num_tokens_padded` / `num_reqs_padded` entries; entries
    past the real ones are padding: slot -1 (its K/V land in the NULL block's scratch slot, which no row
    reads), row 0, seq_len 0, flat query_start_loc tail.
    """

    def __init__(self, max_num_reqs: int, max_num_tokens: int, max_blocks_per_req: int, device: torch.device):
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        # The per-token fields are the rows of one tensor, laid out as PaddedStep.tokens: one copy loads them.
        self.tokens = torch.zeros(4, max_num_tokens, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slot_mapping, self.token_req_indices = self.tokens.unbind(0)
        self.slot_mapping.fill_(-1)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.int32, device=device)
        # Counts the loads: a step advanced on the device from the last one checks nothing loaded in between.
        self.version = 0

    def nbytes(self) -> int:
        """Device bytes held (each storage once: the token fields are views of `tokens`)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in vars(self).values() if isinstance(t, torch.Tensor)}
        return sum(storages.values())

    def load(self, cpu: StepInputsCPU, num_reqs_padded: int | None = None,
             num_tokens_padded: int | None = None) -> None:
        """Copy a step's CPU inputs in, padding rows/tokens up to the given counts."""
        self.version += 1
        num_reqs, num_tokens = cpu.num_reqs, cpu.num_tokens
        num_reqs_padded = num_reqs_padded or num_reqs
        num_tokens_padded = num_tokens_padded or num_tokens
        if num_reqs_padded > self.max_num_reqs or num_tokens_padded > self.max_num_tokens:
            raise ValueError(
                f"step of {num_reqs_padded} rows / {num_tokens_padded} tokens exceeds the buffers "
                f"({self.max_num_reqs} rows / {self.max_num_tokens} tokens)"
            )
        padded = cpu.padded
        if padded is not None and (padded.num_reqs, padded.num_tokens) == (num_reqs_padded, num_tokens_padded):
            # four copies, padding included, instead of seven copies and seven fills
            self.tokens[:, :num_tokens_padded].copy_(padded.tokens, non_blocking=True)
            self.query_start_loc[: num_reqs_padded + 1].copy_(padded.query_start_loc, non_blocking=True)
            self.seq_lens[:num_reqs_padded].copy_(padded.seq_lens, non_blocking=True)
            self.block_table[:num_reqs_padded].copy_(padded.block_table, non_blocking=True)
            return
        self.input_ids[:num_tokens].copy_(cpu.input_ids, non_blocking=True)
        self.positions[:num_tokens].copy_(cpu.positions, non_blocking=True)
        self.slot_mapping[:num_tokens].copy_(cpu.slot_mapping, non_blocking=True)
        self.token_req_indices[:num_tokens].copy_(cpu.token_req_indices, non_blocking=True)
        self.input_ids[num_tokens:num_tokens_padded].zero_()
        self.positions[num_tokens:num_tokens_padded].zero_()
        self.slot_mapping[num_tokens:num_tokens_padded].fill_(-1)
        self.token_req_indices[num_tokens:num_tokens_padded].zero_()
        self.query_start_loc[: num_reqs + 1].copy_(cpu.query_start_loc, non_blocking=True)
        self.query_start_loc[num_reqs + 1 : num_reqs_padded + 1].fill_(int(cpu.query_start_loc[-1]))
        self.seq_lens[:num_reqs].copy_(cpu.seq_lens, non_blocking=True)
        self.seq_lens[num_reqs:num_reqs_padded].zero_()
        self.block_table[:num_reqs].copy_(cpu.block_table, non_blocking=True)
        self.block_table[num_reqs:num_reqs_padded].zero_()

    def attention_metadata(self, num_reqs: int, num_tokens: int, max_seq_len: int, max_query_len: int,
                           num_actual_tokens: int) -> AttentionMetadata:
        """Views of the first num_reqs rows / num_tokens tokens (padded counts for graph replay)."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            block_table=self.block_table[:num_reqs],
            slot_mapping=self.slot_mapping[:num_tokens],
            token_req_indices=self.token_req_indices[:num_tokens],
            max_seq_len=max_seq_len,
            max_query_len=max_query_len,
            num_actual_tokens=num_actual_tokens,
        )

    def load_inert_prompt_rows(self, num_rows: int, row_tokens: int, max_seq_len: int) -> AttentionMetadata:
        """Load `num_rows` inert prompt rows of `row_tokens` tokens each (slots -1), for capturing a joined
        mixed-step graph's chunk segment, and return their uniform attention metadata: at replay each row holds a
        chunk laid out by `stride_rows` (real tokens first, attending by their positions), or is padding."""
        self.load(uniform_dummy_inputs(num_rows, row_tokens, self.block_table.shape[1]))
        num_tokens = num_rows * row_tokens
        return self.attention_metadata(num_rows, num_tokens, max_seq_len, row_tokens, num_tokens)

    def load_inert_prompt(self, num_tokens: int, max_seq_len: int) -> AttentionMetadata:
        """Load an inert one-row prompt of `num_tokens` tokens (slots -1, for capturing a prompt-prefill graph)
        and return its attention metadata, which counts every token as the row's (max_query_len =
        num_actual_tokens = num_tokens): the layout is then the uniform one whatever prompt fills the buffers at
        replay. Real tokens attend causally by their positions; the padding after them (position 0, slot -1)
        writes no request's KV and is never read."""
        self.load(uniform_dummy_inputs(1, num_tokens, self.block_table.shape[1]))
        return self.attention_metadata(1, num_tokens, max_seq_len, num_tokens, num_tokens)


def uniform_dummy_inputs(num_reqs: int, tokens_per_req: int, max_blocks_per_req: int) -> StepInputsCPU:
    """An inert uniform batch for graph capture: rows of `tokens_per_req` tokens at positions 0.., every
    slot -1 (no request's KV touched) and every block id NULL."""
    num_tokens = num_reqs * tokens_per_req
    token_req = torch.arange(num_reqs).repeat_interleave(tokens_per_req)
    return StepInputsCPU(
        input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        positions=torch.arange(tokens_per_req).repeat(num_reqs),
        query_start_loc=torch.arange(0, num_tokens + 1, tokens_per_req, dtype=torch.int32),
        seq_lens=torch.full((num_reqs,), tokens_per_req, dtype=torch.int32),
        block_table=torch.zeros(num_reqs, max_blocks_per_req, dtype=torch.int32),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64),
        token_req_indices=token_req,
    )
