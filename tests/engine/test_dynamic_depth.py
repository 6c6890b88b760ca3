"""Dynamic speculation depth in the native engine: every depth mode is lossless while the batch changes every
step, sampling keeps the target's distribution when k changes, and the graphs of every (size, k) a mode can
produce are captured at start-up and never after (CPU emulation of graphs; the GPU twin is in test_cuda_graphs)."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from pairs import random_prompts, save_tiny, second_token_pvalue, tiny_hf_model

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.goodput import StepCostTable
from specexp.engine.output import StepRecord
from specexp.engine.runner import NativeEngine
from specexp.engine.target_graphs import step_periods_ms
from specexp.models import load_model

MAX_NEW = 10
EOS = 2
PROMPT_LENS = [3, 11, 6, 17, 1, 9, 14, 2, 7, 20, 5, 12]
# Batch sizes 1..16 map to every k in 0..5, so a run whose batch grows and shrinks visits many of them.
SCHEDULE = ((1, 1, 5), (2, 2, 0), (3, 3, 2), (4, 6, 3), (7, 10, 1), (11, 16, 4))
# A draft step costs a tenth of a verify of one token a row, verify tokens cost a little: goodput's k follows
# each request's acceptance.
COSTS = StepCostTable({s: [10.0 + 0.3 * s * q for q in range(1, 7)] for s in (1, 2, 4, 8, 16)},
                      {s: 1.0 + 0.05 * s for s in (1, 2, 4, 8, 16)})
# k = (n - 1) % 6 at batch size n: as the batch grows and shrinks, its steps visit every k in 0..5.
EVERY_K = dict(num_speculative_tokens=5, num_speculative_tokens_per_batch_size=tuple(
    (n, n, (n - 1) % 6) for n in range(1, 17)))
MODES = {
    "schedule": dict(num_speculative_tokens=5, num_speculative_tokens_per_batch_size=SCHEDULE),
    "confidence": dict(num_speculative_tokens=4, draft_confidence_threshold=0.5),
    "goodput": dict(num_speculative_tokens=5, adaptive="goodput"),
}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(PROMPT_LENS, seed=5)


@pytest.fixture(scope="module")
def hf_greedy(pair_dirs, prompts):
    """transformers' greedy generate of each target, stopping at EOS like the engine (requests end at different
    steps)."""
    from transformers import AutoModelForCausalLM

    refs = {}
    for name, (target_dir, _) in pair_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(target_dir, attn_implementation="eager").float().eval()
        outs = []
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=0)
            outs.append(out[0, len(p):].tolist())
        refs[name] = outs
    return refs


def _engine(target, draft, spec: dict, max_num_seqs, mode="none", temperature=0.0, max_new=MAX_NEW, budget=16,
            capture_sizes=None, seed=0):
    return NativeEngine(
        target, draft,
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, block_size=4, max_num_batched_tokens=budget,
                     cudagraph_mode=mode, cudagraph_capture_sizes=capture_sizes, seed=seed),
        SpeculatorConfig(cudagraph_mode=mode, **spec),
        SamplingConfig(temperature=temperature, max_new_tokens=max_new, ignore_eos=False),
        eos_token_ids=[EOS], emulate_graphs_on_cpu=True, step_costs=COSTS,
    )


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("max_num_seqs", [1, 4, 16])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_greedy_outputs_are_lossless_under_every_depth_mode(pair_dirs, prompts, hf_greedy, pair, max_num_seqs, mode):
    """Requests stop at EOS or max_new_tokens and prompts are prefilled in chunks of a 16-token budget, so the
    batch changes every step; each mode's tokens are native k = 0's and transformers' greedy generate's."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    plain = _engine(target, draft, dict(num_speculative_tokens=0), max_num_seqs).generate(prompts)
    out = _engine(target, draft, MODES[mode], max_num_seqs).generate(prompts)
    assert [r.output_token_ids for r in plain.requests] == hf_greedy[pair]
    assert [r.output_token_ids for r in out.requests] == hf_greedy[pair]
    sizes = {s.num_reqs for s in out.steps}
    assert max_num_seqs == 1 or len(sizes) > 2, f"the batch barely changed: sizes {sizes}"
    depths = {s.num_speculative_tokens for s in out.steps}
    if mode == "schedule":
        assert depths == {k for n in sizes for start, end, k in SCHEDULE if start <= n <= end}
    if mode == "confidence":
        assert depths == {4}


def test_the_confidence_rule_masks_drafts_after_the_first_unconfident_one(pair_dirs, prompts):
    """Rows carry K drafts, and verify those up to the first one whose draft probability is below the threshold:
    fewer draft tokens are verified the higher the threshold, never more than K a row."""
    target, draft = (load_model(d) for d in pair_dirs["lfm2+lfm2"])
    verified = {}
    for threshold in (0.0, 0.3, 0.9):
        spec = dict(num_speculative_tokens=4, draft_confidence_threshold=threshold)
        out = _engine(target, draft, spec, 4).generate(prompts)
        lengths = [d for r in out.requests for d, _ in r.verifies]
        assert all(1 <= d <= 4 for d in lengths)
        verified[threshold] = sum(lengths) / len(lengths)
    assert verified[0.0] > verified[0.3] > verified[0.9]


