"""Segmented forwards: one model forward over a flat batch made of parts that each carry their own metadata.

A batch that mixes verify rows with a prompt chunk has no one layout a single set of metadata describes as
cheaply as each part's own does: the verify rows are a uniform batch of v + 1 tokens a row, the chunk one row
of C tokens, and each already has graph-capturable metadata of its own. Only the token-mixing layers
(attention, short conv) need a row's metadata; every other layer works token by token. So a segmented forward
runs the per-token layers (projections, norms, MLPs, the LM head) once over all tokens, reading each weight
once, and each token-mixing layer once per segment, on that segment's slice of tokens and metadata:

    tokens:    [ segment 0: rows 0 .. R-1, uniform v+1 a row | segment 1: one chunk row of C tokens ]
    attention:   attend(q[0:T0], meta_0)                       attend(q[T0:T0+C], meta_1)   -> cat
    conv:        short_conv(x[0:T0], conv_0)                   short_conv(x[T0:T0+C], conv_1) -> cat

Each segment's metadata describes its slice as if it were the whole batch: token indices (slot_mapping,
token_req_indices, query_start_loc) count from the segment's first token, while KV slots, block tables and
conv-state slots are the requests' own. No layer mixes tokens of different rows, so the result equals the
segments run as separate forwards.
"""

from __future__ import annotations

import torch

from specexp.models.attention import AttentionPlan
from specexp.models.metadata import ForwardContext, Segment, SegmentedPlan
from specexp.models.short_conv_ops import ConvPlan


def check_segments(segments: list[Segment], num_tokens: int) -> None:
    """Raise ValueError unless the segments tile tokens [0, num_tokens) in order, each non-empty."""
    end = 0
    for seg in segments:
        if seg.start != end or seg.num_tokens <= 0:
            raise ValueError(f"segments must tile the batch in order: a segment at {seg.start} of "
                             f"{seg.num_tokens} tokens follows token {end}")
        end = seg.stop
    if end != num_tokens:
        raise ValueError(f"segments cover {end} tokens of a batch of {num_tokens}")


def forward_plans(ctx: ForwardContext, positions: torch.Tensor) -> tuple:
    """(attention plan, conv plan) of one forward: plain plans of `ctx.attn` / `ctx.conv`, or, when
    `ctx.segments` is set, `SegmentedPlan`s over them. A plan is None where the model has no layer of its kind
    (no KV caches / conv states in ctx). positions: int64[T] of the whole batch."""
    has_attn, has_conv = bool(ctx.kv_caches), bool(ctx.conv_states)
    if ctx.segments is None:
        return (AttentionPlan(ctx.attn, positions) if has_attn else None,
                ConvPlan(ctx.conv) if has_conv else None)
    check_segments(ctx.segments, positions.shape[0])
    attn = SegmentedPlan([(s.start, s.stop, AttentionPlan(s.attn, positions[s.start : s.stop]))
                          for s in ctx.segments]) if has_attn else None
    conv = SegmentedPlan([(s.start, s.stop, ConvPlan(s.conv)) for s in ctx.segments]) if has_conv else None
    return attn, conv
