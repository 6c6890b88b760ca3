"""The oracle analysis of a run at maximum depth K: the acceptance it replays for a static k <= K is what a
real run at that k measures (greedy, the same prompts), and the per-step oracle bounds every static depth."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from specexp.analysis.acceptance_replay import draft_matches, load_pair
from specexp.analysis.oracle import (
    fill_matches,
    per_step_oracle,
    prefill_ms_per_token,
    replay_static_k,
    request_matches,
    static_k_table,
    step_costs,
)
from specexp.backends.native import to_run_result
from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.runner import NativeEngine
from specexp.models import load_model
from specexp.pairs import resolve_model_dir
from specexp.specs import WorkloadSpec
from specexp.workloads import load_prompts

K = 4
MAX_NEW = 20


@pytest.fixture(scope="module")
def runs():
    """The trained tiny_llama pair on 3 code prompts at every k = 0..K, four requests a step: k -> RunResult."""
    target_dir, draft_dir = resolve_model_dir("tiny-llama"), resolve_model_dir("tiny-llama-draft")
    target, draft = load_model(target_dir), load_model(draft_dir)
    prompts = load_prompts(WorkloadSpec(name="code", num_prompts=3, input_len=32), target_dir / "tokenizer.json",
                           target.config.vocab_size)
    results = {}
    for k in range(K + 1):
        engine = NativeEngine(target, draft if k else None, EngineConfig(max_num_seqs=4, max_model_len=256),
                              SpeculatorConfig(num_speculative_tokens=k),
                              SamplingConfig(max_new_tokens=MAX_NEW, ignore_eos=True))
        out = engine.generate([list(p.token_ids) for p in prompts])
        results[k] = to_run_result(list(zip(prompts, out.requests, strict=True)), [out], k, None, torch.device("cpu"))
    return results


def _traces(result) -> pd.DataFrame:
    return pd.DataFrame([vars(t) for t in result.traces])


def _measured(result, k) -> tuple:
    m = result.metrics
    return m["num_drafts"], m["num_draft_tokens"], m["accepted_per_position"][:k]


def test_static_k_replayed_from_the_deepest_run_equals_a_real_run_at_that_k(runs):
    matches = request_matches(_traces(runs[K]))
    table = static_k_table(matches, range(K + 1)).set_index("k")
    assert table.loc[K, "exact"], "the run's own depth never reaches an unobserved position"
    for k in range(K + 1):
        row = table.loc[k]
        if row["exact"]:  # reached only observed matches
            assert (row["num_drafts"], row["num_draft_tokens"], row["accepted_per_position"]) == _measured(runs[k], k)
    # one draft forward completes the unobserved positions: then every depth replays exactly
    target, draft = load_pair("tiny-llama", "tiny-llama-draft")
    outputs = {r.prompt_id: r for r in runs[K].requests}
    filled = {pid: fill_matches(seen, draft_matches(target, draft, outputs[pid].prompt_token_ids,
                                                    outputs[pid].output_token_ids, extra_tokens=0))
              for pid, seen in matches.items()}
    table = static_k_table(filled, range(K + 1)).set_index("k")
    for k in range(K + 1):
        row = table.loc[k]
        assert row["exact"] and row["acceptance_length"] == pytest.approx(runs[k].metrics["acceptance_length"])
        assert (row["num_drafts"], row["num_draft_tokens"], row["accepted_per_position"]) == _measured(runs[k], k)


def test_a_request_of_one_token_needs_no_draft():
    replay = replay_static_k([None], 4)
    assert (replay.num_drafts, replay.num_row_steps, replay.num_unobserved) == (0, 0, 0)


def test_per_step_oracle_bounds_every_static_depth(runs):
    steps = {k: pd.DataFrame([vars(s) for s in runs[k].steps]) for k in (0, 2, K)}
    oracle = per_step_oracle(_traces(runs[K]), step_costs(steps))
    assert oracle.oracle_tokens_per_s >= max(oracle.static_tokens_per_s.values()) * (1 - 1e-12)
    assert set(oracle.oracle_k) <= {0, 2, K} and len(oracle.oracle_k) == len(runs[K].steps)
    # with every depth costing the same, deeper never emits less: the oracle and the best static are k = K
    flat = per_step_oracle(_traces(runs[K]), {k: {b: 10.0 for b in range(1, 5)} for k in (0, 2, K)})
    assert flat.best_static_k == K and flat.oracle_tokens_per_s == pytest.approx(flat.static_tokens_per_s[K])
    assert flat.speedup(flat.static_tokens_per_s[0]) == 1.0


def test_prompt_tokens_cost_once_for_the_whole_output():
    """One request, K = 2: a 10-token prompt chunk (emitting token 0), then three steps of 2 accepted drafts (10
    tokens in all). Decode steps cost 1 ms at k = 0 and 2 ms at k = 2, a prompt token 0.5 / 0.8 ms. A k = 0 run
    takes 1 + 5 ms for the chunk and 9 decode steps (15 ms), the K-run 2 + 8 ms and three steps (16 ms): the model
    gives exactly those rates, not the K-run's four steps at k = 0 with the whole prefill charged to them."""
    traces = pd.DataFrame({"step": [0, 1, 2, 3], "num_reqs": [1] * 4, "num_query_tokens": [10, 3, 3, 3],
                           "is_prefill": [True, False, False, False], "num_draft_tokens": [0, 2, 2, 2],
                           "num_accepted_tokens": [0, 2, 2, 2], "num_emitted_tokens": [1, 3, 3, 3]})
    steps = {0: pd.DataFrame({"num_reqs": [1] * 10, "step_ms": [6.0] + [1.0] * 9, "num_prefill_tokens": [10] + [0] * 9}),
             2: pd.DataFrame({"num_reqs": [1] * 4, "step_ms": [10.0, 2.0, 2.0, 2.0], "num_prefill_tokens": [10, 0, 0, 0]})}
    costs = step_costs(steps)
    assert costs == {0: {1: 1.0}, 2: {1: 2.0}}  # decode steps only
    prefill = {k: prefill_ms_per_token(frame, costs[k]) for k, frame in steps.items()}
    assert prefill == pytest.approx({0: 0.5, 2: 0.8})
    result = per_step_oracle(traces, costs, prefill_ms=prefill)
    assert result.static_tokens_per_s == pytest.approx({0: 1e3 * 10 / 15, 2: 1e3 * 10 / 16})
    assert result.best_static_k == 0 and result.oracle_tokens_per_s >= result.static_tokens_per_s[0]
    # without prompt costs the decode rates alone decide: 10 tokens in 8 ms at k = 2, 4 in 4 ms at k = 0
    free = per_step_oracle(traces, costs)
    assert free.static_tokens_per_s == pytest.approx({0: 1e3, 2: 1e3 * 10 / 8}) and free.best_static_k == 2


def test_a_batch_size_with_prompt_steps_only_gets_the_decode_cost_around_it():
    """Decode steps at 2 and 4 rows cost 2 and 4 ms; every 3-row step held prompt tokens (10 ms, 8 prompt tokens
    each): a 3-row decode step costs 3 ms (between its neighbours), and those steps' 7 ms beyond it is prefill
    time, 7 / 8 ms a prompt token."""
    steps = pd.DataFrame({"num_reqs": [2, 2, 3, 3, 4], "step_ms": [2.0, 2.0, 10.0, 10.0, 4.0],
                          "num_prefill_tokens": [0, 0, 8, 8, 0]})
    costs = step_costs({1: steps})[1]
    assert costs == pytest.approx({2: 2.0, 3: 3.0, 4: 4.0})
    assert prefill_ms_per_token(steps, costs) == pytest.approx(14.0 / 16)
    only_prompts = pd.DataFrame({"num_reqs": [1, 2], "step_ms": [5.0, 6.0], "num_prefill_tokens": [4, 4]})
    assert step_costs({0: only_prompts})[0] == {1: 5.0, 2: 6.0}  # no decode step to go by: every step's mean
