"""Per-step metadata the native models read: the contract between the engine's builders and the model layers.

One engine step runs a *flattened* varlen batch: the tokens of all request rows laid end to end,
`input_ids[T]`, `positions[T]`. Padded rows (added so a CUDA graph of a captured size can replay) carry
no tokens, a zero seq_len and the NULL slot, so they never change a real row's result.

Attention layers read `AttentionMetadata`; short-conv layers read `ShortConvMetadata` (vLLM's field
names, built by `specexp.engine.short_conv`). The caches themselves are passed beside them in
`ForwardContext`, owned and allocated by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Conv-state slot 0 and KV block 0 belong to no request: padded rows point at them.
NULL_BLOCK_ID = 0


@dataclass
class AttentionMetadata:
    """What every attention layer of one step reads.

    query_start_loc: int32[R + 1]  token offsets of each row's queries in the flat batch (padded rows repeat
                                    the last value, so they own zero tokens).
    seq_lens:        int32[R]      tokens of the row visible after this step's writes (context + queries);
                                    0 for a padded row.
    block_table:     int32[R, B]   KV block ids of each row, B >= ceil(max_seq_len / block_size).
    slot_mapping:    int64[T]      flat KV slot each token writes (`block * block_size + offset`); -1: a
                                    padded token, written to the NULL block's scratch slot, which no row reads.
    token_req_indices: int64[T]    row of each token; padded tokens point at row 0 (their slot is -1 and their
                                    outputs are ignored).
    max_seq_len:     int (CPU)     upper bound of seq_lens; the attention op reads that many key positions
                                    per row. A captured graph fixes it (max_model_len at capture).
    max_query_len:   int (CPU)     upper bound of any row's query length (k + 1 for a uniform verify batch).
    num_actual_tokens: int (CPU)   real (unpadded) tokens in the batch.

    A query token at position p of row r sees the keys of row r at positions `<= p` and `< seq_lens[r]`.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    token_req_indices: torch.Tensor
    max_seq_len: int
    max_query_len: int
    num_actual_tokens: int