def test_goodput_depth_follows_acceptance_and_is_deterministic_for_a_seed(pair_dirs, prompts):
    """With fixed step costs the adaptive mode's ks are a function of the run: the same seed gives the same ks
    and tokens at temperature 1. A draft equal to the target drafts deeper than an unrelated one."""
    target, noisy = (load_model(d) for d in pair_dirs["lfm2+lfm2"])
    unrelated = load_model(pair_dirs["lfm2+llama"][1])

    def run(draft, temperature):
        out = _engine(target, draft, MODES["goodput"], 4, temperature=temperature).generate(prompts)
        return [s.num_speculative_tokens for s in out.steps], [r.output_token_ids for r in out.requests]

    assert run(noisy, 1.0) == run(noisy, 1.0)
    same, _ = run(target, 0.0)
    other, _ = run(unrelated, 0.0)
    assert sum(same) / len(same) > sum(other) / len(other)


def test_goodput_measures_the_step_costs_it_weighs_at_start_up(pair_dirs):
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])
    engine = NativeEngine(target, draft, EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4),
                          SpeculatorConfig(num_speculative_tokens=3, adaptive="goodput"), SamplingConfig())
    costs = engine.step_costs
    assert sorted(costs.verify_ms) == sorted(costs.draft_ms) == [1, 2, 4]
    assert all(len(v) == 4 and min(v) > 0 for v in costs.verify_ms.values())
    # the draft's decode phase per k: nothing for k <= 1 (the prefill samples draft 1), its fused loop from k = 2
    assert all(len(d) == 4 and d[:2] == [0.0, 0.0] and min(d[2:]) > 0 for d in costs.draft_ms.values())
    assert engine.depth.costs is costs
    # what a real step at each k costs beyond its replays, measured on dummy requests that leave nothing behind
    assert sorted(costs.fixed_ms) == [1, 2, 4]
    assert all(len(f) == 4 and min(f) >= 0 for f in costs.fixed_ms.values())
    assert all(max(f) > 0 for f in costs.fixed_ms.values())  # a real step's host work is never free
    assert costs.step_ms(2, 1) == costs.fixed_ms[1][2] + costs.verify_ms[1][2] + costs.draft_ms[1][2]
    assert not engine.scheduler.has_work and engine.steps == []
    out = engine.generate([[3, 4, 5], [6, 7]], max_new_tokens=4)
    assert out.step_costs == costs.to_dict()


@pytest.mark.parametrize("k", [2, 4])
def test_sampling_keeps_the_target_distribution_while_k_changes(tmp_path, k):
    """At temperature 1 under a batch-size schedule whose k changes between steps (requests finish after
    different numbers of verifies; long prompts wait for the token budget), the first token a verify emits
    after the prompt's first sampled token is distributed as the target's next-token distribution."""
    target_dir = save_tiny(tiny_hf_model("llama", 32, 1, seed=11), tmp_path / "t")
    draft_dir = save_tiny(tiny_hf_model("llama", 32, 1, seed=12), tmp_path / "d")
    target, draft = load_model(target_dir), load_model(draft_dir)
    prompt = [5, 9, 3, 7, 11, 4, 8, 6, 10, 12, 5, 9]
    schedule = ((1, 11, 1), (12, 12, k), (13, 16, 3))  # the batch runs 11..14 rows (prompts wait for budget)
    engine = _engine(target, draft, dict(num_speculative_tokens=4, num_speculative_tokens_per_batch_size=schedule),
                     16, temperature=1.0, max_new=4, budget=16, seed=k)
    out = engine.generate([prompt] * 1200)
    depths = Counter(s.num_speculative_tokens for s in out.steps if s.num_drafts)
    assert len(depths) == 3, f"verifying steps ran only k in {set(depths)}"
    assert second_token_pvalue(target_dir, prompt, [r.output_token_ids for r in out.requests]) > 0.01


