"""Specification of `ShortConvMetadataBuilder` (`specexp.engine.short_conv`).

Layout properties over random batches (spec / decode / prefill / empty rows in any order), full-graph
padding and capture, input checks, and end-to-end exactness: mixed batches run through the builder and
`short_conv` over several steps equal a full-sequence causal conv over each request's committed stream.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
import torch
from conv_reference import conv_of_appended, last_window
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.short_conv import ShortConvMetadataBuilder
from specexp.models.metadata import NULL_BLOCK_ID, ShortConvMetadata
from specexp.models.short_conv_ops import short_conv

CPU = torch.device("cpu")
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _builder(k: int, *, full: bool = False, max_num_seqs: int = 32, max_capture_size: int | None = None,
             device: torch.device | str = CPU):
    return ShortConvMetadataBuilder(
        num_spec_tokens=k, use_full_cuda_graph=full, max_num_seqs=max_num_seqs,
        max_capture_size=max_capture_size, device=torch.device(device),
    )


@dataclass
class Batch:
    """A step's scheduler inputs, plus what each row is (for the checks)."""

    k: int
    kinds: list[str]  # "spec" | "decode" | "prefill" | "empty"
    query_lens: list[int]
    num_computed: list[int]
    drafts: list[int]
    num_accepted: list[int]
    slots: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.kinds)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def qsl(self) -> torch.Tensor:
        return _i32([0] + list(torch.tensor(self.query_lens, dtype=torch.int64).cumsum(0).tolist()))

    def rows(self, *kinds: str) -> list[int]:
        return [r for r, kind in enumerate(self.kinds) if kind in kinds]

    def build(self, builder: ShortConvMetadataBuilder, **padding) -> ShortConvMetadata:
        return builder.build(
            query_start_loc_cpu=self.qsl(), num_computed_tokens_cpu=_i32(self.num_computed),
            num_decode_draft_tokens_cpu=_i32(self.drafts), num_accepted_tokens_cpu=_i32(self.num_accepted),
            state_indices_cpu=_i32(self.slots), **padding,
        )


ANY_ROW_KIND = st.sampled_from(["spec", "decode", "prefill", "empty"])


@st.composite
def batches(draw, kinds=ANY_ROW_KIND, max_rows: int = 16):
    k = draw(st.integers(0, 5))
    kind_list = draw(st.lists(kinds, min_size=0, max_size=max_rows))
    slots = draw(st.permutations(list(range(1, 40))))[: len(kind_list)]
    b = Batch(k, kind_list, [], [], [], [], [])
    for r, kind in enumerate(kind_list):
        if kind == "spec":
            q = draw(st.integers(1, k + 1))
            b.query_lens.append(q)
            b.drafts.append(draw(st.integers(0, k)))
            b.num_computed.append(draw(st.integers(1, 50)))
            b.num_accepted.append(draw(st.integers(1, k + 1)))
        else:
            b.query_lens.append({"decode": 1, "prefill": draw(st.integers(2, 9)), "empty": 0}[kind])
            b.drafts.append(-1)
            b.num_computed.append(draw(st.integers(0, 50)))
            b.num_accepted.append(draw(st.integers(-3, 9)))  # ignored for non-spec rows
        b.slots.append(NULL_BLOCK_ID if kind == "empty" and draw(st.booleans()) else slots[r])
    return b


def token_maps(meta: ShortConvMetadata, num_tokens: int) -> tuple[list[int], list[int]]:
    """(spec tokens, non-spec tokens) as flat indices, resolving the None shortcuts as short_conv does."""
    everything = list(range(num_tokens))
    if meta.num_spec_decodes == 0:
        return [], everything if meta.non_spec_token_indx is None else meta.non_spec_token_indx.tolist()
    if meta.num_non_spec_rows == 0:
        assert meta.spec_token_indx is None
        return everything, meta.non_spec_token_indx.tolist()
    return meta.spec_token_indx.tolist(), meta.non_spec_token_indx.tolist()


