"""CUDA graphs specialised per k (run on a GPU machine: `pytest -m cuda`): under every depth mode the replays give
the eager engine's greedy tokens, every k the run visits replays a graph captured at start-up, nothing is
captured after it, and graph memory and time are recorded per (manager, size, k). The CPU twin, on emulated
graphs, is test_dynamic_depth.py."""

from __future__ import annotations

import pytest
import torch
from pairs import VOCAB, build_pairs

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.goodput import StepCostTable
from specexp.engine.runner import NativeEngine
from specexp.models import load_model

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MAX_NUM_SEQS = 32
# k = (n - 1) % 6 at batch size n: a batch that grows and shrinks visits every k in 0..5.
EVERY_K = dict(num_speculative_tokens=5, num_speculative_tokens_per_batch_size=tuple(
    (n, n, (n - 1) % 6) for n in range(1, MAX_NUM_SEQS + 1)))
SIZES = (1, 2, 4, 8, 16, 32)
COSTS = StepCostTable({s: [1.0 + 0.02 * s * q for q in range(1, 7)] for s in SIZES}, {s: 0.1 for s in SIZES})
MODES = {
    "schedule": EVERY_K,
    "confidence": dict(num_speculative_tokens=4, draft_confidence_threshold=0.5),
    "goodput": dict(num_speculative_tokens=5, adaptive="goodput"),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return build_pairs(tmp_path_factory.mktemp("gpu-depth-pairs"))


def _prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 24, (n,), generator=gen).tolist()
    return [torch.randint(3, VOCAB, (m,), generator=gen).tolist() for m in lens]


def _engine(target, draft, spec: dict, graphs: bool, captured_depths=None, prefill_tokens=(), mixed="joined",
            kernels=None):
    mode = "full" if graphs else "none"
    return NativeEngine(
        target, draft,
        EngineConfig(device="cuda", max_num_seqs=MAX_NUM_SEQS, max_model_len=96, block_size=8,
                     max_num_batched_tokens=64, cudagraph_mode=mode, seed=0,
                     cudagraph_prefill_tokens=prefill_tokens if graphs else (), cudagraph_mixed=mixed,
                     **(kernels or {})),
        SpeculatorConfig(cudagraph_mode=mode, cudagraph_num_speculative_tokens=captured_depths, **spec),
        # EOS (id 2) is honoured: requests finish at different steps, so batches change every step.
        SamplingConfig(max_new_tokens=24, ignore_eos=False), eos_token_ids=[2], step_costs=COSTS,
    )


def _captured(engine):
    return {m.name: set(m.graphs) for m in engine.graph_managers()}


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_graphs_of_every_k_replay_the_eager_tokens_and_none_is_captured_later(pairs, pair, mode):
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(60, seed=3)
    eager = _engine(target, draft, MODES[mode], graphs=False).generate(prompts)
    engine = _engine(target, draft, MODES[mode], graphs=True)
    before = _captured(engine)
    graphed = engine.generate(prompts)
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    assert _captured(engine) == before, "no capture after start-up"
    assert all(not m.num_eager_uncaptured for m in engine.graph_managers())
    visited = {s.num_speculative_tokens for s in graphed.steps}
    decode = engine.speculator.decode_graphs
    assert {k for _, k, _ in decode.replays_per_graph} == {k for k in visited if k >= 2}
    if mode == "schedule":
        assert visited == set(range(6))
    uniform_verifies = sum(1 for s in graphed.steps if s.num_prefill_tokens == 0)
    assert engine.verify_graphs.num_replays == uniform_verifies


def test_left_out_depths_run_eager_and_are_counted(pairs):
    target_dir, draft_dir = pairs["lfm2+lfm2"]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(60, seed=4)
    eager = _engine(target, draft, EVERY_K, graphs=False).generate(prompts)
    engine = _engine(target, draft, EVERY_K, graphs=True, captured_depths=(0, 2, 5))
    out = engine.generate(prompts)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
    decode_left_out = sum(1 for s in out.steps if s.num_speculative_tokens in (3, 4))
    assert sum(engine.speculator.decode_graphs.num_eager_uncaptured.values()) == decode_left_out > 0
    assert all(k in (0, 2, 5) for m in engine.graph_managers() if m.per_k for _, k, _ in m.graphs)


