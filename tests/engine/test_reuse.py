"""One engine for several sweep points (`specexp.engine.reuse`): an engine of K = 4 that also captured k = 2 serves,
after `use_static_depth(2)`, the tokens and acceptance of an engine built at k = 2, replays only captured graphs,
counts afresh after `reset_counters`, and reports the graph figures of the depth it serves."""

from __future__ import annotations

import pytest
import torch
from pairs import random_prompts

from specexp.engine.config import EngineConfig, EngineConfigError, SamplingConfig, SpeculatorConfig
from specexp.engine.reuse import depth_graph_summary
from specexp.engine.runner import NativeEngine
from specexp.models import load_model

PROMPT_LENS = [3, 11, 6, 17, 1, 9, 14, 2, 7, 20]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(PROMPT_LENS, seed=11)


def _engine(target, draft, k: int, serve_depths=(), mode="full"):
    return NativeEngine(
        target, draft,
        EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, max_num_batched_tokens=16, cudagraph_mode=mode,
                     cudagraph_prefill_tokens=(8, 16) if mode == "full" else ()),
        SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode=mode),
        SamplingConfig(temperature=0.0, max_new_tokens=10, ignore_eos=False),
        eos_token_ids=[2], emulate_graphs_on_cpu=True, serve_depths=serve_depths,
    )


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
def test_a_reused_engine_serves_each_depth_as_an_engine_built_at_it(pair_dirs, prompts, pair):
    target, draft = (load_model(d) for d in pair_dirs[pair])
    shared = _engine(target, draft, 4, serve_depths=(2, 3))
    for k in (2, 4, 3, 2):  # back and forth: nothing of an earlier depth leaks into the next
        own = _engine(target, draft, k).generate(prompts, max_concurrency=3)
        shared.use_static_depth(k)
        shared.reset_counters()
        out = shared.generate(prompts, max_concurrency=3)
        assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in own.requests], k
        assert [r.verifies for r in out.requests] == [r.verifies for r in own.requests], k
        assert {s.num_speculative_tokens for s in out.steps if s.num_drafts} == {k}
        summary = shared.graph_summary()
        assert summary["served_depth"] == k
        decode = summary["managers"]["draft_decode"]
        assert decode["num_replays"] == len(out.steps)  # every step drafts k >= 2, in one decode graph
        assert decode["num_eager"] == 0 and not decode["num_eager_uncaptured"]
        prompts_only = sum(1 for s in out.steps if s.num_prefill_tokens == s.num_tokens and s.num_reqs > 1)
        assert summary["prompt_batches_graphed"] == prompts_only > 0  # this run's, counters reset
        assert summary["managers"]["target_verify"]["num_eager"] == 0


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
def test_k0_on_an_engine_with_a_draft_runs_as_an_engine_without_one(pair_dirs, prompts, pair, monkeypatch):
    """Static depth 0 on a K = 3 engine: the draft never runs, plain decoding's lookahead is on, the tokens and
    steps are those of the K = 0 engine, and the figures are the target's alone; back at k = 3 the draft serves
    as before (the k = 0 run left nothing in its way)."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    plain = _engine(target, None, 0)
    shared = _engine(target, draft, 3, serve_depths=(0,))
    drafted = _engine(target, draft, 3).generate(prompts, max_concurrency=3)
    own = plain.generate(prompts, max_concurrency=3)
    shared.use_static_depth(0)
    assert shared.lookahead and not shared.drafting
    propose = shared.speculator.propose
    monkeypatch.setattr(shared.speculator, "propose", lambda *a, **kw: pytest.fail("the draft ran at k = 0"))
    shared.reset_counters()
    out = shared.generate(prompts, max_concurrency=3)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in own.requests]
    assert [(s.num_reqs, s.num_tokens, s.num_drafts) for s in out.steps] == [
        (s.num_reqs, s.num_tokens, s.num_drafts) for s in own.steps]
    summary = shared.graph_summary()
    assert set(summary["managers"]) == set(plain.graph_summary()["managers"])  # no draft manager
    assert summary["managers"]["target_verify"]["num_eager"] == 0
    monkeypatch.setattr(shared.speculator, "propose", propose)
    shared.use_static_depth(3)
    assert shared.drafting and not shared.lookahead
    again = shared.generate(prompts, max_concurrency=3)
    assert [r.output_token_ids for r in again.requests] == [r.output_token_ids for r in drafted.requests]
    assert [r.verifies for r in again.requests] == [r.verifies for r in drafted.requests]
    assert again.persistent_buffer_bytes > out.persistent_buffer_bytes  # k = 0 reported the target's buffers only


def test_depths_not_captured_are_refused_with_one_line(pair_dirs):
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])
    with pytest.raises(EngineConfigError, match=r"serve_depths: k=5 is not in 0..4"):
        _engine(target, draft, 4, serve_depths=(2, 5))
    engine = _engine(target, draft, 4, serve_depths=(2,))
    with pytest.raises(EngineConfigError, match=r"use_static_depth\(3\): .*k in \[2, 4\]"):
        engine.use_static_depth(3)


def test_reseed_restarts_sampling(pair_dirs, prompts):
    """At temperature 1, the same seed gives the same tokens run after run on one engine."""
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])
    engine = NativeEngine(target, draft, EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4),
                          SpeculatorConfig(num_speculative_tokens=3),
                          SamplingConfig(temperature=1.0, max_new_tokens=8, ignore_eos=True))
    runs = []
    for _ in range(2):
        engine.reseed(5)
        runs.append([r.output_token_ids for r in engine.generate(prompts).requests])
    assert runs[0] == runs[1]
    assert runs[0] != [r.output_token_ids for r in engine.generate(prompts).requests]  # no reseed: moves on


def test_a_paused_run_resumes_with_its_own_random_state_and_counters(pair_dirs, prompts):
    """What a sweep in rounds does between two repeats of one point: save its random state and counters, serve
    another point, put them back. The next run samples the tokens it would have sampled alone, and the counters
    go on from where they were."""
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])

    def engine():
        return NativeEngine(target, draft, EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4,
                                                        cudagraph_mode="full"),
                            SpeculatorConfig(num_speculative_tokens=3, cudagraph_mode="full"),
                            SamplingConfig(temperature=1.0, max_new_tokens=8, ignore_eos=True),
                            emulate_graphs_on_cpu=True, serve_depths=(2,))

    alone, shared = engine(), engine()
    for e in (alone, shared):
        e.reseed(5)
        e.generate(prompts)
    expected = [r.output_token_ids for r in alone.generate(prompts).requests]
    expected_counts = alone.counter_state()
    rng, counts = shared.rng_state(), shared.counter_state()
    shared.use_static_depth(2)
    shared.reset_counters()
    shared.generate(prompts)  # another point, in between
    shared.use_static_depth(3)
    shared.set_rng_state(rng)
    shared.restore_counters(counts)
    assert [r.output_token_ids for r in shared.generate(prompts).requests] == expected
    assert shared.counter_state() == expected_counts
    assert shared.counter_state()[0][0]["num_replays"] > 0


def test_the_graph_figures_are_those_of_the_served_depth():
    """Per-k managers keep their records of the served k, k-independent ones all theirs; the totals are summed
    from what is kept, the whole capture's figure kept beside them."""
    def record(k, nbytes, s, first=0.0, compiled=False):
        return {"num_speculative_tokens": k, "capture_bytes": nbytes, "capture_s": s, "first_run_s": first,
                "compiled": compiled}

    summary = {"graph_capture_bytes": 1000, "graph_capture_s": 9.0, "managers": {
        "target_verify": {"per_k": True, "per_size": [record(2, 100, 1.0, 4.0), record(4, 200, 2.0, 8.0),
                                                      record(2, 10, 0.5, 0.125)]},
        "target_prefill_16": {"per_k": False, "per_size": [record(0, 50, 0.25, 0.5)]},
        "draft_prefill": {"per_k": True, "per_size": [record(2, 0, 16.0, 0.0625, compiled=True)]},
    }}
    cut = depth_graph_summary(summary, 2)
    assert cut["managers"]["target_verify"]["per_size"] == [record(2, 100, 1.0, 4.0), record(2, 10, 0.5, 0.125)]
    assert cut["managers"]["target_prefill_16"]["capture_bytes"] == 50
    # seconds: first runs and captures (a CPU-compiled key's capture is its compile); compiling: the first runs and
    # the CPU's compile
    assert (cut["graph_capture_bytes"], cut["graph_capture_s"]) == (160, 1.75 + 4.625 + 16.0625)
    assert cut["graph_compile_s"] == 4.625 + 16.0625
    assert cut["managers"]["target_verify"]["compile_s"] == 4.125
    assert cut["engine_graph_capture_bytes"] == 1000 and cut["served_depth"] == 2


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_engines_capturing_different_graphs_sample_alike(pair_dirs, prompts, device):
    """A new engine serves from engine.seed whatever its start-up drew: one built at K = 4 that also captured
    k = 2, switched to k = 2, samples at T = 1 the tokens of an engine built at k = 2 (no reseed by the caller), as
    each point of a reused sweep and an isolated job must. Their captures ran different graphs."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    target, draft = (load_model(d, device=device) for d in pair_dirs["lfm2+llama"])

    def engine(k: int, serve_depths=()):
        return NativeEngine(target, draft, EngineConfig(device=device, max_num_seqs=4, max_model_len=64, block_size=4,
                                                        cudagraph_mode="full", seed=7),
                            SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode="full"),
                            SamplingConfig(temperature=1.0, max_new_tokens=8, ignore_eos=True),
                            emulate_graphs_on_cpu=device == "cpu", serve_depths=serve_depths)

    own = [r.output_token_ids for r in engine(2).generate(prompts, max_concurrency=3).requests]
    shared = engine(4, serve_depths=(2,))
    shared.use_static_depth(2)
    assert [r.output_token_ids for r in shared.generate(prompts, max_concurrency=3).requests] == own
