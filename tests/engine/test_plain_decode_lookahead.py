"""Plain decoding (k = 0) with `engine.plain_decode_lookahead`: each step is queued before the last one's tokens
are read back. Whatever the batch does (requests stopping at EOS, at max_new_tokens or max_model_len, prompts
prefilled in chunks, new requests taking freed blocks and conv slots), the tokens, finish reasons and step
accounting are those of the engine that reads every step back before the next."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pairs import VOCAB, build_pairs

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.runner import NativeEngine
from specexp.models import load_model


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    dirs = build_pairs(tmp_path_factory.mktemp("pairs"))
    return {"lfm2": load_model(dirs["lfm2+lfm2"][0]), "llama": load_model(dirs["llama+llama"][0])}


def _generate(target, prompts, lookahead, *, max_num_seqs, max_new, eos, budget=None, max_model_len=48,
              graphs=False, temperature=0.0):
    engine = NativeEngine(
        target, None,
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=4,
                     max_num_batched_tokens=budget, plain_decode_lookahead=lookahead,
                     num_kv_blocks=max_num_seqs * 13, cudagraph_mode="full" if graphs else "none",
                     cudagraph_capture_sizes=(2, 4) if graphs else None),
        SpeculatorConfig(num_speculative_tokens=0),
        SamplingConfig(temperature=temperature, max_new_tokens=max_new, ignore_eos=False),
        eos_token_ids=eos, emulate_graphs_on_cpu=graphs,
    )
    assert engine.lookahead == lookahead
    return engine, engine.generate(prompts)


def _check_same(target, prompts, **kw):
    _, base = _generate(target, prompts, False, **kw)
    engine, ahead = _generate(target, prompts, True, **kw)
    assert [r.output_token_ids for r in ahead.requests] == [r.output_token_ids for r in base.requests]
    assert [r.finish_reason for r in ahead.requests] == [r.finish_reason for r in base.requests]
    assert all(r.finished and r.first_token_s is not None and r.finish_s is not None for r in ahead.requests)
    assert all(r.pending_token_row == -1 for r in ahead.requests)
    assert [r.emitted_per_step for r in ahead.requests] == [r.emitted_per_step for r in base.requests]
    # every emitted token is counted once, by the step that emitted it; a step discards a stopped request's row
    assert sum(s.num_output_tokens for s in ahead.steps) == sum(len(r.output_token_ids) for r in ahead.requests)
    assert len(ahead.steps) >= len(base.steps)
    # every block and conv slot is back in its pool
    scheduler = engine.scheduler
    assert scheduler.block_pool.num_free == scheduler.block_pool.capacity
    assert scheduler.slot_pool.num_free == scheduler.slot_pool.capacity
    return base, ahead


@pytest.mark.parametrize("arch", ["lfm2", "llama"])
@pytest.mark.parametrize("max_num_seqs,budget", [(1, None), (3, 7), (8, None)])
def test_lookahead_matches_the_read_back_engine_with_eos_stops(targets, arch, max_num_seqs, budget):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 1, 12, 7, 3, 20, 9)]
    _, ahead = _check_same(targets[arch], prompts, max_num_seqs=max_num_seqs, max_new=14, eos=[2],
                              budget=budget)
    reasons = {r.finish_reason for r in ahead.requests}
    assert "eos" in reasons and "length" in reasons  # both kinds of stop happen in this batch


def test_lookahead_stops_at_max_model_len(targets):
    prompts = [[4, 6, 8] * 5, [9] * 40, [3, 7]]
    _, ahead = _check_same(targets["llama"], prompts, max_num_seqs=2, max_new=30, eos=[], max_model_len=44)
    assert [r.finish_reason for r in ahead.requests] == ["max_model_len", "max_model_len", "length"]


@pytest.mark.parametrize("arch", ["lfm2", "llama"])
def test_lookahead_with_graph_replays_matches(targets, arch):
    """Emulated full graphs (padded replays through the persistent buffers) with the device-side token gather."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (4, 9, 2, 15, 6)]
    _check_same(targets[arch], prompts, max_num_seqs=4, max_new=12, eos=[2, 5, 11], graphs=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lookahead_property(targets, data):
    arch = data.draw(st.sampled_from(["lfm2", "llama"]))
    lens = data.draw(st.lists(st.integers(1, 16), min_size=1, max_size=6))
    prompts = [data.draw(st.lists(st.integers(3, VOCAB - 1), min_size=n, max_size=n)) for n in lens]
    eos = data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=4, unique=True))
    _check_same(targets[arch], prompts, max_num_seqs=data.draw(st.integers(1, 4)),
                max_new=data.draw(st.integers(1, 12)), eos=eos,
                budget=data.draw(st.sampled_from([None, 3, 8])))


def test_sampling_with_lookahead(targets):
    """Temperature sampling: without EOS stops every step draws for the same rows, so the tokens are the read-back
    engine's; with them a stopped request's discarded row still draws, so the streams part, but a seed still
    fixes the lookahead engine's tokens."""
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (6, 3, 10)]
    _check_same(targets["lfm2"], prompts, max_num_seqs=3, max_new=10, eos=[], temperature=1.0)
    runs = [_generate(targets["lfm2"], prompts, True, max_num_seqs=3, max_new=10, eos=[2], temperature=1.0)[1]
            for _ in range(2)]
    assert [r.output_token_ids for r in runs[0].requests] == [r.output_token_ids for r in runs[1].requests]
