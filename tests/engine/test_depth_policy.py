"""The depth of each step (`specexp.engine.depth`, `specexp.engine.goodput`): vLLM's batch-size schedule and its
validator, the (size, k) graph keys a policy produces, the goodput estimator. Plain Python, no models."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp.engine.config import EngineConfigError, SpeculatorConfig
from specexp.engine.cudagraph import FULL, NONE, CudaGraphManager
from specexp.engine.depth import (
    ScheduledDepth,
    StaticDepth,
    describe_graph_cost,
    graph_keys,
    parse_batch_size_schedule,
    schedule_from_best_k,
)
from specexp.engine.goodput import (
    AcceptanceEstimate,
    GoodputDepth,
    GoodputSettings,
    StepCostTable,
    best_batch_depth,
    best_depth,
    expected_tokens,
)
from specexp.engine.request import Request
from specexp.engine.scheduler import ScheduledRow

KEY = "speculator.num_speculative_tokens_per_batch_size"


# ---------------------------------------------------------------------------------------------- schedule


@st.composite
def schedules(draw, max_k=8):
    """Valid schedules: sorted, non-overlapping ranges from batch size 1, with gaps, each k in 0..max_k."""
    ranges, start = [], 1
    for _ in range(draw(st.integers(1, 5))):
        end = start + draw(st.integers(0, 6))
        ranges.append([start, end, draw(st.integers(0, max_k))])
        start = end + 1 + draw(st.integers(0, 3))  # a gap before the next range
    return ranges


@settings(max_examples=200, deadline=None)
@given(schedules(), st.integers(1, 40))
def test_a_batch_size_takes_its_ranges_k_and_gaps_and_the_tail_carry_the_previous(ranges, num_reqs):
    schedule = parse_batch_size_schedule(ranges, 8)
    inside = [k for start, end, k in ranges if start <= num_reqs <= end]
    before = [k for start, end, k in ranges if end < num_reqs]
    assert schedule.k_for(num_reqs) == (inside[0] if inside else before[-1])


@pytest.mark.parametrize("entries, fragment", [
    ([[1, 4, 3], [2, 8, 2]], "[1]=[2, 8, 2]: overlaps [1, 4, 3]"),
    ([[1, 4, 3], [9, 12, 1], [5, 8, 2]], "[2]=[5, 8, 2]: ranges must be sorted by start_bs"),
    ([[2, 4, 3]], "[0]=[2, 4, 3]: the first range must start at batch size 1"),
    ([[1, 4, -1]], "[0]=[1, 4, -1]: k=-1 must be >= 0"),
    ([[1, 4, 2], [5, 8, 5]], "[1]=[5, 8, 5]: k=5 > speculator.num_speculative_tokens=4"),
    ([[1, 4]], "[0]=[1, 4]: must be [start_bs, end_bs, k]"),
    ([[1, 4, 2], [6, 5, 1]], "[1]=[6, 5, 1]: needs 1 <= start_bs <= end_bs"),
    ([], "must be a non-empty list"),
])
def test_each_schedule_error_is_one_line_naming_the_entry(entries, fragment):
    with pytest.raises(EngineConfigError) as info:
        SpeculatorConfig(num_speculative_tokens=4, num_speculative_tokens_per_batch_size=entries).validate(64)
    message = str(info.value)
    assert "\n" not in message and KEY in message and fragment in message, message


@pytest.mark.parametrize("kw, fragment", [
    (dict(num_speculative_tokens_per_batch_size=[[1, 8, 2]], adaptive="goodput"),
     "speculator.num_speculative_tokens_per_batch_size and speculator.adaptive are both set"),
    (dict(draft_confidence_threshold=0.3, adaptive="goodput"),
     "speculator.draft_confidence_threshold and speculator.adaptive are both set"),
    (dict(num_speculative_tokens_per_batch_size=[[1, 8, 2]], draft_confidence_threshold=0.3),
     "speculator.num_speculative_tokens_per_batch_size and speculator.draft_confidence_threshold are both set"),
    (dict(adaptive="sometimes"), "speculator.adaptive='sometimes': valid are 'off', 'goodput'"),
    (dict(draft_confidence_threshold=-0.1), "speculator.draft_confidence_threshold=-0.1: must be in [0, 1]"),
    (dict(num_speculative_tokens=0, adaptive="goodput"), "speculator.adaptive needs speculator.num_speculative"),
    (dict(cudagraph_num_speculative_tokens=(1, 5)), "speculator.cudagraph_num_speculative_tokens=[1, 5]: must be"),
])
def test_depth_modes_are_one_at_a_time_and_each_value_is_checked(kw, fragment):
    with pytest.raises(EngineConfigError) as info:
        SpeculatorConfig(**{"num_speculative_tokens": 4, **kw}).validate(64)
    assert "\n" not in str(info.value) and fragment in str(info.value), str(info.value)


# -------------------------------------------------------------------------------------------- graph keys


def _padded(size_list, n):
    return next(s for s in sorted(size_list) if s >= n)


@settings(max_examples=150, deadline=None)
@given(schedules(max_k=6), st.sets(st.integers(1, 24), min_size=1, max_size=5), st.integers(1, 24))
def test_graph_keys_are_every_key_two_consecutive_steps_can_produce(ranges, sizes, max_num_seqs):
    """Any step of n rows may follow any step of n' rows (requests finish and arrive between steps): its verify
    carries min(k(n'), k(n)) drafts at the size n pads to, and its draft decodes k(n) - 1 steps there."""
    sizes = sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})
    policy = ScheduledDepth(parse_batch_size_schedule(ranges, 6))
    keys = graph_keys(policy.step_depths, sizes, max_num_seqs)
    k_of = policy.schedule.k_for
    batch_sizes = range(1, max_num_seqs + 1)
    assert set(keys.verify) == {(_padded(sizes, n), min(k_of(m), k_of(n))) for n in batch_sizes for m in batch_sizes}
    assert set(keys.decode) == {(_padded(sizes, n), k_of(n)) for n in batch_sizes if k_of(n) >= 2}
    assert not keys.left_out_verify and not keys.left_out_decode


