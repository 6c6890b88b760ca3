"""The persistent device buffers the short-conv layers' CUDA graphs read, and the bytes that refill them.

A captured graph reads fixed addresses, so every tensor it takes lives in a buffer allocated once; each buffer
is one byte array, so a step rewrites it with a single host-to-device copy (`payload` builds those bytes).
`specexp.engine.short_conv` shows what the padding rows hold and why.
"""

from __future__ import annotations

from array import array

import numpy as np

import torch

from specexp.models.metadata import NULL_BLOCK_ID


class SpecGraphBuffers:
    """Persistent device tensors a captured full graph reads for a pure-spec batch of up to `max_rows` rows.

    All five live in one byte buffer (four int32 fields, then the bool masks), so a build rewrites them with a
    single host-to-device copy. Each build that may replay a graph rewrites every row, padding included, so
    no capture-time value survives into a replay.
    """

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.max_rows = m = max_rows
        self.num_ints = 4 * m + 2
        self.buffer = torch.zeros(4 * self.num_ints + m, dtype=torch.uint8, device=device)
        ints = self.buffer[: 4 * self.num_ints].view(torch.int32)
        self.query_start_loc = ints[: m + 1]
        self.spec_query_start_loc = ints[m + 1 : 2 * m + 2]
        self.spec_state_indices = ints[2 * m + 2 : 3 * m + 2]
        self.num_accepted_tokens = ints[3 * m + 2 :]
        self.spec_sequence_masks = self.buffer[4 * self.num_ints :].view(torch.bool)
        self.spec_state_indices.fill_(NULL_BLOCK_ID)
        self.num_accepted_tokens.fill_(1)

    def payload(self, fields: dict[str, list[int]], num_rows: int) -> bytes:
        """The whole buffer's bytes for a batch whose spec rows fill rows [0, num_rows) of each field (CPU
        lists, `query_start_loc`'s with its num_rows + 1 offsets); every later row gets the padding of the
        module doc: flat query-start tail, NULL slot, 1 accepted, mask False."""
        m, tail = self.max_rows, fields["query_start_loc"][-1]
        ints = array("i", fields["query_start_loc"])
        ints.extend([tail] * (m - num_rows))
        ints.extend(fields["spec_query_start_loc"])
        ints.extend([tail] * (m - num_rows))
        ints.extend(fields["spec_state_indices_tensor"])
        ints.extend([NULL_BLOCK_ID] * (m - num_rows))
        ints.extend(fields["num_accepted_tokens"])
        ints.extend([1] * (m - num_rows))
        return ints.tobytes() + bytes(fields["spec_sequence_masks"]) + bytes(m - num_rows)


class PromptGraphBuffers:
    """Persistent device tensors a captured prompt-prefill graph reads: one non-spec row (a lone prompt chunk,
    padded up to the graph's token count). One byte buffer, so a step rewrites it with one host-to-device copy:

        query_start_loc  int32[2]  [0, q]: the row's real tokens; the padding after them belongs to no row
                                   (zero outputs, and the state written ends at the last real input)
        state_indices    int32[1]  the row's conv slot (NULL at capture: reads slot 0, writes nothing)
        num_computed     int32[1]  tokens before this chunk
        has_initial      bool[1]   whether the row reads its stored window (chunks after the first)
    """

    def __init__(self, device: torch.device) -> None:
        self.buffer = torch.zeros(4 * 4 + 1, dtype=torch.uint8, device=device)
        ints = self.buffer[:16].view(torch.int32)
        self.query_start_loc = ints[0:2]
        self.state_indices = ints[2:3]
        self.num_computed = ints[3:4]
        self.has_initial = self.buffer[16:].view(torch.bool)

    @staticmethod
    def payload(query_len: int, state_index: int, num_computed: int) -> bytes:
        return array("i", [0, query_len, state_index, num_computed]).tobytes() + bytes([num_computed > 0])


class PromptRowsGraphBuffers:
    """Persistent device tensors the chunk segment of joined mixed-step graphs reads: up to `max_rows` prompt
    chunks laid out uniformly, row r's q_r real tokens at [r*C, r*C + q_r) of the segment's M * C (M rows of C
    tokens, `specexp.engine.inputs.stride_rows`). The short conv gathers the real tokens end to end, runs them as
    non-spec rows, and scatters the results back; the padding slots are gathered last and belong to no row (zero
    outputs, no state written). A segment of one row needs no gather: its real tokens already lead it. One byte
    buffer, one host-to-device copy a step:

        token_indx       int64[M * C]  the real tokens' flat indices, row by row, then the padding slots'
        query_start_loc  int32[M + 1]  offsets of the rows in the gathered order (padding rows: q = 0)
        state_indices    int32[M]      each row's conv slot (NULL for padding and at capture)
        num_computed     int32[M]      tokens before each chunk
        has_initial      bool[M]       whether the row reads its stored window (chunks after a prompt's first)

    A graph of M rows of C tokens reads the first M (M + 1, M * C) entries of each field."""

    def __init__(self, max_rows: int, max_tokens: int, device: torch.device) -> None:
        self.max_rows, self.max_tokens = max_rows, max_tokens
        self.num_ints = 3 * max_rows + 1
        self.buffer = torch.zeros(8 * max_tokens + 4 * self.num_ints + max_rows, dtype=torch.uint8, device=device)
        self.token_indx = self.buffer[: 8 * max_tokens].view(torch.int64)
        ints = self.buffer[8 * max_tokens : 8 * max_tokens + 4 * self.num_ints].view(torch.int32)
        self.query_start_loc = ints[: max_rows + 1]
        self.state_indices = ints[max_rows + 1 : 2 * max_rows + 1]
        self.num_computed = ints[2 * max_rows + 1 :]
        self.has_initial = self.buffer[8 * max_tokens + 4 * self.num_ints :].view(torch.bool)

    def payload(self, query_lens: list[int], state_indices: list[int], num_computed: list[int], row_tokens: int
                ) -> bytes:
        """The whole buffer's bytes for chunks of `query_lens` tokens (each <= row_tokens) in rows of row_tokens
        slots; every entry past the chunks' rows is padding."""
        num_rows = len(query_lens)
        lens = np.asarray(query_lens, dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lens)))
        real = np.arange(offsets[-1]) + np.repeat(np.arange(num_rows) * row_tokens - offsets[:-1], lens)
        is_real = np.zeros(self.max_tokens, dtype=bool)
        is_real[real] = True
        order = np.concatenate((real, np.flatnonzero(~is_real)))
        pad = self.max_rows - num_rows
        ints = array("i", offsets.tolist() + [int(offsets[-1])] * pad)
        ints.extend(state_indices + [NULL_BLOCK_ID] * pad)
        ints.extend(num_computed + [0] * pad)
        return order.tobytes() + ints.tobytes() + bytes(c > 0 for c in num_computed) + bytes(pad)


def pad_to(values: torch.Tensor, length: int, fill: int | bool) -> torch.Tensor:
    """`values` extended to `length` entries with `fill`."""
    out = torch.full((length,), fill, dtype=values.dtype)
    out[: values.numel()] = values
    return out