def _captured(engine):
    return {m.name: set(m.graphs) for m in engine.graph_managers()}


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
def test_every_k_a_schedule_visits_replays_a_graph_captured_at_start_up(pair_dirs, prompts, pair, caplog):
    """FULL graphs, emulated on the CPU, under a schedule that visits every k in 0..K: the start-up log says what
    the schedule's graphs cost, the tokens are the eager engine's, every verify and draft-decode step of a
    captured size replays a graph captured at start-up (none is added later, none is missing), and the graphs
    of every k were replayed."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    many = prompts + prompts[::-1]
    eager = _engine(target, draft, EVERY_K, 16).generate(many)
    with caplog.at_level(logging.INFO, logger="specexp.engine"):
        engine = _engine(target, draft, EVERY_K, 16, mode="full")
    (line,) = [r.getMessage() for r in caplog.records if "depth policy needs CUDA graphs" in r.getMessage()]
    keys = engine.graph_keys
    graphs = sum(m.num_graphs_to_capture for m in engine.graph_managers())
    assert f"k in [0, 1, 2, 3, 4, 5]: {graphs} graphs" in line
    # the draft's prefill: a key per (size, v), or per size where it takes two-slot regions (an attention draft)
    prefill_keys = engine.speculator.prefill_graphs.keys
    assert len(prefill_keys) == (len(keys.draft_prefill_sizes()) if pair == "llama+llama" else len(keys.verify))
    assert (f"target verify {len(keys.verify)}, draft prefill {len(prefill_keys)}, draft decode {len(keys.decode)}"
            in line)
    before = _captured(engine)
    graphed = engine.generate(many)
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    assert _captured(engine) == before, "no capture after start-up"
    assert all(not m.num_eager_uncaptured for m in engine.graph_managers())
    assert {s.num_speculative_tokens for s in graphed.steps} == set(range(6))
    decode = engine.speculator.decode_graphs
    assert {k for _, k, _ in decode.replays_per_graph} == {k for k in range(2, 6)}
    verified = {k for _, k, _ in engine.verify_graphs.replays_per_graph}
    assert len(verified) >= 4, f"verify graphs replayed only for v in {verified}"
    uniform_verifies = sum(1 for s in graphed.steps if s.num_prefill_tokens == 0)
    assert engine.verify_graphs.num_replays == uniform_verifies


def test_left_out_depths_run_eager_and_are_counted_per_size_and_k(pair_dirs, prompts):
    """speculator.cudagraph_num_speculative_tokens=(0, 2, 5) captures the schedule's graphs of those k only: each
    uniform verify of another v, and each draft decode of another k, runs eagerly and is counted under its
    (size, k); the tokens stay the eager engine's."""
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])
    spec = {**EVERY_K, "cudagraph_num_speculative_tokens": (0, 2, 5)}
    many = prompts + prompts[::-1]
    eager = _engine(target, draft, EVERY_K, 16).generate(many)
    sizes = (1, 2, 4, 8, 16)
    engine = _engine(target, draft, spec, 16, mode="full", capture_sizes=sizes)
    out = engine.generate(many)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]

    def padded(n):
        return next(s for s in sizes if s >= n)

    verify, decode = Counter(), Counter()
    for s in out.steps:
        if s.num_prefill_tokens == 0 and s.num_tokens // s.num_reqs - 1 not in (0, 2, 5):
            verify[(padded(s.num_reqs), s.num_tokens // s.num_reqs - 1)] += 1
        if s.num_speculative_tokens in (3, 4):
            decode[(padded(s.num_reqs), s.num_speculative_tokens)] += 1
    assert verify and decode
    assert engine.verify_graphs.num_eager_uncaptured == dict(verify)
    assert engine.speculator.decode_graphs.num_eager_uncaptured == dict(decode)
    assert all(k in (0, 2, 5) for _, k, _ in engine.verify_graphs.graphs)


def test_synthetic_acceptance_changes_between_runs_of_one_engine(pair_dirs, prompts):
    """`set_synthetic_acceptance` on a built engine (graphs emulated): rate 1 accepts every verified draft, rate 0
    none, and a value out of range or an engine without synthetic rejection gets one line naming it."""
    from specexp.engine.config import EngineConfigError

    target, draft = (load_model(d) for d in pair_dirs["lfm2+llama"])
    engine = _engine(target, draft, dict(num_speculative_tokens=3, rejection="synthetic",
                                         synthetic_acceptance_rate=0.5), 4, mode="full", capture_sizes=[1, 2, 4])
    for rate in (1.0, 0.0, 1.0):
        engine.set_synthetic_acceptance(rate=rate)
        steps = [s for s in engine.generate(prompts).steps if s.num_draft_tokens]
        assert steps and all(s.num_accepted_tokens == (s.num_draft_tokens if rate else 0) for s in steps), rate
    engine.set_synthetic_acceptance(length=2.5)
    assert engine.spec_cfg.synthetic_acceptance_length == 2.5
    with pytest.raises(EngineConfigError, match="synthetic_acceptance_rate=1.5"):
        engine.set_synthetic_acceptance(rate=1.5)
    greedy = _engine(target, draft, dict(num_speculative_tokens=3), 4)
    with pytest.raises(EngineConfigError, match="rejection=synthetic"):
        greedy.set_synthetic_acceptance(rate=0.5)


def test_step_periods_run_from_a_steps_start_to_the_next_and_keep_only_full_steps_at_k():
    def record(start_s, num_reqs=2, k=3, prefill=0):
        return StepRecord(step=0, num_reqs=num_reqs, num_tokens=1, num_prefill_tokens=prefill, num_drafts=0,
                          num_draft_tokens=0, num_accepted_tokens=0, num_output_tokens=1, schedule_ms=0.0,
                          verify_ms=0.0, sample_ms=0.0, draft_ms=0.0, step_ms=0.0, num_speculative_tokens=k,
                          start_s=start_s)

    steps = [record(0.0, prefill=4), record(0.010), record(0.013), record(0.020, k=2), record(0.022),
             record(0.030, num_reqs=1), record(0.031)]
    periods = step_periods_ms(steps, num_reqs=2, k=3)
    assert periods == pytest.approx([3.0, 7.0, 8.0])  # none for the prefill, the k = 2 and 1-row steps, the last