def test_graph_memory_and_time_are_recorded_per_manager_size_and_k(pairs):
    target_dir, draft_dir = pairs["llama+llama"]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    engine = _engine(target, draft, EVERY_K, graphs=True)
    managers = engine.graph_summary()["managers"]
    verify_keys = engine.graph_keys.verify
    # the draft's prefill of two-slot regions (a draft without conv state): one graph a size, whatever k
    assert engine.speculator.last_two_regions
    expected = {"target_verify": verify_keys, "draft_prefill": {(size, 0) for size, _ in verify_keys},
                "draft_decode": engine.graph_keys.decode}
    for name, keys in expected.items():
        records = managers[name]["per_size"]
        assert {(r["num_reqs"], r["num_speculative_tokens"]) for r in records} == set(keys)
        assert all(r["capture_s"] > 0 for r in records)
    assert engine.graph_summary()["graph_capture_bytes"] > 0


def test_synthetic_acceptance_set_between_runs_reaches_the_captured_graphs(pairs):
    """The verify graphs sample with the engine's synthetic rates: changing them on a built engine changes what
    its replays accept (a rate baked into the capture would keep the first one)."""
    target_dir, draft_dir = pairs["llama+llama"]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    spec = dict(num_speculative_tokens=4, rejection="synthetic", synthetic_acceptance_rate=1.0)
    engine = _engine(target, draft, spec, graphs=True)
    prompts = _prompts(8, seed=5)
    for rate in (1.0, 0.0, 1.0):
        engine.set_synthetic_acceptance(rate=rate)
        out = engine.generate(prompts, max_new_tokens=16)
        verifies = [s for s in out.steps if s.num_prefill_tokens == 0 and s.num_draft_tokens]
        assert verifies and engine.verify_graphs.num_replays > 0
        assert all(s.num_accepted_tokens == (s.num_draft_tokens if rate else 0) for s in verifies), rate


TRITON_KERNELS = dict(attention_kernel="triton", conv_kernel="triton")


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("spec", ["static", "schedule"])
@pytest.mark.parametrize("mixed", ["parts", "joined", "joined-triton"])
def test_mixed_steps_replay_graphs_and_keep_the_eager_tokens(pairs, pair, spec, mixed):
    """A closed loop of 8 (each new prompt joins the running verify rows): every mixed step, and every step of
    prompt chunks alone, replays graphs, in parts (the verify rows' graph and a prompt graph per chunk) or joined
    (one graph of all the step's rows where a chunk shape holds them; the rest in parts), in the target and the
    draft, and the tokens are the eager engine's (joined-triton: both engines on the Triton attention and conv
    kernels, which the joined graphs' segments run on)."""
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    spec = dict(num_speculative_tokens=4) if spec == "static" else EVERY_K
    kernels = TRITON_KERNELS if mixed == "joined-triton" else None
    prompts = _prompts(60, seed=5)
    eager = _engine(target, draft, spec, graphs=False, kernels=kernels).generate(prompts, max_concurrency=8)
    engine = _engine(target, draft, spec, graphs=True, prefill_tokens=(16, 32), mixed=mixed.split("-")[0],
                     kernels=kernels)
    graphed = engine.generate(prompts, max_concurrency=8)
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    mixed_steps = sum(1 for s in graphed.steps if 0 < s.num_prefill_tokens < s.num_tokens)
    assert mixed_steps >= 30 and engine.num_mixed_in_parts + engine.num_mixed_joined == mixed_steps
    joined = engine.num_mixed_joined, engine.speculator.num_mixed_joined
    assert min(joined) > mixed_steps // 2 if mixed != "parts" else joined == (0, 0)
    prompts_only = sum(1 for s in graphed.steps if s.num_prefill_tokens == s.num_tokens and s.num_reqs > 1)
    # steps of prompt chunks alone (chunks of <= 23 tokens: every one fits a prompt graph) replay graphs too
    assert prompts_only > 0
    assert engine.num_prompt_batches_graphed == engine.speculator.num_prompt_batches_graphed == prompts_only
    assert engine.verify_graphs.num_eager == engine.speculator.prefill_graphs.num_eager == 0
