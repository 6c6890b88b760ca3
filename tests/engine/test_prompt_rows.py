"""The chunk segment of joined mixed-step graphs: prompt chunks laid out in rows of C slots (`stride_rows`), and
the short conv over them from persistent buffers (`build_for_prompt_rows_capture` / `load_prompt_rows`), for any
number of chunks, lengths, computed prefixes and slots (hypothesis)."""

from __future__ import annotations

import math

import pytest
import torch
from conv_reference import conv_of_appended, last_window
from hypothesis import given, settings
from hypothesis import strategies as st
from test_short_conv_builder import DEVICES, _builder, _replayable

from specexp.engine.inputs import InputBuffers, build_step_inputs, stride_rows
from specexp.models.metadata import NULL_BLOCK_ID
from specexp.models.short_conv_ops import short_conv

BLOCK_SIZE, MAX_BLOCKS, DIM = 4, 8, 3


@st.composite
def chunk_rows(draw):
    """Chunks (tokens, start, blocks) of at most `stride` tokens, in `rows` >= len(chunks) rows."""
    stride = draw(st.integers(1, 9))
    num = draw(st.integers(1, 4))
    free = list(range(1, 200))
    chunks = []
    for _ in range(num):
        start = draw(st.integers(0, 12))
        tokens = draw(st.lists(st.integers(1, 999), min_size=1, max_size=stride))
        blocks = [free.pop(draw(st.integers(0, len(free) - 1))) for _ in range(-(-(start + len(tokens)) // BLOCK_SIZE))]
        chunks.append((tokens, start, blocks))
    return chunks, stride, num + draw(st.integers(0, 3))


@settings(max_examples=150, deadline=None)
@given(chunk_rows())
def test_strided_rows_hold_each_chunk_at_the_front_of_its_row(case):
    chunks, stride, rows = case
    flat = build_step_inputs(*zip(*chunks), BLOCK_SIZE, MAX_BLOCKS)
    cpu = stride_rows(flat, stride, rows)
    assert cpu.query_start_loc.tolist() == [r * stride for r in range(len(chunks) + 1)]
    assert cpu.max_query_len == stride and cpu.num_tokens == len(chunks) * stride
    tokens = cpu.padded.tokens
    assert tokens.shape == (4, rows * stride)
    for r, (ids, start, _) in enumerate(chunks):
        lo, q = int(flat.query_start_loc[r]), len(ids)
        row = tokens[:, r * stride : (r + 1) * stride]
        assert torch.equal(row[:3, :q], flat.padded.tokens[:3, lo : lo + q])  # ids, positions, slots
        assert row[3].tolist() == [r] * stride
        assert row[0, q:].tolist() == [0] * (stride - q) and row[2, q:].tolist() == [-1] * (stride - q)
    assert (tokens[2, len(chunks) * stride :] == -1).all()
    assert cpu.padded.seq_lens.tolist() == [s + len(t) for t, s, _ in chunks] + [0] * (rows - len(chunks))
    assert torch.equal(cpu.padded.block_table[: len(chunks)], flat.block_table)
    assert (cpu.padded.block_table[len(chunks) :] == NULL_BLOCK_ID).all()
    buffers = InputBuffers(rows, rows * stride, MAX_BLOCKS, torch.device("cpu"))
    buffers.load(cpu, rows, rows * stride)
    assert torch.equal(buffers.tokens, tokens)


def test_a_chunk_longer_than_its_row_is_refused():
    flat = build_step_inputs([[5] * 6], [0], [[1, 2]], BLOCK_SIZE, MAX_BLOCKS)
    with pytest.raises(ValueError, match="do not fit 2 rows of 4"):
        stride_rows(flat, 4, 2)


@st.composite
def prompt_row_runs(draw):
    """A few replays of a graph of `rows` rows of `stride` slots; each replay holds chunks of up to `stride`
    tokens of distinct requests (slots 1..4), each request's chunks continuing its stream."""
    lookahead = draw(st.integers(0, 1))
    stride = draw(st.integers(1 + lookahead, 8))
    rows = draw(st.integers(1, 4))
    replays = [draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1 + lookahead, stride)), min_size=1,
                             max_size=rows, unique_by=lambda c: c[0])) for _ in range(draw(st.integers(1, 3)))]
    return {"width": draw(st.integers(2, 5)), "k": draw(st.integers(0, 3)), "stride": stride, "rows": rows,
            "lookahead": lookahead, "replays": replays, "seed": draw(st.integers(0, 2**20))}


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(run=prompt_row_runs())
def test_prompt_rows_conv_matches_each_chunk_on_its_own_stream(device, run):
    """One captured chunk segment of M rows x C slots, replayed for chunks of several requests at once (padding
    slots hold NaN): each chunk's outputs are the conv of its request's committed stream plus the chunk, the
    padding gives zeros, each slot's window ends at its last committed input (then the L lookahead inputs), and
    slots of no chunk keep their state."""
    dev = torch.device(device)
    width, stride, rows, lookahead = run["width"], run["stride"], run["rows"], run["lookahead"]
    gen = torch.Generator().manual_seed(run["seed"])
    weight = torch.randn(DIM, width, generator=gen, dtype=torch.float64).to(dev)
    bias = torch.randn(DIM, generator=gen, dtype=torch.float64).to(dev)
    state = torch.randn(6, DIM, width - 1 + run["k"] + 1, generator=gen, dtype=torch.float64).to(dev)
    builder = _builder(run["k"] + 1, full=True, max_num_seqs=8, device=dev)
    builder.allocate_prompt_rows(max_rows=4, max_tokens=32)
    captured = builder.build_for_prompt_rows_capture(num_rows=rows, row_tokens=stride, state_lookahead=lookahead)
    x_buf = torch.zeros(rows * stride, DIM, dtype=torch.float64, device=dev)
    replay, out_buf = _replayable(lambda: short_conv(x_buf, weight, bias, state, captured), x_buf)
    committed = {slot: torch.zeros(0, DIM, dtype=torch.float64) for slot in range(1, 5)}
    for chunks in run["replays"]:
        before = state.cpu().clone()
        builder.load_prompt_rows(query_lens=[q for _, q in chunks],
                                 num_computed_tokens=[committed[slot].shape[0] for slot, _ in chunks],
                                 state_indices=[slot for slot, _ in chunks], row_tokens=stride)
        x_buf.fill_(math.nan)
        inputs = []
        for r, (_, q) in enumerate(chunks):
            inputs.append(torch.randn(q, DIM, generator=gen, dtype=torch.float64))
            x_buf[r * stride : r * stride + q].copy_(inputs[-1])
        replay()
        out = out_buf.cpu()
        padding = torch.ones(rows * stride, dtype=torch.bool)
        for r, ((slot, q), chunk) in enumerate(zip(chunks, inputs)):
            padding[r * stride : r * stride + q] = False
            torch.testing.assert_close(out[r * stride : r * stride + q],
                                       conv_of_appended(committed[slot], chunk, weight.cpu(), bias.cpu()))
            committed[slot] = torch.cat([committed[slot], chunk[: q - lookahead]])
            window = state[slot].cpu()
            torch.testing.assert_close(window[:, : width - 1], last_window(committed[slot], width))
            if lookahead:
                torch.testing.assert_close(window[:, width - 1 : width - 1 + lookahead], chunk[q - lookahead:].T)
        assert torch.equal(out[padding], torch.zeros_like(out[padding]))
        untouched = [s for s in range(state.shape[0]) if s not in {slot for slot, _ in chunks}]
        assert torch.equal(state.cpu()[untouched], before[untouched])


def test_prompt_rows_outside_the_buffers_are_refused():
    builder = _builder(2, full=True)
    builder.allocate_prompt_rows(max_rows=2, max_tokens=8)
    with pytest.raises(ValueError, match="3 prompt rows of 4 tokens exceed"):
        builder.build_for_prompt_rows_capture(num_rows=3, row_tokens=4)
    builder.build_for_prompt_rows_capture(num_rows=2, row_tokens=4)
    with pytest.raises(ValueError, match=r"\(5, 0, 1\)"):
        builder.load_prompt_rows(query_lens=[5], num_computed_tokens=[0], state_indices=[1], row_tokens=4)
    with pytest.raises(ValueError, match="slots > NULL"):
        builder.load_prompt_rows(query_lens=[2], num_computed_tokens=[0], state_indices=[NULL_BLOCK_ID], row_tokens=4)
