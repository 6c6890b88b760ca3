"""The persistent device buffers the short-conv layers' CUDA graphs read, and the bytes that refill them.

A captured graph reads fixed addresses, so every tensor it takes lives in a buffer allocated once; each buffer
is one byte array, so a step rewrites it with a single host-to-device copy (`payload` builds those bytes).
`specexp.engine.short_conv` shows what the padding rows hold and why.
"""

from __future__ import annotations

from array import array

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


def pad_to(values: torch.Tensor, length: int, fill: int | bool) -> torch.Tensor:
    """`values` extended to `length` entries with `fill`."""
    out = torch.full((length,), fill, dtype=values.dtype)
    out[: values.numel()] = values
    return out
