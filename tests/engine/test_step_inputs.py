"""Flattened step inputs: every token's row, position and KV slot, for any mix of rows (hypothesis)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.inputs import InputBuffers, build_step_inputs

BLOCK_SIZE, MAX_BLOCKS = 4, 6


@st.composite
def steps(draw):
    """Rows of (tokens, start position, block ids) whose blocks cover every position they run."""
    num_rows = draw(st.integers(0, 6))
    free = list(range(1, 100))
    rows = []
    for _ in range(num_rows):
        start = draw(st.integers(0, 15))
        tokens = draw(st.lists(st.integers(0, 999), min_size=0, max_size=MAX_BLOCKS * BLOCK_SIZE - start))
        num_blocks = -(-(start + len(tokens)) // BLOCK_SIZE)
        blocks = [free.pop(draw(st.integers(0, len(free) - 1))) for _ in range(num_blocks)]
        rows.append((tokens, start, blocks))
    return rows


@settings(max_examples=200, deadline=None)
@given(steps())
def test_every_token_knows_its_row_position_and_slot(rows):
    cpu = build_step_inputs([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], BLOCK_SIZE,
                            MAX_BLOCKS)
    assert cpu.num_reqs == len(rows) and cpu.block_table.shape == (len(rows), MAX_BLOCKS)
    t = 0
    for r, (tokens, start, blocks) in enumerate(rows):
        assert int(cpu.query_start_loc[r]) == t and int(cpu.seq_lens[r]) == start + len(tokens)
        assert cpu.block_table[r].tolist() == blocks + [0] * (MAX_BLOCKS - len(blocks))
        for i, token in enumerate(tokens):
            pos = start + i
            assert int(cpu.input_ids[t]) == token and int(cpu.positions[t]) == pos
            assert int(cpu.token_req_indices[t]) == r
            assert int(cpu.slot_mapping[t]) == blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
            t += 1
    assert int(cpu.query_start_loc[-1]) == t == cpu.num_tokens


@settings(max_examples=100, deadline=None)
@given(steps(), st.integers(0, 3), st.integers(0, 9), st.data())
def test_padded_steps_load_like_the_field_by_field_path(rows, extra_rows, extra_tokens, data):
    """A step built for a graph's padded (rows, tokens) loads in four copies what the field-by-field path
    (copies, then padding fills) leaves in the persistent buffers, whatever an earlier step left there."""
    tokens, starts, blocks = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    num_reqs, num_tokens = len(rows), sum(len(t) for t in tokens)
    r_pad, t_pad = num_reqs + extra_rows, num_tokens + extra_tokens
    if r_pad == 0:
        return
    padded = build_step_inputs(tokens, starts, blocks, BLOCK_SIZE, MAX_BLOCKS, r_pad, t_pad)
    plain = build_step_inputs(tokens, starts, blocks, BLOCK_SIZE, MAX_BLOCKS)
    plain.padded = None  # force the field-by-field path
    for name in ("input_ids", "positions", "query_start_loc", "seq_lens", "block_table", "slot_mapping",
                 "token_req_indices"):
        assert torch.equal(getattr(padded, name), getattr(plain, name)), name
    loaded = []
    for cpu in (padded, plain):
        buffers = InputBuffers(9, 160, MAX_BLOCKS, torch.device("cpu"))
        stale = data.draw(st.integers(-5, 50))  # whatever an earlier step left in the buffers
        for t in (buffers.tokens, buffers.query_start_loc, buffers.seq_lens, buffers.block_table):
            t.fill_(stale)
        buffers.load(cpu, r_pad, t_pad)
        loaded.append([buffers.input_ids[:t_pad], buffers.positions[:t_pad], buffers.slot_mapping[:t_pad],
                       buffers.token_req_indices[:t_pad], buffers.query_start_loc[: r_pad + 1],
                       buffers.seq_lens[:r_pad], buffers.block_table[:r_pad]])
    for got, want in zip(*loaded, strict=True):
        assert torch.equal(got, want)


def test_buffer_bytes_count_each_storage_once():
    buffers = InputBuffers(4, 16, 3, torch.device("cpu"))
    assert buffers.nbytes() == 4 * 16 * 8 + (5 + 4 + 4 * 3) * 4
