"""The engine's progress events: what a caller's callback receives while graphs are captured and requests run."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.progress import CAPTURE, RUN, ProgressEvent, RunReporter
from specexp.engine.runner import NativeEngine
from specexp.models import load_model

NUM_PROMPTS = 5


@pytest.fixture(scope="module")
def models(tiny_lfm2_dir, tiny_lfm2_draft_dir):
    return load_model(tiny_lfm2_dir), load_model(tiny_lfm2_draft_dir)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (4, 9, 2, 13, 6)]


def _engine(models, k, max_num_seqs, progress=None, lookahead=True, graphs=False):
    target, draft = models
    return NativeEngine(
        target, draft,
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, block_size=4, plain_decode_lookahead=lookahead,
                     cudagraph_mode="full" if graphs else "none", cudagraph_capture_sizes=(1, 2) if graphs else None),
        SpeculatorConfig(num_speculative_tokens=k),
        # different lengths, so requests finish at different steps
        SamplingConfig(max_new_tokens=12, ignore_eos=True),
        eos_token_ids=[2], emulate_graphs_on_cpu=graphs, progress=progress,
    )


def _check_run_events(events: list[ProgressEvent], total: int, output_tokens: int) -> None:
    assert events and all(e.phase == RUN and e.total == total for e in events)
    assert (events[0].done, events[0].output_tokens) == (0, 0)
    for before, after in itertools.pairwise(events):
        assert before.done <= after.done and before.output_tokens <= after.output_tokens
        assert before.elapsed_s <= after.elapsed_s
    assert (events[-1].done, events[-1].output_tokens) == (total, output_tokens)
    assert [e.done for e in events].count(total) == 1, "the run ends with one event at done == total"


@pytest.mark.parametrize("k,lookahead", [(0, True), (0, False), (3, True)], ids=["k0-lookahead", "k0", "k3"])
def test_run_events_count_finished_requests_up_to_the_total(models, prompts, k, lookahead):
    engine = _engine(models, k, max_num_seqs=2, lookahead=lookahead)
    events: list[ProgressEvent] = []
    out = engine.generate(prompts, max_new_tokens=None, progress=events.append)
    _check_run_events(events, NUM_PROMPTS, sum(len(r.output_token_ids) for r in out.requests))
    assert sum(s.num_output_tokens for s in out.steps) == events[-1].output_tokens


def test_one_request_at_a_time_reports_every_finish(models, prompts):
    engine = _engine(models, 2, max_num_seqs=1)
    events: list[ProgressEvent] = []
    out = engine.generate(prompts, progress=events.append)
    _check_run_events(events, NUM_PROMPTS, sum(len(r.output_token_ids) for r in out.requests))
    assert sorted({e.done for e in events}) == list(range(NUM_PROMPTS + 1))


def test_a_run_without_a_callback_reports_nothing_and_the_next_run_starts_at_zero(models, prompts):
    engine = _engine(models, 2, max_num_seqs=4)
    engine.generate(prompts[:2])  # no callback: a warm-up
    events: list[ProgressEvent] = []
    out = engine.generate(prompts, progress=events.append)
    _check_run_events(events, NUM_PROMPTS, sum(len(r.output_token_ids) for r in out.requests))


def test_capture_events_count_every_graph_once(models):
    events: list[ProgressEvent] = []
    engine = _engine(models, 2, max_num_seqs=2, progress=events.append, graphs=True)
    total = sum(m.num_graphs_to_capture for m in engine.graph_managers())
    assert total == sum(len(m.graphs) for m in engine.graph_managers()) > 0
    assert all(e.phase == CAPTURE and e.total == total for e in events)
    assert [e.done for e in events] == list(range(total + 1))
    assert all(e.label for e in events[1:]) and len({e.label for e in events[1:]}) == total
    assert all(a.elapsed_s <= b.elapsed_s for a, b in itertools.pairwise(events))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.floats(0.0, 0.4)), max_size=40),
       st.floats(0.01, 1.0))
def test_run_reporter_sends_every_finish_and_throttles_the_rest(steps, interval_s):
    """Per step: requests finished, tokens emitted, seconds passed. Every change of `done` is sent; without one,
    at most one event per interval, and only when tokens were emitted; the last event says done == total."""
    total = sum(finished for finished, _, _ in steps)
    sent: list[ProgressEvent] = []
    reporter = RunReporter(sent.append, total, t0=100.0, interval_s=interval_s)
    now, done, tokens = 100.0, 0, 0
    reporter.update(0, 0, now)
    for finished, emitted, dt in steps:
        now, done, tokens = now + dt, done + finished, tokens + emitted
        before = len(sent)
        reporter.update(done, tokens, now)
        if finished:
            assert len(sent) == before + 1 and sent[-1].done == done
    reporter.finish(tokens)
    assert sent[0].done == 0 and sent[-1].done == total and sent[-1].output_tokens == tokens
    assert all(a.done <= b.done and a.output_tokens <= b.output_tokens for a, b in itertools.pairwise(sent))
    same_done = [(a, b) for a, b in itertools.pairwise(sent) if a.done == b.done and b is not sent[-1]]
    assert all(b.output_tokens > a.output_tokens and b.elapsed_s - a.elapsed_s >= interval_s - 1e-9
               for a, b in same_done)
