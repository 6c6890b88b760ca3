"""Specification of the reference short-conv ops (`specexp.models.short_conv_ops`).

Every check compares against a full-sequence causal conv over the *committed* stream of each request
(`conv_reference`), which is what feeding the accepted tokens one at a time would give.
"""

from __future__ import annotations

import math

import pytest
import torch
from conv_reference import causal_conv, conv_of_appended, last_window
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.models.metadata import NULL_BLOCK_ID, ShortConvMetadata
from specexp.models.short_conv_ops import (
    ConvPlan,
    causal_conv1d_spec_update,
    causal_conv1d_varlen,
    short_conv,
)

DTYPE = torch.float64
DIM = 3


def _qsl(lengths: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0) if lengths else out[1:]
    return out


def _params(gen: torch.Generator, width: int, with_bias: bool = True):
    weight = torch.randn(DIM, width, generator=gen, dtype=DTYPE)
    bias = torch.randn(DIM, generator=gen, dtype=DTYPE) if with_bias else None
    return weight, bias


def _stale_state(num_slots: int, state_len: int) -> torch.Tensor:
    """A conv-state cache full of NaN: any read of a column nobody wrote poisons an output."""
    return torch.full((num_slots, DIM, state_len), math.nan, dtype=DTYPE)


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# --------------------------------------------------------------------------------------------------------
# Non-speculative rows: prefill chunks and plain decodes
# --------------------------------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    width=st.integers(2, 5),
    chunks=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=1, max_size=4),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_prefill_and_decode_match_full_conv(width, chunks, with_bias, seed):
    """Rows prefilled in chunks (then 1-token decodes) give the full-sequence conv, and keep its last window."""
    gen = torch.Generator().manual_seed(seed)
    weight, bias = _params(gen, width, with_bias)
    num_rows = len(chunks)
    state = _stale_state(num_rows + 1, width - 1)
    slots = _i32(list(range(num_rows, 0, -1)))  # slots in a different order from rows
    streams = [torch.zeros(0, DIM, dtype=DTYPE) for _ in range(num_rows)]
    num_steps = max(len(c) for c in chunks)
    for step in range(num_steps):
        lengths = [c[step] if step < len(c) else 0 for c in chunks]  # 0: the row sits this step out
        x = torch.randn(sum(lengths), DIM, generator=gen, dtype=DTYPE)
        qsl = _qsl(lengths)
        has_initial = torch.tensor([s.shape[0] > 0 for s in streams])
        out = causal_conv1d_varlen(x, weight, bias, state, qsl, slots, has_initial)
        for r in range(num_rows):
            new = x[qsl[r]:qsl[r + 1]]
            torch.testing.assert_close(out[qsl[r]:qsl[r + 1]], conv_of_appended(streams[r], new, weight, bias))
            streams[r] = torch.cat([streams[r], new])
            if streams[r].shape[0] > 0:
                torch.testing.assert_close(state[slots[r], :, : width - 1], last_window(streams[r], width))


def test_row_without_initial_state_ignores_stale_slot_contents():
    gen = torch.Generator().manual_seed(0)
    weight, bias = _params(gen, 4)
    state = _stale_state(2, 3)
    x = torch.randn(2, DIM, generator=gen, dtype=DTYPE)
    out = causal_conv1d_varlen(x, weight, bias, state, _i32([0, 2]), _i32([1]), torch.tensor([False]))
    torch.testing.assert_close(out, causal_conv(x, weight, bias))
    torch.testing.assert_close(state[1], last_window(x, 4))


# --------------------------------------------------------------------------------------------------------
# Speculative rows: verify k+1 tokens, accept a prefix, continue from the accepted window
# --------------------------------------------------------------------------------------------------------


@st.composite
def spec_runs(draw):
    """A batch of rows, each prefilled then verified over several steps with random acceptance."""
    width = draw(st.integers(2, 5))
    k = draw(st.integers(1, 8))
    num_rows = draw(st.integers(1, 3))
    prefill_lens = draw(st.lists(st.integers(1, 6), min_size=num_rows, max_size=num_rows))
    num_steps = draw(st.integers(1, 4))
    steps = []
    for _ in range(num_steps):
        rows = []
        for _ in range(num_rows):
            q = draw(st.integers(1, k + 1))
            rows.append((q, draw(st.integers(1, q))))  # (tokens verified, tokens accepted incl. bonus)
        steps.append(rows)
    return width, k, prefill_lens, steps, draw(st.integers(0, 2**16))


