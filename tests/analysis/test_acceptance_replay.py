"""Offline acceptance replay: bookkeeping properties of each backend's end-of-request rule, and exact agreement
with the counters the native engine and the hf backend measure on a trained demo pair."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from specexp.analysis.acceptance_replay import RULES, load_pair, replay_request, replay_run
from specexp.cli import compose_config
from specexp.experiment import RunContext, execute


@st.composite
def requests(draw):
    k = draw(st.integers(1, 8))
    length = draw(st.integers(1, 40))
    matches = draw(st.lists(st.booleans(), min_size=length + k, max_size=length + k))
    return k, length, matches


@settings(max_examples=300, deadline=None)
@given(requests(), st.sampled_from(RULES))
def test_counters_account_for_the_output(request, rule):
    k, length, matches = request
    counts = replay_request(matches, length, k, rule)
    per_pos = counts.accepted_per_position
    assert len(per_pos) == k
    assert all(a >= b for a, b in itertools.pairwise(per_pos))  # position i needs positions < i accepted
    assert per_pos[0] <= counts.num_drafts
    assert counts.num_drafts <= counts.num_draft_tokens <= k * counts.num_drafts
    if rule == "vllm":  # full drafts, tokens accepted past the end still counted
        assert counts.num_draft_tokens == k * counts.num_drafts
        assert length <= counts.num_counted_tokens <= length + k
    else:  # trimmed drafts: exactly the output is accounted for
        assert counts.num_counted_tokens == length


@settings(max_examples=200, deadline=None)
@given(requests())
def test_rules_differ_only_at_the_edges_of_a_request(request):
    k, length, matches = request
    native = replay_request(matches, length, k, "native")
    vllm = replay_request(matches, length, k, "vllm")
    # vLLM verifies at least the drafts native does (same steps until native starts trimming)...
    assert vllm.num_drafts >= native.num_drafts
    assert vllm.num_accepted_tokens >= native.num_accepted_tokens
    # ...and, far from the end, the same ones: extending the output changes nothing already replayed
    if length > 2 * k + 2:
        cut = length - k - 1
        assert replay_request(matches, cut, k, "vllm").num_drafts <= vllm.num_drafts


@pytest.mark.parametrize("rule", RULES)
def test_a_perfect_draft_and_a_useless_one(rule):
    k, length = 4, 23
    perfect = replay_request([True] * (length + k), length, k, rule)
    useless = replay_request([False] * (length + k), length, k, rule)
    if rule == "vllm":
        assert perfect.acceptance_length == k + 1
    else:
        # every draft accepted in full; the last one trimmed to what the request still needs
        assert perfect.num_accepted_tokens == perfect.num_draft_tokens
    assert useless.num_accepted_tokens == 0 and useless.acceptance_length == 1.0
    first = 0 if rule == "hf" else 1
    undrafted_tail = 0 if rule == "vllm" else 1  # the last token has nothing left to draft
    assert useless.num_drafts == length - first - undrafted_tail


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="'sglang' is not one of native, vllm, hf"):
        replay_request([True] * 10, 5, 2, "sglang")
    with pytest.raises(ValueError, match="needs matches for 7 positions"):
        replay_request([True] * 5, 5, 2, "vllm")
    with pytest.raises(ValueError, match="k must be >= 1"):
        replay_request([True] * 5, 5, 0, "native")


@pytest.fixture(scope="module")
def tiny_llama():
    return load_pair("tiny-llama", "tiny-llama-draft")


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_replay_reproduces_the_measured_counters(tmp_path, tiny_llama, backend):
    """The trained demo pair on real prompts: the replay under the backend's own rule gives the counters the
    backend measured, draft for draft and position for position (and the other rules do not)."""
    k = 3
    cfg = compose_config(["+exp=quickstart", "pair=tiny_llama", "workload=code", "workload.num_prompts=3",
                          "sampling=greedy", "sampling.max_new_tokens=24", "tracking=disabled",
                          f"backend={backend}", f"speculator.num_speculative_tokens={k}", "engine.max_num_seqs=1"])
    record = execute(OmegaConf.to_container(cfg, resolve=True), RunContext(run_dir=tmp_path, experiment="replay"))
    assert record["status"] == "ok", record["error"]
    rows = [json.loads(line) for line in (tmp_path / "outputs.jsonl").read_text().splitlines()]
    prompts = {r["prompt_id"]: r["prompt_token_ids"] for r in rows}
    outputs = {r["prompt_id"]: r["output_token_ids"] for r in rows}
    replayed = replay_run(*tiny_llama, prompts, outputs, k)
    m = record["metrics"]
    measured = (m["num_drafts"], m["accepted_per_position"])
    assert (replayed[backend].num_drafts, replayed[backend].accepted_per_position) == measured
    assert replayed[backend].acceptance_length == pytest.approx(m["acceptance_length"])
    other = "hf" if backend == "native" else "native"
    assert (replayed[other].num_drafts, replayed[other].accepted_per_position) != measured