def test_a_static_depth_needs_one_key_per_size_and_left_out_depths_are_listed():
    static = graph_keys(StaticDepth(4).step_depths, [1, 2, 4], 4)
    assert static.verify == ((1, 4), (2, 4), (4, 4)) and static.decode == static.verify
    policy = ScheduledDepth(parse_batch_size_schedule([[1, 1, 4], [2, 2, 1], [3, 4, 3]], 4))
    keys = graph_keys(policy.step_depths, [1, 2, 4], 4, captured_depths=(1, 4))
    assert keys.verify == ((1, 1), (1, 4), (2, 1), (4, 1)) and keys.decode == ((1, 4),)
    assert keys.left_out_verify == ((1, 3), (4, 3)) and keys.left_out_decode == ((4, 3),)
    line = describe_graph_cost(keys, static, 2, {1, 3, 4})
    assert "k in [1, 3, 4]: 18 graphs" in line and "a static k would capture 18" in line
    assert "5 keys left out" in line


def test_an_uncaptured_size_and_k_runs_eager_and_is_counted_per_key():
    """A manager captures its keys at start-up only: a uniform batch whose (size, k) was left out runs eagerly,
    is counted under that key, and dispatching it adds no graph."""
    manager = CudaGraphManager("target_verify", [1, 2, 4], 1, torch.device("cpu"), tokens_per_draft=1,
                               capture_keys=((1, 3), (2, 1), (4, 3)))
    manager.capture(lambda desc: None, lambda desc: None)
    captured = set(manager.graphs)
    assert captured == {(1, 3, 0), (2, 1, 0), (4, 3, 0)}
    assert manager.dispatch(3, 12, uniform=True, k=3).cg_mode == FULL  # padded to (4, k=3)
    for num_reqs, k in [(2, 3), (2, 3), (1, 1), (3, 0)]:
        desc = manager.dispatch(num_reqs, num_reqs * (k + 1), uniform=True, k=k)
        assert (desc.cg_mode, desc.num_speculative_tokens) == (NONE, k)
    assert manager.num_eager_uncaptured == {(2, 3): 2, (1, 1): 1, (4, 0): 1}
    assert manager.summary()["num_eager_uncaptured"] == {"1@k1": 1, "2@k3": 2, "4@k0": 1}
    assert set(manager.graphs) == captured and (manager.num_replays, manager.num_eager) == (1, 4)


