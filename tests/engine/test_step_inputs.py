"""Flattened step inputs: every token's row, position and KV slot, for any mix of rows (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.inputs import build_step_inputs

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
