"""How a step's rows are grouped for the short-conv layers, and which batches the conv ops can take.

Rows are classified by mask, never by position (spec: num_decode_draft_tokens >= 0; decode: -1 and one
token; prefill: -1 and more; empty: -1 and none), and a stable sort of the per-token group key orders the
tokens [spec | decode | prefill] with each row's tokens contiguous and in order. `specexp.engine.short_conv`
shows the layout on an example and builds the metadata from these pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specexp.models.metadata import NULL_BLOCK_ID

# Per-row group keys; the token sort orders by them, so spec tokens come first.
SPEC, DECODE, PREFILL, EMPTY = 0, 1, 2, 3


@dataclass(frozen=True)
class RowGroups:
    """CPU classification of one batch's rows.

    query_lens: int64[R]   tokens of each row (batch order).
    group:      int64[R]   SPEC / DECODE / PREFILL / EMPTY of each row.
    spec_rows, decode_rows, prefill_rows: int64[n_s] / [n_d] / [n_p]  batch rows of each group, ascending.
    """

    query_lens: torch.Tensor
    group: torch.Tensor
    spec_rows: torch.Tensor
    decode_rows: torch.Tensor
    prefill_rows: torch.Tensor

    @property
    def non_spec_rows(self) -> torch.Tensor:
        """int64[n_d + n_p]: decode rows, then prefill rows."""
        return torch.cat([self.decode_rows, self.prefill_rows])


def classify_rows(query_lens: torch.Tensor, num_decode_draft_tokens: torch.Tensor) -> RowGroups:
    """Group rows by mask: spec (drafts >= 0), decode (1 token), prefill (> 1 token), empty (0 tokens)."""
    query_lens = query_lens.to(torch.int64)
    spec = num_decode_draft_tokens >= 0
    group = torch.full_like(query_lens, EMPTY)
    group[~spec & (query_lens == 1)] = DECODE
    group[~spec & (query_lens > 1)] = PREFILL
    group[spec] = SPEC

    def rows_of(key: int) -> torch.Tensor:
        return (group == key).nonzero().flatten()  # ascending: batch order within the group

    return RowGroups(query_lens, group, rows_of(SPEC), rows_of(DECODE), rows_of(PREFILL))


def grouped_token_order(groups: RowGroups, num_tokens: int) -> torch.Tensor | None:
    """int64[num_tokens]: flat token indices in [spec | decode | prefill] order, each row's tokens
    contiguous and in order; None when that is already the batch order."""
    token_group = torch.repeat_interleave(groups.group, groups.query_lens, output_size=num_tokens)
    if bool((token_group[1:] >= token_group[:-1]).all()):
        return None
    return torch.argsort(token_group, stable=True)


def start_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """int32[n + 1]: [0, l0, l0 + l1, ...] (query-start locations of rows of these lengths)."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int32)
    torch.cumsum(lengths.to(torch.int32), dim=0, out=out[1:])
    return out


def check_batch(
    query_start_loc_cpu: torch.Tensor,
    num_decode_draft_tokens_cpu: torch.Tensor,
    num_computed_tokens_cpu: torch.Tensor,
    num_accepted_tokens_cpu: torch.Tensor,
    state_indices_cpu: torch.Tensor,
    num_reqs_padded: int | None,
    num_tokens_padded: int | None,
    spec_query_len: int,
) -> None:
    """Reject batches the conv ops would silently get wrong (`ShortConvMetadataBuilder.build`'s arguments;
    spec_query_len: k+1). Works on CPU lists: R is small, and this runs every step."""
    qsl = query_start_loc_cpu.tolist()
    num_reqs = len(qsl) - 1
    for name, t in (("num_decode_draft_tokens_cpu", num_decode_draft_tokens_cpu),
                    ("num_computed_tokens_cpu", num_computed_tokens_cpu),
                    ("num_accepted_tokens_cpu", num_accepted_tokens_cpu),
                    ("state_indices_cpu", state_indices_cpu)):
        if t.shape != (num_reqs,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}; query_start_loc_cpu has {num_reqs} rows")
    query_lens = [qsl[i + 1] - qsl[i] for i in range(num_reqs)]
    if qsl[0] != 0 or any(q < 0 for q in query_lens):
        raise ValueError(f"query_start_loc_cpu must start at 0 and never decrease, got {qsl}")
    k1 = spec_query_len
    drafts, computed = num_decode_draft_tokens_cpu.tolist(), num_computed_tokens_cpu.tolist()
    accepted, slots = num_accepted_tokens_cpu.tolist(), state_indices_cpu.tolist()
    spec_rows = [r for r in range(num_reqs) if drafts[r] >= 0]
    for r in spec_rows:
        if not 1 <= query_lens[r] <= k1:
            raise ValueError(f"spec row {r} verifies {query_lens[r]} tokens; a spec row verifies "
                             f"1..k+1 = 1..{k1} (its conv state keeps W-1+k columns)")
    for r in spec_rows:
        if not 1 <= accepted[r] <= k1:
            raise ValueError(f"spec row {r} has num_accepted_tokens {accepted[r]}; it must be "
                             f"1..k+1 = 1..{k1} (bonus included, 1 after a prefill)")
    for r in spec_rows:
        if computed[r] <= 0:
            raise ValueError(f"spec row {r} has no conv state yet (num_computed_tokens 0): a request starts "
                             "with a prefill, a non-spec row (drafts -1)")
    live_slots = [slots[r] for r in range(num_reqs) if drafts[r] >= 0 or query_lens[r] > 0]
    if any(slot <= NULL_BLOCK_ID for slot in live_slots) or len(set(live_slots)) != len(live_slots):
        raise ValueError(f"rows with tokens need distinct conv slots > NULL_BLOCK_ID ({NULL_BLOCK_ID}), "
                         f"got {live_slots}")
    if num_reqs_padded is not None and num_reqs_padded < num_reqs:
        raise ValueError(f"num_reqs_padded ({num_reqs_padded}) < num_reqs ({num_reqs})")
    if num_tokens_padded is not None and num_tokens_padded < qsl[-1]:
        raise ValueError(f"num_tokens_padded ({num_tokens_padded}) < num_tokens ({qsl[-1]})")