# ------------------------------------------------------------------------------------------------ goodput


def test_expected_tokens_is_leviathans_sum_of_prefix_products():
    alpha = [0.9, 0.5, 0.8]
    assert expected_tokens(alpha, 0) == 1.0
    assert expected_tokens(alpha, 3) == pytest.approx(1 + 0.9 + 0.9 * 0.5 + 0.9 * 0.5 * 0.8)


def _costs(draft_ms: float, verify_per_token_ms: float = 0.0, sizes=(1, 2, 4, 8), max_k: int = 6):
    return StepCostTable({s: [10.0 + verify_per_token_ms * s * q for q in range(1, max_k + 2)] for s in sizes},
                         {s: draft_ms for s in sizes})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6), st.floats(0.1, 10.0), st.integers(-1, 8),
       st.integers(1, 8))
def test_the_chosen_k_maximises_expected_tokens_per_step_time(alpha, draft_ms, usable, num_reqs):
    costs = _costs(draft_ms, 0.2)
    k = best_depth(alpha, usable, costs, num_reqs, 6)
    rates = [expected_tokens(alpha, min(j, max(usable, 0))) / costs.step_ms(j, num_reqs) for j in range(7)]
    assert rates[k] >= max(rates) * (1 - 1e-9) and all(r < rates[k] * (1 - 1e-12) for r in rates[:k])


def test_a_cheap_draft_drafts_deep_and_a_dear_one_not_at_all():
    assert best_depth([0.9] * 6, 10, _costs(0.01), 1, 6) == 6
    assert best_depth([0.9] * 6, 2, _costs(0.01), 1, 6) == 2  # drafts past the tokens left are worth nothing
    # k = 1 needs no decode step (the draft's prefill, which every step runs, samples draft 1) ...
    assert best_depth([0.9] * 6, 10, _costs(50.0), 1, 6) == 1
    # ... so only a verify that costs more than its extra token is worth makes k = 0 win
    assert best_depth([0.3] * 6, 10, _costs(50.0, verify_per_token_ms=20.0), 1, 6) == 0


def test_ties_go_to_the_smaller_k():
    assert best_batch_depth([[0.5] * 3], [5], [1.0, 1.5, 1.75, 10.0]) == 0  # 1/1 = 1.5/1.5 = 1.75/1.75
    assert best_batch_depth([[0.5] * 3], [5], [1.0, 1.4, 1.75, 10.0]) == 1
    # a row with no drafts left adds its one token at every k
    assert best_batch_depth([[0.5] * 3, [0.9] * 3], [5, 0], [2.0, 2.4, 4.0, 8.0]) == 1


def test_a_step_costs_its_verify_its_fixed_cost_and_one_decode_step_per_draft_past_the_first():
    costs = StepCostTable({1: [1.0, 1.5, 2.0, 2.5]}, {1: 0.25}, {1: 0.75})
    assert [costs.step_ms(k, 1) for k in range(4)] == [1.75, 2.25, 3.0, 3.75]
    assert costs.step_ms_by_k(1, 3) == [1.75, 2.25, 3.0, 3.75]
    assert costs.draft_ms == {1: [0.0, 0.0, 0.25, 0.5]}  # one decode step's cost, charged k - 1 times


def test_a_measured_draft_phase_per_k_is_charged_as_measured():
    """The fused decode loop of k - 1 steps, timed per k, is what a step of k drafts costs: no per-step slope."""
    costs = StepCostTable({1: [1.0, 1.5, 2.0, 2.5], 4: [2.0, 2.5, 3.0, 3.5]},
                          {1: [0.0, 0.0, 0.3, 0.4], 4: [0.0, 0.0, 0.5, 0.7]}, {1: 0.75, 4: 1.0})
    assert costs.step_ms_by_k(1, 3) == pytest.approx([1.75, 2.25, 3.05, 3.65])
    assert costs.step_ms_by_k(3, 3) == pytest.approx([3.0, 3.5, 4.5, 5.2])  # 3 rows cost as the size 4
    assert costs.to_dict()["draft_ms"] == {"1": [0.0, 0.0, 0.3, 0.4], "4": [0.0, 0.0, 0.5, 0.7]}
    with pytest.raises(ValueError, match=r"draft_ms\[1\] has 3 depths, verify_ms\[1\] 4"):
        StepCostTable({1: [1.0, 1.5, 2.0, 2.5]}, {1: [0.0, 0.0, 0.3]})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6), st.integers(-1, 8)),
                min_size=1, max_size=12),
       st.lists(st.floats(0.1, 20.0), min_size=7, max_size=7))