def _cumsum0(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


# --------------------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(batches())
def test_counts_add_up(b: Batch):
    meta = b.build(_builder(b.k))
    spec, dec, pre = b.rows("spec"), b.rows("decode"), b.rows("prefill")
    assert (meta.num_spec_decodes, meta.num_decodes, meta.num_prefills) == (len(spec), len(dec), len(pre))
    assert meta.num_spec_decode_tokens == sum(b.query_lens[r] for r in spec)
    assert meta.num_decode_tokens == len(dec)
    assert meta.num_prefill_tokens == sum(b.query_lens[r] for r in pre)
    assert meta.num_spec_decode_tokens + meta.num_decode_tokens + meta.num_prefill_tokens == b.num_tokens
    assert meta.num_actual_tokens == b.num_tokens
    assert meta.max_prefill_query_len == max([b.query_lens[r] for r in pre], default=0)
    # the longest spec row's query (every spec row's in a uniform batch), k + 1 without spec rows
    assert meta.spec_query_len == max([b.query_lens[r] for r in spec], default=b.k + 1)
    assert meta.query_start_loc.tolist() == b.qsl().tolist()


@settings(max_examples=200, deadline=None)
@given(batches())
def test_spec_and_non_spec_token_maps_partition_all_tokens(b: Batch):
    meta = b.build(_builder(b.k))
    spec_tokens, non_spec_tokens = token_maps(meta, b.num_tokens)
    assert sorted(spec_tokens + non_spec_tokens) == list(range(b.num_tokens))
    assert len(spec_tokens) == meta.num_spec_decode_tokens
    # The None shortcuts mean what short_conv assumes.
    assert (meta.non_spec_token_indx is None) <= (meta.num_spec_decodes == 0)
    assert (meta.spec_token_indx is None) == (meta.num_spec_decodes == 0 or meta.num_non_spec_rows == 0)


@settings(max_examples=200, deadline=None)
@given(batches())
def test_spec_tokens_stay_contiguous_in_request_order(b: Batch):
    """Within each group, row i's tokens are exactly its flat tokens, in order, and rows keep batch order;
    the group's query-start locations are the cumsum of its rows' query lengths."""
    meta = b.build(_builder(b.k))
    spec_tokens, non_spec_tokens = token_maps(meta, b.num_tokens)
    qsl = b.qsl().tolist()
    for rows, tokens, starts in (
        (b.rows("spec"), spec_tokens, meta.spec_query_start_loc),
        (b.rows("decode") + b.rows("prefill"), non_spec_tokens, meta.non_spec_query_start_loc),
    ):
        if not rows:
            continue
        expected_starts = _cumsum0([b.query_lens[r] for r in rows])
        assert starts.tolist() == expected_starts
        for i, r in enumerate(rows):
            assert tokens[expected_starts[i]: expected_starts[i + 1]] == list(range(qsl[r], qsl[r + 1]))


@settings(max_examples=200, deadline=None)
@given(batches())
def test_state_indices_and_accepted_counts_follow_the_same_row_order(b: Batch):
    meta = b.build(_builder(b.k))
    spec, dec, pre = b.rows("spec"), b.rows("decode"), b.rows("prefill")
    if spec:
        assert meta.spec_state_indices_tensor.tolist() == [b.slots[r] for r in spec]
        assert meta.num_accepted_tokens.tolist() == [b.num_accepted[r] for r in spec]
        assert meta.spec_sequence_masks.tolist() == [kind == "spec" for kind in b.kinds]
    else:
        assert meta.spec_state_indices_tensor is None and meta.num_accepted_tokens is None
    assert meta.state_indices_tensor.tolist() == [b.slots[r] for r in dec + pre]
    if dec:
        assert meta.state_indices_tensor_d.tolist() == [b.slots[r] for r in dec]
        assert meta.has_initial_states_d.tolist() == [b.num_computed[r] > 0 for r in dec]
        assert meta.query_start_loc_d.tolist() == list(range(len(dec) + 1))
    else:
        assert meta.state_indices_tensor_d is None and meta.has_initial_states_d is None
    if pre:
        assert meta.state_indices_tensor_p.tolist() == [b.slots[r] for r in pre]
        assert meta.has_initial_states_p.tolist() == [b.num_computed[r] > 0 for r in pre]
        assert meta.num_computed_tokens_p.tolist() == [b.num_computed[r] for r in pre]
        assert meta.query_start_loc_p.tolist() == _cumsum0([b.query_lens[r] for r in pre])
    else:
        assert meta.state_indices_tensor_p is None and meta.num_computed_tokens_p is None
    if dec or pre:
        assert meta.has_initial_states_non_spec().tolist() == [b.num_computed[r] > 0 for r in dec + pre]


def test_docstring_example_layout():
    """The mixed batch drawn in the module docstring."""
    b = Batch(2, ["spec", "prefill", "decode", "spec", "prefill"], [3, 4, 1, 3, 2], [5, 0, 4, 6, 3],
              [2, -1, -1, 2, -1], [1, 1, 1, 3, 1], [11, 12, 13, 14, 15])
    meta = b.build(_builder(2))
    assert meta.spec_token_indx.tolist() == [0, 1, 2, 8, 9, 10]
    assert meta.non_spec_token_indx.tolist() == [7, 3, 4, 5, 6, 11, 12]
    assert meta.spec_query_start_loc.tolist() == [0, 3, 6]
    assert meta.non_spec_query_start_loc.tolist() == [0, 1, 5, 7]
    assert meta.query_start_loc_p.tolist() == [0, 4, 6]
    assert meta.spec_state_indices_tensor.tolist() == [11, 14]
    assert meta.state_indices_tensor.tolist() == [13, 12, 15]


def test_grouped_non_spec_batch_keeps_its_tokens_in_place():
    b = Batch(0, ["decode", "decode", "prefill"], [1, 1, 3], [4, 2, 0], [-1] * 3, [1] * 3, [3, 1, 2])
    assert b.build(_builder(0)).non_spec_token_indx is None
    b = Batch(0, ["prefill", "decode"], [3, 1], [0, 2], [-1] * 2, [1] * 2, [3, 1])
    assert b.build(_builder(0)).non_spec_token_indx.tolist() == [3, 0, 1, 2]


# --------------------------------------------------------------------------------------------------------
# Full CUDA graphs: persistent buffers, padding, capture
# --------------------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(batches(kinds=st.sampled_from(["spec"] * 4 + ["empty"]), max_rows=8), st.integers(0, 8))
def test_padded_rows_are_inert_and_real_rows_match_an_unpadded_build(b: Batch, extra_rows: int):
    builder = _builder(b.k, full=True, max_num_seqs=16)
    unpadded = b.build(_builder(b.k))
    padded_rows = b.num_reqs + extra_rows
    meta = b.build(builder, num_reqs_padded=padded_rows, num_tokens_padded=b.num_tokens + extra_rows)
    n, total = meta.num_spec_decodes, b.num_tokens
    if n == 0:  # nothing to replay: the non-spec path, unpadded
        assert meta.spec_state_indices_tensor is None
        return
    assert meta.spec_state_indices_tensor.shape == (padded_rows,)
    # Padded rows: NULL slot, 1 accepted, flat query-start tail, not spec.
    assert meta.spec_state_indices_tensor[n:].tolist() == [NULL_BLOCK_ID] * (padded_rows - n)
    assert meta.num_accepted_tokens[n:].tolist() == [1] * (padded_rows - n)
    assert meta.spec_query_start_loc[n + 1:].tolist() == [total] * (padded_rows - n)
    assert meta.query_start_loc[b.num_reqs + 1:].tolist() == [total] * extra_rows
    assert not meta.spec_sequence_masks[b.num_reqs:].any()
    # Real rows: identical to an unpadded eager build.
    for name in ("spec_state_indices_tensor", "num_accepted_tokens"):
        assert torch.equal(getattr(meta, name)[:n], getattr(unpadded, name))
    assert torch.equal(meta.spec_query_start_loc[: n + 1], unpadded.spec_query_start_loc)
    assert torch.equal(meta.query_start_loc[: b.num_reqs + 1], unpadded.query_start_loc)
    assert torch.equal(meta.spec_sequence_masks[: b.num_reqs], unpadded.spec_sequence_masks)
    for name in ("num_spec_decodes", "num_spec_decode_tokens", "num_actual_tokens", "spec_token_indx"):
        assert getattr(meta, name) == getattr(unpadded, name)


def _pure_spec(k: int, query_lens: list[int], slots: list[int], accepted: list[int]) -> Batch:
    n = len(query_lens)
    return Batch(k, ["spec"] * n, query_lens, [7] * n, [q - 1 for q in query_lens], accepted, slots)


def test_graph_replays_read_persistent_buffers_rewritten_every_step():
    """Same addresses as the capture; a smaller batch after a larger one leaves no stale row behind."""
    builder = _builder(3, full=True, max_num_seqs=8)
    captured = builder.build_for_cudagraph_capture(num_reqs=4, num_tokens=16)
    big = _pure_spec(3, [4, 4, 4, 4], [5, 6, 7, 8], [2, 3, 4, 1]).build(builder, num_reqs_padded=4, num_tokens_padded=16)
    small = _pure_spec(3, [4, 2], [2, 9], [4, 2]).build(builder, num_reqs_padded=4, num_tokens_padded=16)
    for name in ("query_start_loc", "spec_query_start_loc", "spec_state_indices_tensor", "num_accepted_tokens",
                 "spec_sequence_masks"):
        ptrs = {getattr(m, name).data_ptr() for m in (captured, big, small)}
        assert len(ptrs) == 1, name
    # `big` aliases the buffers, so it now shows the latest step: exactly the small batch, padded.
    assert small.spec_state_indices_tensor.tolist() == [2, 9, NULL_BLOCK_ID, NULL_BLOCK_ID]
    assert small.num_accepted_tokens.tolist() == [4, 2, 1, 1]
    assert small.spec_query_start_loc.tolist() == [0, 4, 6, 6, 6]
    assert small.spec_sequence_masks.tolist() == [True, True, False, False]


def test_capture_batch_is_uniform_pure_spec_on_the_null_slot():
    builder = _builder(2, full=True, max_num_seqs=8)
    meta = builder.build_for_cudagraph_capture(num_reqs=3, num_tokens=9)
    assert (meta.num_spec_decodes, meta.num_spec_decode_tokens, meta.num_non_spec_rows) == (3, 9, 0)
    assert meta.spec_token_indx is None
    assert meta.spec_query_start_loc.tolist() == [0, 3, 6, 9]
    assert meta.spec_state_indices_tensor.tolist() == [NULL_BLOCK_ID] * 3
    assert meta.num_accepted_tokens.tolist() == [3, 3, 3]  # farthest window: every read stays in bounds


@pytest.mark.parametrize(
    ("max_num_seqs", "max_capture_size", "num_reqs", "num_tokens"),
    [(4, None, 5, 15), (8, None, 2, 25), (8, 6, 2, 9), (8, 6, 7, 7)],
)
def test_capture_outside_the_bounds_names_both_numbers(max_num_seqs, max_capture_size, num_reqs, num_tokens):
    builder = _builder(2, full=True, max_num_seqs=max_num_seqs, max_capture_size=max_capture_size)
    with pytest.raises(AssertionError, match=rf"batch size \({num_reqs}\).*number of tokens \({num_tokens}\)"):
        builder.build_for_cudagraph_capture(num_reqs=num_reqs, num_tokens=num_tokens)


def test_capture_bounds_follow_vllm():
    b = _builder(3, max_num_seqs=10, max_capture_size=16)
    assert (b.decode_cudagraph_max_bs, b.decode_cudagraph_max_tokens) == (10, 16)
    b = _builder(3, max_num_seqs=10)
    assert (b.decode_cudagraph_max_bs, b.decode_cudagraph_max_tokens) == (10, 40)


@pytest.mark.parametrize("case", ["graphs_off", "no_padding_asked", "too_many_rows", "too_many_tokens", "mixed"])
def test_batches_that_cannot_replay_a_graph_build_eagerly(case):
    builder = _builder(3, full=case != "graphs_off", max_num_seqs=4, max_capture_size=8)
    b = _pure_spec(3, [4, 3], [1, 2], [1, 1])
    padding = {"num_reqs_padded": 3, "num_tokens_padded": 8}
    if case == "no_padding_asked":
        padding = {}
    elif case == "too_many_rows":
        padding = {"num_reqs_padded": 5, "num_tokens_padded": 8}
    elif case == "too_many_tokens":
        b = _pure_spec(3, [4, 4, 1], [1, 2, 3], [1, 1, 1])
        padding = {"num_reqs_padded": 3, "num_tokens_padded": 9}
    elif case == "mixed":
        b = Batch(3, ["spec", "decode"], [4, 1], [3, 3], [3, -1], [1, 1], [1, 2])
    meta = b.build(builder, **padding)
    assert meta.spec_state_indices_tensor.shape == (meta.num_spec_decodes,)
    assert meta.spec_state_indices_tensor.data_ptr() != builder._graph.spec_state_indices.data_ptr()


# --------------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"query_lens": [5, 1], "drafts": [4, -1]}, "spec row 0 verifies 5 tokens"),
        ({"num_accepted": [0, 1]}, "spec row 0 has num_accepted_tokens 0"),
        ({"num_accepted": [5, 1]}, "spec row 0 has num_accepted_tokens 5"),
        ({"num_computed": [0, 2]}, "spec row 0 has no conv state yet"),
        ({"slots": [3, 3]}, "distinct conv slots"),
        ({"slots": [NULL_BLOCK_ID, 3]}, "distinct conv slots"),
    ],
)
def test_batches_the_ops_would_get_wrong_are_rejected(change, message):
    fields = {"k": 3, "kinds": ["spec", "decode"], "query_lens": [2, 1], "num_computed": [4, 2], "drafts": [1, -1],
                  "num_accepted": [2, 1], "slots": [3, 4]}
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        Batch(**fields).build(_builder(3))


