"""Requests arriving over time: the gate releases each at its arrival or when a concurrency slot frees, the
engine admits it into the running batch, latencies count from arrival, and greedy speculation stays lossless
under every arrival process."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pairs import VOCAB, build_pairs

from specexp.engine.arrivals import ArrivalGate
from specexp.engine.cache_pool import IdPool, blocks_needed
from specexp.engine.config import EngineConfig, EngineConfigError, SamplingConfig, SpeculatorConfig
from specexp.engine.request import Request
from specexp.engine.runner import NativeEngine
from specexp.engine.scheduler import Scheduler
from specexp.models import load_model
from specexp.workloads.arrivals import poisson_offsets

MAX_NEW = 8
PROMPT_LENS = [3, 9, 5, 12, 2, 7]


def _drive(requests, offsets, cap, max_num_seqs, k, data):
    """Serve `requests` through a gate and a scheduler on a simulated clock (no model): each step takes a
    drawn time, accepts a drawn number of drafts per row and finishes requests at max_new_tokens. Returns, per
    step, (requests pending before its release, requests in flight after it)."""
    block_size, max_model_len = 4, 64
    pool = IdPool(max_num_seqs * blocks_needed(max_model_len + 2 * k + 1, block_size))
    sched = Scheduler(max_num_seqs=max_num_seqs, max_model_len=max_model_len, token_budget=32, block_size=block_size,
                      num_spec_tokens=k, block_pool=pool, slot_pool=IdPool(max_num_seqs))
    gate = ArrivalGate(requests, offsets, cap)
    now, record = 0.0, []
    for _ in range(5000):
        pending = gate.num_pending
        released = gate.release(now)
        for request in released:
            assert request.arrival_s <= now
            sched.add(request)
        record.append((pending, gate.num_in_flight, released))
        if not sched.has_work:
            if not gate.num_pending:
                break
            now = max(now, gate.next_arrival_s())
            continue
        batch = sched.schedule()
        for row in batch.rows:
            if row.request.scheduled_s is None:
                row.request.scheduled_s = now
        now += data.draw(st.floats(0.001, 0.05))
        for row in batch.rows:
            req = row.request
            if row.is_prefill:
                req.num_computed_tokens += row.num_query_tokens
                if not row.samples:
                    continue
                emitted = 1
            else:
                accepted = data.draw(st.integers(0, row.num_draft_tokens))
                req.num_computed_tokens += accepted + 1
                emitted = accepted + 1
            req.token_ids.extend([7] * emitted)
            req.num_pending_drafts = k
            if req.num_output_tokens >= req.max_new_tokens:
                req.finished, req.finish_s = True, now
                sched.finish(req)
    assert not gate.num_pending and not sched.has_work
    return record


@settings(max_examples=80, deadline=None)
@given(num_requests=st.integers(1, 12), cap=st.integers(1, 6), max_num_seqs=st.integers(1, 6), k=st.integers(0, 3),
       data=st.data())
def test_closed_loop_keeps_exactly_n_requests_in_flight_while_requests_remain(num_requests, cap, max_num_seqs, k,
                                                                               data):
    requests = [Request(i, [1] * data.draw(st.integers(1, 20)), data.draw(st.integers(1, 6)))
                for i in range(num_requests)]
    record = _drive(requests, None, cap, max_num_seqs, k, data)
    for step, (pending, in_flight, released) in enumerate(record):
        still_pending = pending - len(released)
        assert in_flight <= cap
        if still_pending > 0:
            assert in_flight == cap, f"step {step}: {in_flight} in flight with {still_pending} requests waiting"
    by_arrival = sorted(requests, key=lambda r: r.arrival_s)
    assert [r.request_id for r in by_arrival] == list(range(num_requests)), "a closed loop keeps the order"
    finishes = sorted(r.finish_s for r in requests)
    for i, request in enumerate(by_arrival[cap:]):
        assert request.arrival_s == finishes[i], "each arrival takes the slot of the i-th request to finish"


@settings(max_examples=60, deadline=None)
@given(offsets=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=10), max_num_seqs=st.integers(1, 4),
       k=st.integers(0, 3), data=st.data())
def test_open_loop_requests_arrive_at_their_offsets_and_run_after_them(offsets, max_num_seqs, k, data):
    requests = [Request(i, [1] * 4, data.draw(st.integers(1, 5))) for i in range(len(offsets))]
    _drive(requests, offsets, None, max_num_seqs, k, data)
    for request, offset in zip(requests, offsets, strict=True):
        assert request.arrival_s == offset
        assert request.scheduled_s >= request.arrival_s


def test_gate_refuses_bad_arrival_times():
    requests = [Request(0, [1], 1), Request(1, [1], 1)]
    with pytest.raises(EngineConfigError, match="2 requests"):
        ArrivalGate(requests, [0.0])
    with pytest.raises(EngineConfigError, match="-1.0"):
        ArrivalGate(requests, [0.0, -1.0])
    with pytest.raises(EngineConfigError, match="max_concurrency=0"):
        ArrivalGate(requests, None, 0)


# ---------------------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, draft_dir = build_pairs(tmp_path_factory.mktemp("pairs"))["lfm2+lfm2"]
    return load_model(target_dir), load_model(draft_dir)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _engine(pair, k, max_num_seqs=4, lookahead=True):
    target, draft = pair
    return NativeEngine(target, draft if k else None,
                        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, block_size=4,
                                     plain_decode_lookahead=lookahead),
                        SpeculatorConfig(num_speculative_tokens=k),
                        SamplingConfig(max_new_tokens=MAX_NEW, ignore_eos=True), eos_token_ids=[2])


@pytest.fixture(scope="module")
def greedy_reference(pair, prompts):
    """The target alone, one request at a time (lossless against transformers: test_native_engine)."""
    return [r.output_token_ids for r in _engine(pair, 0, max_num_seqs=1).generate(prompts).requests]


ARRIVALS = {
    "burst": {},
    "poisson": {"arrival_s": poisson_offsets(len(PROMPT_LENS), 400.0, seed=1)},
    "concurrency": {"max_concurrency": 2},
    "trace": {"arrival_s": [0.03, 0.0, 0.06, 0.0, 0.01, 0.045]},
    "capped poisson": {"arrival_s": poisson_offsets(len(PROMPT_LENS), 400.0, seed=2), "max_concurrency": 3},
}


@pytest.mark.parametrize("arrival", sorted(ARRIVALS))
@pytest.mark.parametrize("k", [0, 3])
def test_greedy_speculation_is_lossless_under_every_arrival_process(pair, prompts, greedy_reference, arrival, k):
    out = _engine(pair, k).generate(prompts, **ARRIVALS[arrival])
    assert [r.output_token_ids for r in out.requests] == greedy_reference
    offsets = ARRIVALS[arrival].get("arrival_s")
    for i, request in enumerate(out.requests):
        assert request.arrival_s >= (offsets[i] if offsets else 0.0)
        assert request.arrival_s <= request.scheduled_s <= request.first_token_s <= request.finish_s


def test_engine_keeps_the_concurrency_in_flight_and_records_it_per_step(pair, prompts):
    cap = 3
    out = _engine(pair, 2).generate(prompts, max_concurrency=cap)
    in_flight = [s.num_in_flight for s in out.steps]
    assert in_flight[0] == cap and max(in_flight) == cap
    first_drop = next((i for i, n in enumerate(in_flight) if n < cap), len(in_flight))
    assert all(a >= b for a, b in zip(in_flight[first_drop:], in_flight[first_drop + 1:]))
    assert all(s.num_waiting <= s.num_in_flight for s in out.steps)


def test_ttft_counts_from_arrival_not_from_the_run_start(pair, prompts):
    """A request arriving while the engine is idle starts at its arrival; its latencies count from there."""
    from specexp.engine.stats import request_latency

    late_s = 0.4
    offsets = [0.0] * (len(prompts) - 1) + [late_s]
    out = _engine(pair, 3).generate(prompts, arrival_s=offsets)
    late = out.requests[-1]
    assert late.arrival_s == late_s
    latency = request_latency(late.arrival_s, late.first_token_s, late.finish_s, late.num_output_tokens,
                              scheduled_s=late.scheduled_s)
    assert latency["ttft_ms"] == pytest.approx((late.first_token_s - late_s) * 1e3)
    assert latency["queue_ms"] == pytest.approx((late.scheduled_s - late_s) * 1e3)
    assert 0 <= latency["queue_ms"] <= latency["ttft_ms"] < late.first_token_s * 1e3