def test_the_step_k_maximises_the_batchs_expected_tokens_per_ms(rows, step_ms):
    alphas, usables = [a for a, _ in rows], [u for _, u in rows]
    k = best_batch_depth(alphas, usables, step_ms)
    rates = [sum(expected_tokens(a, min(j, max(u, 0))) for a, u in rows) / step_ms[j] for j in range(7)]
    # the best rate, and no smaller k as good (up to summation order: the policy sums in numpy)
    assert rates[k] >= max(rates) * (1 - 1e-6) and all(r <= rates[k] * (1 + 1e-6) for r in rates[:k])
    if len(rows) == 1:  # one request: its own best k
        table = StepCostTable({1: step_ms}, {1: 0.0})
        assert k == best_depth(alphas[0], usables[0], table, 1, 6)


def test_the_estimate_moves_only_the_positions_a_verify_observed():
    estimate = AcceptanceEstimate([0.5] * 4)
    estimate.update(3, 1, 0.5)  # accepted, rejected, then unobserved
    assert estimate.conditional == [0.75, 0.25, 0.5, 0.5]
    estimate.update(2, 2, 0.5)  # all accepted: the positions past it relax towards the deepest one
    assert estimate.conditional == [0.875, 0.625, 0.5625, 0.5625]
    estimate.update(0, 0, 0.5)
    assert estimate.conditional == [0.875, 0.625, 0.5625, 0.5625]


def _row(request_id, verifies, max_new=50, samples=True):
    request = Request(request_id, [3, 4, 5], max_new)
    request.verifies = list(verifies)
    return ScheduledRow(request, 1, 0, is_prefill=False, samples=samples)


def test_goodput_steps_run_the_batchs_best_k_and_learn_from_every_verify():
    policy = GoodputDepth(6, _costs(1.0), GoodputSettings(prior_acceptance=0.7, ema_weight=0.5))
    good, poor = _row(0, [(4, 4)] * 6), _row(1, [(4, 0)] * 6)
    good_alpha, poor_alpha = (policy.estimate_of(r.request).conditional for r in (good, poor))
    k_good = best_depth(good_alpha, 49, policy.costs, 2, 6)
    k_poor = best_depth(poor_alpha, 49, policy.costs, 2, 6)
    assert k_good > k_poor
    k_both = policy.step_k([good, poor])
    assert k_both == best_batch_depth([good_alpha, poor_alpha], [49, 49], policy.costs.step_ms_by_k(2, 6))
    assert k_poor <= k_both <= k_good
    assert policy.step_k([poor]) == best_depth(poor_alpha, 49, policy.costs, 1, 6)
    assert policy.step_k([_row(2, [], samples=False)]) == 0  # a mid-prompt chunk proposes nothing usable
    assert poor.request.acceptance_estimate.seen == 6
    # a new request starts from the run's estimate, which took every verify above
    fresh = policy.estimate_of(_row(3, []).request)
    assert fresh.conditional == policy.run_estimate.conditional != [0.7] * 6


def test_k_zero_is_no_trap_an_idle_estimate_climbs_back_to_drafting():
    """A request whose estimate fell by chance to where k = 0 wins learns nothing from its k = 0 steps; it relaxes
    towards the prior (and the run's estimate with it) until drafting pays again."""
    costs = _costs(2.0, verify_per_token_ms=5.0)  # at alpha 0.7, k >= 1 pays; at alpha 0.05, k = 0 does
    settings_ = GoodputSettings(prior_acceptance=0.7, ema_weight=0.25)
    policy = GoodputDepth(6, costs, settings_)
    row = _row(0, [(1, 0)] * 12)  # twelve rejections of the first draft
    assert policy.step_k([row]) == 0
    low = list(row.request.acceptance_estimate.conditional)
    ks = [policy.step_k([row]) for _ in range(40)]
    assert ks[0] == 0 and max(ks) >= 1, ks
    assert row.request.acceptance_estimate.conditional[0] > low[0]
    assert policy.run_estimate.conditional[0] > low[0] - 1e-12