# --------------------------------------------------------------------------------------------------------
# Exactness: builder + short_conv over several steps of mixed batches
# --------------------------------------------------------------------------------------------------------

DIM = 3


@dataclass
class SimRequest:
    prompt_left: int
    slot: int
    committed: torch.Tensor = field(default_factory=lambda: torch.zeros(0, DIM, dtype=torch.float64))
    num_accepted: int = 1
    verified: bool = False  # once verified, every later decode is a spec row


def _plan_row(req: SimRequest, k: int, rng: random.Random) -> tuple[str, int, int, int] | None:
    """(kind, query_len, drafts, accepted) for this request's next step, or None to sit the step out."""
    if rng.random() < 0.15:
        return None
    if req.prompt_left > 0:  # a prompt chunk; a one-token chunk is classified as a plain decode
        q = rng.randint(1, min(req.prompt_left, 6))
        return ("prefill" if q > 1 else "decode", q, -1, q)
    if not req.verified and rng.random() < 0.4:
        return ("decode", 1, -1, 1)  # decoded without speculation
    q = rng.randint(1, k + 1)
    return ("spec", q, q - 1, rng.randint(1, q))


@st.composite
def sim_runs(draw):
    return {"width": draw(st.integers(2, 5)), "k": draw(st.integers(1, 8)), "num_requests": draw(st.integers(1, 5)),
                "num_steps": draw(st.integers(1, 6)), "full_graphs": draw(st.booleans()), "seed": draw(st.integers(0, 2**20))}


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=100, deadline=None)
@given(run=sim_runs())
def test_mixed_steps_through_builder_and_short_conv_match_the_committed_stream(device, run):
    """Requests prefilled in chunks, decoded without spec, then spec-verified with random acceptance, in
    shuffled mixed batches (graph-padded when pure spec): every token's output is the conv of its committed
    stream plus the verified prefix, and each row's next window holds its last W-1 committed inputs."""
    width, k, rng = run["width"], run["k"], random.Random(run["seed"])
    gen = torch.Generator().manual_seed(run["seed"])
    weight = torch.randn(DIM, width, generator=gen, dtype=torch.float64)
    bias = torch.randn(DIM, generator=gen, dtype=torch.float64)
    max_reqs = run["num_requests"] + 3
    builder = _builder(k, full=run["full_graphs"], max_num_seqs=max_reqs, device=device)
    state = torch.full((max_reqs + 1, DIM, width - 1 + k), math.nan, dtype=torch.float64, device=device)
    null_before = state[NULL_BLOCK_ID].clone()
    slots = rng.sample(range(1, max_reqs + 1), run["num_requests"])
    requests = [SimRequest(prompt_left=rng.randint(1, 9), slot=s) for s in slots]

    for _ in range(run["num_steps"]):
        plan = [(req, p) for req in requests if (p := _plan_row(req, k, rng)) is not None]
        rng.shuffle(plan)
        if not plan:
            continue
        b = Batch(k, [p[0] for _, p in plan], [p[1] for _, p in plan],
                  [req.committed.shape[0] for req, _ in plan], [p[2] for _, p in plan],
                  [req.num_accepted for req, _ in plan], [req.slot for req, _ in plan])
        padding, extra_tokens = {}, 0
        if all(kind == "spec" for kind in b.kinds):
            extra_tokens = rng.randint(0, 3)
            padding = {"num_reqs_padded": b.num_reqs + rng.randint(0, 2), "num_tokens_padded": b.num_tokens + extra_tokens}
        meta = b.build(builder, **padding)
        x = torch.randn(b.num_tokens + extra_tokens, DIM, generator=gen, dtype=torch.float64)
        x[b.num_tokens:] = math.nan  # graph padding holds anything
        out = short_conv(x.to(device), weight.to(device), bias.to(device), state, meta).cpu()
        assert torch.equal(out[b.num_tokens:], torch.zeros(extra_tokens, DIM, dtype=torch.float64))
        qsl = b.qsl().tolist()
        for r, (req, (kind, q, _, accepted)) in enumerate(plan):
            new = x[qsl[r]: qsl[r + 1]]
            torch.testing.assert_close(out[qsl[r]: qsl[r + 1]], conv_of_appended(req.committed, new, weight, bias))
            req.committed = torch.cat([req.committed, new[:accepted]])
            if kind == "spec":
                req.verified, req.num_accepted = True, accepted
            else:
                req.prompt_left -= q if req.prompt_left else 0
                req.num_accepted = 1
            o = req.num_accepted - 1
            torch.testing.assert_close(state[req.slot, :, o: o + width - 1].cpu(), last_window(req.committed, width))
    assert torch.equal(state[NULL_BLOCK_ID].isnan(), null_before.isnan())


