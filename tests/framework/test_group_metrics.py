"""metrics.by_category / by_task: every group's counts are its requests' counts, the groups add up to the run,
Spec-Bench's mean accepted tokens averages every step, and W&B gets the groups as tables."""

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.stats import AcceptanceStats
from specexp.group_metrics import UNCATEGORIZED, grouped_metrics
from specexp.result import RequestOutput, run_metrics
from specexp.tracking.wandb_run import GROUP_TABLE_COLUMNS, _tables

K = 3
request_plans = st.lists(
    st.tuples(st.sampled_from(["writing", "math", "qa", None]),
              st.lists(st.integers(0, K), min_size=0, max_size=6)),  # accepted drafts per verification
    min_size=1, max_size=8)


def build(plans):
    stats, requests = AcceptanceStats(K), []
    for i, (category, verifications) in enumerate(plans):
        for accepted in verifications:
            stats.record(f"r{i}", K, accepted)
        steps = [1] + [a + 1 for a in verifications]  # the prefill step, then one step per verification
        task = {"writing": "mt_bench", "math": "mt_bench", "qa": "qa"}.get(category)
        requests.append(RequestOutput(f"r{i}", "p", [1, 2], list(range(sum(steps))), "o", category,
                                      ttft_ms=1.0 + i, tpot_ms=0.5, e2e_ms=10.0 + i, accept_lengths=steps,
                                      question_id=f"q{i // 2}", task=task))
    return stats, requests


@settings(max_examples=80, deadline=None)
@given(plans=request_plans)
def test_groups_add_up_to_the_run_and_count_only_their_requests(plans):
    stats, requests = build(plans)
    metrics = run_metrics(stats, requests, [], duration_s=1.0)
    for level in ("by_category", "by_task"):
        groups = metrics[level]
        members = {name: [r for r in requests if (r.category if level == "by_category" else r.task) ==
                          (None if name == UNCATEGORIZED else name)] for name in groups}
        for name, group in groups.items():
            drafts = sum(len(v) for (c, v), r in zip(plans, requests, strict=True) if r in members[name])
            assert group["num_drafts"] == drafts and group["num_requests"] == len(members[name])
            if drafts:
                assert group["acceptance_length"] == pytest.approx(1 + group["num_accepted_tokens"] / drafts)
            steps = [n for r in members[name] for n in r.accept_lengths]
            assert group["spec_bench_mean_accepted_tokens"] == pytest.approx(sum(steps) / len(steps))
            seconds = sum(r.e2e_ms for r in members[name]) / 1e3
            assert group["output_tokens_per_s"] == pytest.approx(group["num_output_tokens"] / seconds)
        if level == "by_category":
            assert sum(g["num_drafts"] for g in groups.values()) == metrics["num_drafts"]
            assert sum(g["num_requests"] for g in groups.values()) == len(requests)
        else:
            assert set(groups) <= {"mt_bench", "qa"}, "requests without a task are in no task group"
    assert metrics["spec_bench_mean_accepted_tokens"] <= metrics["acceptance_length"] or metrics["num_drafts"] == 0


def test_a_backend_counting_only_run_totals_leaves_group_acceptance_unknown():
    stats, requests = build([("qa", [1, 2])])
    run_level = AcceptanceStats(K)
    run_level.total = stats.total  # as the vllm backend does: its counters are per run
    group = grouped_metrics(run_level, requests)["by_category"]["qa"]
    assert group["acceptance_length"] is None and group["num_drafts"] is None
    assert group["num_requests"] == 1 and group["ttft_ms"]["p50"] == 1.0


def test_wandb_gets_a_table_per_grouping():
    stats, requests = build([("qa", [1, 2]), ("writing", [3])])
    metrics = run_metrics(stats, requests, [], duration_s=1.0)
    fake = types.SimpleNamespace(Table=lambda columns, data: {"columns": columns, "data": data})
    tables = _tables(fake, metrics)
    assert tables["by_category"]["columns"] == ["category", *GROUP_TABLE_COLUMNS]
    assert [row[0] for row in tables["by_category"]["data"]] == ["qa", "writing"]
    assert [row[0] for row in tables["by_task"]["data"]] == ["qa", "mt_bench"]
    qa = dict(zip(tables["by_category"]["columns"], tables["by_category"]["data"][0], strict=True))
    assert qa["acceptance_length"] == metrics["by_category"]["qa"]["acceptance_length"] == 2.5
    assert qa["ttft_ms_p50"] == 1.0 and qa["per_position_acceptance"] == "1 0.5 0"
