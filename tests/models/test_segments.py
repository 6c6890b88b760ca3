"""Segmented forwards (`specexp.models.segments`): one forward over parts that each carry their own metadata gives
every token what running the parts as separate forwards gives it, on every model case (attention-only, hybrid,
conv-only), and badly laid-out segments are refused."""

from __future__ import annotations

import pytest
import torch
from harness import PagedRunner
from test_against_transformers import random_tokens

from specexp.models import load_model
from specexp.models.metadata import ForwardContext, Segment
from specexp.models.segments import check_segments


def test_segments_must_tile_the_batch_in_order():
    check_segments([Segment(0, 3, None, None), Segment(3, 5, None, None)], 8)
    with pytest.raises(ValueError, match="follows token 3"):
        check_segments([Segment(0, 3, None, None), Segment(4, 4, None, None)], 8)
    with pytest.raises(ValueError, match="cover 8 tokens of a batch of 9"):
        check_segments([Segment(0, 3, None, None), Segment(3, 5, None, None)], 9)
    with pytest.raises(ValueError, match="of 0 tokens"):
        check_segments([Segment(0, 0, None, None)], 0)


@torch.no_grad()
def test_a_segmented_forward_equals_its_segments_run_alone(case):
    """History: prompts of a (7 tokens) and b (5). Then segment 0 decodes a and b (plus padding: one row that owns
    no token, two padded tokens), segment 1 prefills a new prompt c (6 tokens, then 2 padded tokens); one forward
    over both equals the two steps run one after the other, on a second runner with the same history."""
    model = load_model(case.path)
    seqs = {name: random_tokens(40 + i, 9, 320) for i, name in enumerate("abc")}
    joined_runner, alone_runner = PagedRunner(model), PagedRunner(model)
    for runner in (joined_runner, alone_runner):
        runner.step([("a", seqs["a"][:7]), ("b", seqs["b"][:5])])
    decode = [("a", seqs["a"][7:8]), ("b", seqs["b"][5:6])]
    prefill = [("c", seqs["c"][:6])]
    pad_decode = dict(pad_rows=1, pad_tokens=2, max_seq_len=24)
    pad_prefill = dict(pad_tokens=2, max_seq_len=24)
    alone = {**alone_runner.step(decode, **pad_decode), **alone_runner.step(prefill, **pad_prefill)}

    first = joined_runner.prepare(decode, **pad_decode)
    second = joined_runner.prepare(prefill, **pad_prefill)
    n0, n1 = first.input_ids.numel(), second.input_ids.numel()
    ctx = ForwardContext(None, None, kv_caches=joined_runner.kv_caches, conv_states=joined_runner.conv_states,
                         segments=[Segment(0, n0, first.ctx.attn, first.ctx.conv),
                                   Segment(n0, n1, second.ctx.attn, second.ctx.conv)])
    hidden = model(torch.cat([first.input_ids, second.input_ids]), torch.cat([first.positions, second.positions]),
                   ctx)
    logits = model.compute_logits(hidden)
    joined = {"a": logits[0:1], "b": logits[1:2], "c": logits[n0 : n0 + 6]}
    for rid in "abc":
        err = (joined[rid] - alone[rid]).abs().max().item()
        assert err <= 1e-5, f"{case.id}: {rid}'s logits moved by {err:.2e} in a segmented forward"