# --------------------------------------------------------------------------------------------------------
# CUDA: no device-to-host syncs while building
# --------------------------------------------------------------------------------------------------------


DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _replayable(run_conv, like: torch.Tensor):
    """(replay, out): on CUDA a graph of run_conv() (a conv on captured metadata, returning its output), captured
    after a warm-up on a side stream (capture rows sit on the NULL slot and change nothing), and the graph's
    output; on CPU, replay() calls run_conv again into `out` (zeros like `like`), which is exactly what a graph
    replay re-executes."""
    if like.device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run_conv()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run_conv()
        return graph.replay, out
    out = torch.zeros_like(like)

    def replay() -> None:
        out.copy_(run_conv())

    return replay, out


@pytest.mark.parametrize("device", DEVICES)
def test_full_graph_replay_matches_eager_for_padded_uniform_spec_batches(device):
    """Capture short_conv once on the capture metadata; each later build rewrites the persistent buffers in
    place, so replays of uniform batches (every real row verifying k + 1 tokens, as every full-graph batch of
    the engine does) with fewer real rows than captured equal eager runs on fresh metadata, padded tokens get
    zeros, and padded rows touch no state.

    On CUDA the replay is a real graph replay; on CPU it is the call made at capture time again — the captured
    metadata object (its CPU ints frozen at capture, its device buffers rewritten by each build) — which is
    exactly what a replay re-executes."""
    dev = torch.device(device)
    k, width, dim, max_rows = 3, 4, 8, 4
    max_tokens = max_rows * (k + 1)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(dim, width, generator=gen).to(dev)
    bias = torch.randn(dim, generator=gen).to(dev)
    state = torch.randn(9, dim, width - 1 + k, generator=gen).to(dev)
    builder = _builder(k, full=True, max_num_seqs=8, device=dev)
    x_buf = torch.zeros(max_tokens, dim, device=dev)
    captured = builder.build_for_cudagraph_capture(num_reqs=max_rows, num_tokens=max_tokens)
    null_before = state[NULL_BLOCK_ID].clone()
    replay, out_buf = _replayable(lambda: short_conv(x_buf, weight, bias, state, captured), x_buf)

    q = k + 1
    batches = [_pure_spec(k, [q] * 3, [3, 1, 7], [1, 4, 2]), _pure_spec(k, [q] * 4, [2, 5, 6, 8], [3, 3, 1, 4]),
               _pure_spec(k, [q], [1], [2])]
    for b in batches:
        eager_state = state.clone()
        x = torch.randn(b.num_tokens, dim, generator=gen).to(dev)
        b.build(builder, num_reqs_padded=max_rows, num_tokens_padded=max_tokens)
        x_buf.fill_(math.nan)  # padded tokens hold anything
        x_buf[: b.num_tokens].copy_(x)
        replay()
        eager = short_conv(x, weight, bias, eager_state, b.build(_builder(k, device=dev)))
        torch.testing.assert_close(out_buf[: b.num_tokens], eager)
        assert torch.equal(out_buf[b.num_tokens:], torch.zeros_like(out_buf[b.num_tokens:]))
        torch.testing.assert_close(state, eager_state)
    assert torch.equal(state[NULL_BLOCK_ID], null_before)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_building_never_syncs_with_the_device():
    dev = torch.device("cuda")
    builder = ShortConvMetadataBuilder(num_spec_tokens=3, use_full_cuda_graph=True, max_num_seqs=8,
                                       max_capture_size=None, device=dev)
    mixed = Batch(3, ["decode", "spec", "prefill", "spec"], [1, 4, 5, 2], [3, 9, 0, 4], [-1, 3, -1, 1],
                  [1, 2, 1, 4], [4, 1, 3, 2])
    pure = _pure_spec(3, [4, 2, 3], [1, 2, 3], [1, 4, 2])
    builder.build_for_cudagraph_capture(num_reqs=4, num_tokens=16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        metas = [mixed.build(builder), pure.build(builder, num_reqs_padded=4, num_tokens_padded=16)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu_metas = [mixed.build(_builder(3)), pure.build(_builder(3, full=True, max_num_seqs=8), num_reqs_padded=4,
                                                      num_tokens_padded=16)]
    for meta, ref in zip(metas, cpu_metas):
        for name, value in vars(ref).items():
            got = getattr(meta, name)
            if isinstance(value, torch.Tensor):
                assert got.device.type == "cuda" and torch.equal(got.cpu(), value), name
            else:
                assert got == value, name


@st.composite
def prompt_runs(draw):
    lookahead = draw(st.integers(0, 1))  # a draft's region ends with one uncommitted token
    graph_tokens = draw(st.integers(1 + lookahead, 12))
    return {"width": draw(st.integers(2, 5)), "k": draw(st.integers(0, 4)), "graph_tokens": graph_tokens,
            "lookahead": lookahead,
            "chunks": draw(st.lists(st.integers(1 + lookahead, graph_tokens), min_size=1, max_size=4)),
            "seed": draw(st.integers(0, 2**20))}


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(run=prompt_runs())
def test_prompt_graph_replays_match_the_committed_stream(device, run):
    """A prompt-prefill graph of N tokens (`build_for_prompt_capture`, captured once) replayed for a request's
    chunks of 1..N tokens (`load_prompt_row` before each; padding after the chunk holds NaN): each real token's
    output is the conv of the committed stream plus the chunk, the padding gives zeros, and the slot's window
    ends at the last committed input (with a lookahead of L, the chunk's last L inputs are not committed and
    follow the window); no other slot changes. On CUDA a real graph replay, on CPU the captured call again."""
    dev = torch.device(device)
    width, n, lookahead = run["width"], run["graph_tokens"], run["lookahead"]
    gen = torch.Generator().manual_seed(run["seed"])
    weight = torch.randn(DIM, width, generator=gen, dtype=torch.float64).to(dev)
    bias = torch.randn(DIM, generator=gen, dtype=torch.float64).to(dev)
    state = torch.randn(4, DIM, width - 1 + run["k"] + 1, generator=gen, dtype=torch.float64).to(dev)
    slot = 2
    builder = _builder(run["k"] + 1, full=True, max_num_seqs=3, device=dev)
    captured = builder.build_for_prompt_capture(num_tokens=n, state_lookahead=lookahead)
    x_buf = torch.zeros(n, DIM, dtype=torch.float64, device=dev)
    untouched = [s for s in range(state.shape[0]) if s != slot]
    before = state[untouched].clone()
    replay, out_buf = _replayable(lambda: short_conv(x_buf, weight, bias, state, captured), x_buf)

    committed = torch.zeros(0, DIM, dtype=torch.float64)
    for q in run["chunks"]:
        chunk = torch.randn(q, DIM, generator=gen, dtype=torch.float64)
        builder.load_prompt_row(query_len=q, num_tokens_padded=n, num_computed_tokens=committed.shape[0],
                                state_index=slot)
        x_buf.fill_(math.nan)
        x_buf[:q].copy_(chunk)
        replay()
        out = out_buf.cpu()
        torch.testing.assert_close(out[:q], conv_of_appended(committed, chunk, weight.cpu(), bias.cpu()))
        assert torch.equal(out[q:], torch.zeros_like(out[q:]))
        committed = torch.cat([committed, chunk[: q - lookahead]])
        window = state[slot].cpu()
        torch.testing.assert_close(window[:, : width - 1], last_window(committed, width))
        if lookahead:
            torch.testing.assert_close(window[:, width - 1 : width - 1 + lookahead], chunk[q - lookahead:].T)
        assert torch.equal(state[untouched], before)


def test_prompt_rows_outside_the_graph_are_refused():
    builder = _builder(2, full=True)
    builder.build_for_prompt_capture(num_tokens=8)
    with pytest.raises(ValueError, match="12 tokens does not fit a prompt graph of 8 tokens"):
        builder.load_prompt_row(query_len=12, num_tokens_padded=8, num_computed_tokens=0, state_index=1)
    with pytest.raises(ValueError, match="conv slot > NULL_BLOCK_ID"):
        builder.load_prompt_row(query_len=3, num_tokens_padded=8, num_computed_tokens=0, state_index=NULL_BLOCK_ID)
    with pytest.raises(ValueError, match="num_tokens >= 1"):
        builder.build_for_prompt_capture(num_tokens=0)
