"""traces.parquet: one row per (request, step), from which every acceptance counter of result.json is
recomputed exactly, whatever the workload, depth, batch, chunking and arrivals."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pairs import VOCAB, build_pairs

from specexp.analysis.traces import acceptance_from_traces, load_traces
from specexp.backends.native import to_run_result
from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.runner import NativeEngine
from specexp.load_metrics import LoadSettings
from specexp.models import load_model
from specexp.tracking import records
from specexp.workloads.prompt import Prompt

ACCEPTANCE_KEYS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "drafted_per_position",
                   "accepted_per_position", "acceptance_length", "draft_acceptance_rate", "per_position_acceptance",
                   "conditional_acceptance", "acceptance_histogram", "acceptance_histogram_per_request",
                   "num_output_tokens")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, draft_dir = build_pairs(tmp_path_factory.mktemp("pairs"))["llama+llama"]
    return load_model(target_dir), load_model(draft_dir)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt_lens=st.lists(st.integers(1, 14), min_size=1, max_size=7), k=st.integers(0, 5),
       max_num_seqs=st.integers(1, 5), max_new=st.integers(1, 9), synthetic=st.booleans(),
       budget=st.sampled_from([None, 9]), cap=st.sampled_from([None, 1, 2]), lookahead=st.booleans(),
       seed=st.integers(0, 3))
def test_traces_recompute_every_acceptance_counter_of_the_run(pair, tmp_path, prompt_lens, k, max_num_seqs, max_new,
                                                              synthetic, budget, cap, lookahead, seed):
    gen = torch.Generator().manual_seed(seed)
    token_ids = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in prompt_lens]
    target, draft = pair
    engine = NativeEngine(
        target, draft if k else None,
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=40, block_size=4, seed=seed,
                     max_num_batched_tokens=max(budget or 0, max_num_seqs * (k + 1)) if budget else None,
                     plain_decode_lookahead=lookahead),
        SpeculatorConfig(num_speculative_tokens=k, rejection="synthetic" if synthetic else "standard",
                         synthetic_acceptance_rate=0.6),
        SamplingConfig(max_new_tokens=max_new, ignore_eos=False), eos_token_ids=[2],
    )
    out = engine.generate(token_ids, max_concurrency=cap)
    prompts = [Prompt(id=f"p{i}", text="", token_ids=tuple(ids)) for i, ids in enumerate(token_ids)]
    result = to_run_result(list(zip(prompts, out.requests, strict=True)), [out], k, None, torch.device("cpu"),
                           LoadSettings(max_num_seqs))
    records.write_steps(tmp_path / records.TRACES_FILE, result.traces)
    recorded = json.loads(json.dumps(result.metrics))  # what result.json holds
    traces = load_traces(tmp_path)
    recomputed = json.loads(json.dumps(acceptance_from_traces(traces, k)))
    for key in ACCEPTANCE_KEYS:
        assert recomputed[key] == recorded[key], key
    assert recomputed["accept_lengths"] == {r.prompt_id: r.accept_lengths for r in result.requests}
    steps = traces.groupby("step")
    assert steps.size().tolist() == [s.num_reqs for s in result.steps], "a row per request a step ran"
    assert steps["num_reqs"].first().tolist() == [s.num_reqs for s in result.steps]
    assert steps["num_accepted_tokens"].sum().tolist() == [s.num_accepted_tokens for s in result.steps]
    assert (traces["k"] == k).all()