@settings(max_examples=150, deadline=None)
@given(spec_runs())
def test_verify_then_accept_n_equals_feeding_accepted_tokens_one_at_a_time(run):
    """After verifying q <= k+1 tokens and accepting n of them, the window at column n-1 is the last W-1
    committed inputs, and every verified token's output is the conv of the committed stream plus the
    verified prefix up to it — for W in 2..5, k in 1..8, over consecutive steps."""
    width, k, prefill_lens, steps, seed = run
    gen = torch.Generator().manual_seed(seed)
    weight, bias = _params(gen, width)
    num_rows = len(prefill_lens)
    state = _stale_state(num_rows + 1, width - 1 + k)
    slots = _i32(list(range(1, num_rows + 1)))

    x = torch.randn(sum(prefill_lens), DIM, generator=gen, dtype=DTYPE)
    qsl = _qsl(prefill_lens)
    causal_conv1d_varlen(x, weight, bias, state, qsl, slots, torch.zeros(num_rows, dtype=torch.bool))
    committed = [x[qsl[r]:qsl[r + 1]] for r in range(num_rows)]
    num_accepted = [1] * num_rows  # after a prefill the window sits at column 0

    for rows in steps:
        lengths = [q for q, _ in rows]
        x = torch.randn(sum(lengths), DIM, generator=gen, dtype=DTYPE)
        qsl = _qsl(lengths)
        out = causal_conv1d_spec_update(x, weight, bias, state, qsl, slots, _i32(num_accepted))
        for r, (q, n) in enumerate(rows):
            verified = x[qsl[r]:qsl[r + 1]]
            torch.testing.assert_close(out[qsl[r]:qsl[r + 1]], conv_of_appended(committed[r], verified, weight, bias))
            committed[r] = torch.cat([committed[r], verified[:n]])
            num_accepted[r] = n
            window = state[slots[r], :, n - 1 : n - 1 + width - 1]
            torch.testing.assert_close(window, last_window(committed[r], width))


@pytest.mark.parametrize("width", [2, 3, 4, 5])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_state_reads_and_writes_stay_within_w_minus_2_plus_k_plus_1_columns(width, k):
    """Worst case: k+1 tokens read from the farthest window (num_accepted = k+1). Columns past
    W-2+k+1 hold NaN; no output may see them and they must stay untouched."""
    gen = torch.Generator().manual_seed(width * 10 + k)
    weight, bias = _params(gen, width)
    used = width - 2 + k + 1
    state = torch.randn(2, DIM, used + 3, generator=gen, dtype=DTYPE)
    state[:, :, used:] = math.nan
    x = torch.randn(k + 1, DIM, generator=gen, dtype=DTYPE)
    out = causal_conv1d_spec_update(x, weight, bias, state, _i32([0, k + 1]), _i32([1]), _i32([k + 1]))
    assert torch.isfinite(out).all()
    assert torch.isnan(state[:, :, used:]).all()
    assert torch.isfinite(state[:, :, :used]).all()


def test_null_slot_rows_never_write():
    """Rows pointing at NULL_BLOCK_ID leave slot 0 exactly as it was, in both ops, even with tokens."""
    gen = torch.Generator().manual_seed(1)
    weight, bias = _params(gen, 3)
    state = torch.randn(3, DIM, 2 + 2, generator=gen, dtype=DTYPE)
    before = state.clone()
    x = torch.randn(5, DIM, generator=gen, dtype=DTYPE)
    slots = _i32([NULL_BLOCK_ID, 2, NULL_BLOCK_ID])
    qsl = _i32([0, 2, 3, 5])
    causal_conv1d_varlen(x, weight, bias, state, qsl, slots, torch.tensor([True, True, False]))
    torch.testing.assert_close(state[NULL_BLOCK_ID], before[NULL_BLOCK_ID], rtol=0, atol=0)
    causal_conv1d_spec_update(x, weight, bias, state, qsl, slots, _i32([1, 2, 3]))
    torch.testing.assert_close(state[NULL_BLOCK_ID], before[NULL_BLOCK_ID], rtol=0, atol=0)
    torch.testing.assert_close(state[1], before[1], rtol=0, atol=0)  # nobody's slot


@pytest.mark.parametrize("op", ["varlen", "spec"])
def test_zero_length_rows_keep_their_state_and_padded_tokens_get_zeros(op):
    """Graph padding: zero-length rows (flat query_start_loc tail) change no state, even on a real slot,
    and tokens past query_start_loc[-1] come out as zeros whatever they hold."""
    gen = torch.Generator().manual_seed(2)
    weight, bias = _params(gen, 4)
    state = torch.randn(4, DIM, 3 + 2, generator=gen, dtype=DTYPE)
    before = state.clone()
    x = torch.randn(6, DIM, generator=gen, dtype=DTYPE)
    x[3:] = math.nan  # padded tokens
    qsl = _i32([0, 3, 3, 3])
    slots = _i32([1, 2, NULL_BLOCK_ID])
    if op == "varlen":
        out = causal_conv1d_varlen(x, weight, bias, state, qsl, slots, torch.tensor([True, True, False]))
    else:
        out = causal_conv1d_spec_update(x, weight, bias, state, qsl, slots, _i32([2, 2, 1]))
    torch.testing.assert_close(state[2:], before[2:], rtol=0, atol=0)
    assert torch.equal(out[3:], torch.zeros(3, DIM, dtype=DTYPE))
    assert torch.isfinite(out[:3]).all()