@dataclass
class ShortConvMetadata:
    """What every short-conv layer of one step reads (field names follow vLLM's short-conv backends).

    Rows are classified by mask: *spec* rows (verifying drafts: `num_decode_draft_tokens >= 0`), plain
    *decode* rows (1 token) and *prefill* rows (> 1 token). Non-spec rows are grouped `[decode | prefill]`.

    Counts (CPU ints): num_prefills, num_prefill_tokens, num_decodes, num_decode_tokens, num_spec_decodes,
    num_spec_decode_tokens, num_actual_tokens, spec_query_len (the longest spec row's query, at most k + 1;
    every spec row's in a uniform batch), max_prefill_query_len.

    Non-spec rows (decode then prefill):
      state_indices_tensor:     int32[n_ns]        conv-state slot of each non-spec row.
      non_spec_query_start_loc: int32[n_ns + 1]    offsets into the gathered non-spec tokens.
      has_initial_states_d/_p:  bool[n_d] / bool[n_p]  row already has conv state (else starts from zeros).
      state_indices_tensor_d/_p, query_start_loc_d/_p, num_computed_tokens_p: the decode / prefill parts.
      non_spec_token_indx:      int64[n_ns_tokens] flat token index of each gathered non-spec token, or None
                                when the batch has no spec rows (then the non-spec tokens are the batch).
    Spec rows:
      spec_state_indices_tensor: int32[n_s]       conv-state slot of each spec row (NULL for padded rows).
      spec_query_start_loc:      int32[n_s + 1]   offsets into the gathered spec tokens (flat tail for padding).
      num_accepted_tokens:       int32[n_s]       tokens accepted by the row's last verify, bonus included
                                                   (>= 1; 1 after a prefill and on padded rows). The conv
                                                   window read this step starts at column num_accepted - 1.
      spec_sequence_masks:       bool[R]          which batch rows are spec rows.
      spec_token_indx:           int64[n_s_tokens] flat token index of each spec token, or None when every
                                                   row is a spec row (then the spec tokens are the batch).
    query_start_loc: int32[R + 1] of the whole batch, in batch order.
    non_spec_state_lookahead: int (CPU) trailing inputs of each non-spec row kept *after* the stored window
                              (0 for a target). A draft prefill region ends with one token it has not
                              committed yet (the target's newly sampled token): with lookahead 1 the window
                              at column 0 ends at the last committed input and column W-1 holds that token,
                              so the next step reads offset 0 and the draft's decode steps offset 1.
    """

    num_prefills: int
    num_prefill_tokens: int
    num_decodes: int
    num_decode_tokens: int
    num_spec_decodes: int
    num_spec_decode_tokens: int
    num_actual_tokens: int
    spec_query_len: int
    max_prefill_query_len: int
    query_start_loc: torch.Tensor
    state_indices_tensor: torch.Tensor | None = None
    has_initial_states_p: torch.Tensor | None = None
    has_initial_states_d: torch.Tensor | None = None
    non_spec_query_start_loc: torch.Tensor | None = None
    spec_query_start_loc: torch.Tensor | None = None
    spec_state_indices_tensor: torch.Tensor | None = None
    spec_sequence_masks: torch.Tensor | None = None
    spec_token_indx: torch.Tensor | None = None
    non_spec_token_indx: torch.Tensor | None = None
    num_accepted_tokens: torch.Tensor | None = None
    query_start_loc_p: torch.Tensor | None = None
    query_start_loc_d: torch.Tensor | None = None
    state_indices_tensor_p: torch.Tensor | None = None
    state_indices_tensor_d: torch.Tensor | None = None
    num_computed_tokens_p: torch.Tensor | None = None
    non_spec_state_lookahead: int = 0

    @property
    def num_non_spec_rows(self) -> int:
        return self.num_decodes + self.num_prefills

    def has_initial_states_non_spec(self) -> torch.Tensor | None:
        """bool[n_ns]: `has_initial_states_d ++ has_initial_states_p` in non-spec row order."""
        parts = [t for t in (self.has_initial_states_d, self.has_initial_states_p) if t is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass(frozen=True)
class Segment:
    """Tokens [start, start + num_tokens) of a forward's flat batch and what their token-mixing layers read
    (attn: None for a model without attention layers; conv: None without short-conv layers)."""

    start: int
    num_tokens: int
    attn: AttentionMetadata | None
    conv: ShortConvMetadata | None

    @property
    def stop(self) -> int:
        return self.start + self.num_tokens


class SegmentedPlan:
    """Per segment, (start, stop, the per-forward plan of its metadata: an `AttentionPlan` or a `ConvPlan`):
    what attention and conv layers read in place of one plan (`specexp.models.segments`). Built once per
    forward."""

    def __init__(self, parts: list[tuple[int, int, object]]) -> None:
        self.parts = parts


@dataclass
class ForwardContext:
    """Everything a model forward needs besides token ids and positions.

    kv_caches:   one tensor per attention layer (in layer order), shape
                 `[2, num_blocks, block_size, num_kv_heads, head_dim]` (index 0 = keys, 1 = values).
    conv_states: one tensor per short-conv layer (in layer order), shape `[num_slots, dim, state_len]`,
                 `state_len = (L_cache - 1) + num_spec_tokens`; slot 0 is the NULL slot.
    segments:    None, or the parts of a segmented forward (`specexp.models.segments`): then attn and conv are
                 None and each token-mixing layer runs once per segment with that segment's metadata.
    """

    attn: AttentionMetadata | None
    conv: ShortConvMetadata | None
    kv_caches: list[torch.Tensor] = field(default_factory=list)
    conv_states: list[torch.Tensor] = field(default_factory=list)
    segments: list[Segment] | None = None