def test_a_new_run_starts_the_run_estimate_again_at_the_prior():
    policy = GoodputDepth(4, _costs(1.0), GoodputSettings(prior_acceptance=0.6, ema_weight=0.5))
    policy.step_k([_row(0, [(4, 0)] * 5)])
    assert policy.run_estimate.conditional != [0.6] * 4
    policy.reset()
    assert policy.run_estimate.conditional == [0.6] * 4


def test_the_fixed_cost_of_a_step_makes_drafting_pay_on_a_host_bound_pair():
    """Replays alone say a draft decode step costs as much as a verify (only k = 1, which needs none, pays); a
    host cost that every step pays alike (fixed_ms) makes the expected tokens per unit of time favour drafting
    deeper."""
    costs = StepCostTable({1: [1.0] * 7}, {1: 1.0})
    assert best_depth([0.8] * 6, 50, costs, 1, 6) == 1
    costs.fixed_ms = {1: 5.0}
    assert costs.step_ms(2, 1) == 5.0 + 1.0 + 1.0
    assert best_depth([0.8] * 6, 50, costs, 1, 6) >= 3
    assert costs.to_dict()["fixed_ms"] == {"1": 5.0}


def test_a_fixed_cost_measured_per_k_moves_the_choice():
    """A step whose cost beyond its replays differs by k (as measured at start-up, one entry per k) is weighed at
    its own k: a k = 1 step that costs more than its replays say makes k = 2 the better buy."""
    costs = StepCostTable({1: [1.0, 1.05, 1.1, 1.15]}, {1: [0.0, 0.0, 0.3, 0.6]}, {1: 0.2})
    assert best_depth([0.6] * 3, 50, costs, 1, 3) == 1  # 1.6 / 1.25 against 1.96 / 1.6
    costs = StepCostTable({1: [1.0, 1.05, 1.1, 1.15]}, {1: [0.0, 0.0, 0.3, 0.6]}, {1: [0.2, 0.45, 0.2, 0.2]})
    assert costs.step_ms_by_k(1, 3) == pytest.approx([1.2, 1.5, 1.6, 1.95])
    assert best_depth([0.6] * 3, 50, costs, 1, 3) == 2  # 1.6 / 1.5 against 1.96 / 1.6
    assert costs.to_dict()["fixed_ms"] == {"1": [0.2, 0.45, 0.2, 0.2]}
    with pytest.raises(ValueError, match=r"fixed_ms\[1\] has 2 depths"):
        StepCostTable({1: [1.0, 1.05, 1.1, 1.15]}, {1: [0.0, 0.0, 0.3, 0.6]}, {1: [0.2, 0.3]})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(1, 512), st.integers(0, 8), min_size=1, max_size=8))
def test_the_schedule_from_best_k_gives_each_batch_size_its_k(best_k):
    schedule = schedule_from_best_k(best_k)
    parsed = parse_batch_size_schedule([list(r) for r in schedule], max(best_k.values()))
    assert all(parsed.k_for(b) == k for b, k in best_k.items())
    largest = max(best_k)
    assert parsed.k_for(largest + 1000) == best_k[largest]  # the tail carries the last k
    assert all(a[2] != b[2] for a, b in itertools.pairwise(schedule))  # one range per run of equal ks
    assert schedule[-1][1] == largest


def test_the_schedule_from_best_k_merges_equal_neighbours_and_refuses_bad_entries():
    assert schedule_from_best_k({1: 3, 4: 2, 16: 2, 64: 1}) == ((1, 1, 3), (2, 16, 2), (17, 64, 1))
    assert schedule_from_best_k({64: 2, 1: 2}) == ((1, 64, 2),)
    with pytest.raises(ValueError, match="batch size 0"):
        schedule_from_best_k({0: 1})