@settings(max_examples=60, deadline=None)
@given(width=st.integers(2, 5), lengths=st.lists(st.integers(0, 5), min_size=1, max_size=4), seed=st.integers(0, 99))
def test_lookahead_keeps_window_at_last_committed_input_then_the_lookahead_token(width, lengths, seed):
    """state_lookahead=1 (a draft prefill region ending with a not-yet-committed token): column 0 starts
    the window ending at the row's second-to-last input; column W-1 holds its last input. Zero-length
    rows (padding) keep their state."""
    gen = torch.Generator().manual_seed(seed)
    weight, bias = _params(gen, width)
    num_rows = len(lengths)
    state = torch.randn(num_rows + 1, DIM, width - 1 + 1, generator=gen, dtype=DTYPE)
    before = state.clone()
    x = torch.randn(sum(lengths), DIM, generator=gen, dtype=DTYPE)
    qsl = _qsl(lengths)
    slots = _i32(list(range(1, num_rows + 1)))
    out = causal_conv1d_varlen(
        x, weight, bias, state, qsl, slots, torch.zeros(num_rows, dtype=torch.bool), state_lookahead=1
    )
    for r, q in enumerate(lengths):
        row = x[qsl[r]:qsl[r + 1]]
        torch.testing.assert_close(out[qsl[r]:qsl[r + 1]], causal_conv(row, weight, bias))
        if q == 0:
            torch.testing.assert_close(state[r + 1], before[r + 1], rtol=0, atol=0)
            continue
        torch.testing.assert_close(state[r + 1, :, : width - 1], last_window(row[:-1], width))
        torch.testing.assert_close(state[r + 1, :, width - 1], row[-1])


# --------------------------------------------------------------------------------------------------------
# short_conv routing
# --------------------------------------------------------------------------------------------------------


def test_short_conv_of_an_empty_step_is_zeros_and_touches_nothing():
    state = torch.randn(2, DIM, 3, dtype=DTYPE)
    before = state.clone()
    meta = ShortConvMetadata(
        num_prefills=0, num_prefill_tokens=0, num_decodes=0, num_decode_tokens=0, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=0, spec_query_len=3, max_prefill_query_len=0,
        query_start_loc=_i32([0]), state_indices_tensor=_i32([]), non_spec_query_start_loc=_i32([0]),
    )
    x = torch.randn(4, DIM, dtype=DTYPE)  # graph padding only
    out = short_conv(x, torch.randn(DIM, 3, dtype=DTYPE), None, state, meta)
    assert torch.equal(out, torch.zeros_like(x))
    assert torch.equal(state, before)


def test_a_forwards_conv_layers_share_one_varlen_plan():
    """Two conv layers of one prefill forward (one ConvPlan) derive the varlen indices once and each match the
    full-sequence conv; a layer of another width gets its own."""
    gen = torch.Generator().manual_seed(3)
    lengths = [4, 1, 6]
    qsl = _qsl(lengths)
    meta = ShortConvMetadata(
        num_prefills=3, num_prefill_tokens=11, num_decodes=0, num_decode_tokens=0, num_spec_decodes=0,
        num_spec_decode_tokens=0, num_actual_tokens=11, spec_query_len=1, max_prefill_query_len=6,
        query_start_loc=qsl, state_indices_tensor=_i32([1, 2, 3]), non_spec_query_start_loc=qsl,
        has_initial_states_p=torch.zeros(3, dtype=torch.bool),
    )
    plan = ConvPlan(meta)
    x = torch.randn(11, DIM, generator=gen, dtype=DTYPE)
    for width in (3, 3, 4):
        weight, bias = _params(gen, width)
        out = short_conv(x, weight, bias, torch.zeros(4, DIM, width - 1, dtype=DTYPE), plan)
        for r in range(3):
            row = slice(int(qsl[r]), int(qsl[r + 1]))
            torch.testing.assert_close(out[row], causal_conv(x[row], weight, bias))
    derived = [key[0].__name__ for key in plan._memo]
    # the varlen indices of widths 3 and 4, and the rows' initial-state mask once
    assert sorted(derived) == ["_plan_non_spec_indices", "_plan_non_spec_indices", "has_initial_states_non_spec"]
