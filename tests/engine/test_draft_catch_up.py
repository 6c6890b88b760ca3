"""The draft's prefill over each verify row's last two slots (`engine.draft_prefill_region=last_two`,
`specexp.engine.draft_catch_up`): the device step follows its rule for any rows, padding and block tables; engines
that use it emit the target's greedy tokens at every depth, batch size and graph mode, with acceptance equal to
the full region's; one draft prefill graph a batch size serves every k; a draft with conv state is refused."""

from __future__ import annotations

import pytest
import torch
from catch_up_reference import check_against_reference, random_case
from hypothesis import given, settings
from hypothesis import strategies as st
from pairs import random_prompts

from specexp.engine.config import EngineConfig, EngineConfigError, SamplingConfig, SpeculatorConfig
from specexp.engine.depth import GraphKeys, StaticDepth, describe_graph_cost, graph_keys
from specexp.engine.draft_catch_up import place_last_two
from specexp.engine.runner import NativeEngine
from specexp.models import load_model


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_reqs=st.integers(0, 5), pad=st.integers(0, 3), q=st.integers(1, 9),
       block_size=st.sampled_from([1, 4, 16]), copy_table=st.booleans())
def test_regions_follow_the_rule_row_by_row(seed, num_reqs, pad, q, block_size, copy_table):
    """Every buffer as a per-row reading of the rule says, padding rows and slots past 2R untouched (but the draft-0
    slot of padding rows, 0); rows that emitted nothing read as having emitted one."""
    num_blocks = -(-(q + 3) // block_size) + 2
    check_against_reference(place_last_two, random_case(seed, num_reqs, num_reqs + pad, q, block_size, num_blocks,
                                                        copy_table))


@pytest.fixture(scope="module")
def models(pair_dirs):
    return {name: (load_model(t), load_model(d)) for name, (t, d) in pair_dirs.items()}


def _generate(models, pair, k, region, *, max_num_seqs=3, graphs=False, spec=None, budget=None, max_new=14,
              temperature=0.0):
    target, draft = models[pair]
    engine = NativeEngine(
        target, draft if k else None,
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, block_size=4, max_num_batched_tokens=budget,
                     cudagraph_mode="full" if graphs else "none", cudagraph_capture_sizes=(1, 2, 4),
                     draft_prefill_region=region),
        SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode="full" if graphs else "none", **(spec or {})),
        SamplingConfig(temperature=temperature, max_new_tokens=max_new, ignore_eos=True),
        eos_token_ids=[2], emulate_graphs_on_cpu=graphs,
    )
    return engine, engine.generate(random_prompts([5, 11, 2, 9, 14], seed=3))


def _tokens(out) -> list[list[int]]:
    return [r.output_token_ids for r in out.requests]


def _accepted(out) -> list[int]:
    return [s.num_accepted_tokens for s in out.steps]


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("max_num_seqs", [1, 3])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_two_slot_regions_are_lossless_and_accept_as_the_full_ones(models, k, max_num_seqs, graphs):
    """Greedy: the target's own tokens (a k = 0 run) and, step by step, the drafts accepted with the full region
    (a noisy-copy draft that accepts some drafts and rejects others)."""
    plain = _tokens(_generate(models, "llama+llama", 0, "full", max_num_seqs=max_num_seqs)[1])
    _, full = _generate(models, "llama+llama", k, "full", max_num_seqs=max_num_seqs, graphs=graphs)
    engine, two = _generate(models, "llama+llama", k, "last_two", max_num_seqs=max_num_seqs, graphs=graphs)
    assert engine.speculator.last_two_regions
    assert _tokens(full) == _tokens(two) == plain
    assert _accepted(two) == _accepted(full)
    assert 0 < sum(_accepted(two)) < sum(s.num_draft_tokens for s in two.steps)  # partial acceptance exercised


def test_two_slot_regions_with_prompt_chunks_sampling_and_changing_depth(models):
    """Prompt chunks beside verify rows (mixed steps), a depth that follows the batch size, temperature sampling
    (the same draws either way), an attention target and an LFM2 target."""
    schedule = {"num_speculative_tokens_per_batch_size": ((1, 1, 3), (2, 2, 1), (3, 4, 2))}
    for pair in ("llama+llama", "lfm2+llama"):
        for kw in ({"budget": 6}, {"spec": schedule}, {"temperature": 1.0}):
            full = _generate(models, pair, 3, "full", **kw)[1]
            two = _generate(models, pair, 3, "last_two", **kw)[1]
            assert _tokens(two) == _tokens(full) and _accepted(two) == _accepted(full), (pair, kw)


def test_one_draft_prefill_graph_a_size_serves_every_depth(models):
    """Dynamic depth: the draft prefill manager captures (size, 0) once per size, replays it at every k, and the
    start-up line counts it so."""
    schedule = {"num_speculative_tokens_per_batch_size": ((1, 1, 3), (2, 2, 1), (3, 4, 2))}
    engine, out = _generate(models, "llama+llama", 3, "last_two", graphs=True, spec=schedule)
    manager = engine.speculator.prefill_graphs
    sizes = engine.graph_keys.draft_prefill_sizes()
    assert not manager.per_k and manager.keys == tuple((size, 0) for size in sizes) and len(sizes) >= 2
    assert manager.num_replays > 0 and {k for _, k, _ in manager.replays_per_graph} == {0}
    assert {s.num_speculative_tokens for s in out.steps} >= {1, 2, 3}
    full_engine, _ = _generate(models, "llama+llama", 3, "full", graphs=True, spec=schedule)
    assert len(full_engine.speculator.prefill_graphs.keys) > len(manager.keys)
    keys = GraphKeys(verify=((1, 1), (1, 4), (2, 1), (4, 1)), decode=((1, 4),), left_out_verify=((1, 3), (4, 3)))
    static = graph_keys(StaticDepth(4).step_depths, [1, 2, 4], 4)
    line = describe_graph_cost(keys, static, 2, {1, 3, 4}, last_two_regions=True)
    assert "16 graphs (target verify 4, draft prefill 3, draft decode 1 keys x 2" in line
    assert "a static k would capture 18" in line and "; 2 keys left out" in line
    assert "18 graphs (target verify 4, draft prefill 4" in describe_graph_cost(keys, static, 2, {1, 3, 4})


def test_auto_takes_two_slots_for_attention_drafts_only_and_last_two_refuses_conv_drafts(models):
    assert _generate(models, "lfm2+llama", 2, "auto", max_new=2)[0].speculator.last_two_regions
    assert not _generate(models, "lfm2+lfm2", 2, "auto", max_new=2)[0].speculator.last_two_regions
    with pytest.raises(EngineConfigError, match="draft_prefill_region=last_two .* short-conv layers"):
        _generate(models, "lfm2+lfm2", 2, "last_two", max_new=2)
    with pytest.raises(EngineConfigError, match=r"draft_prefill_region='two'.*'auto', 'full', 'last_two'"):
        EngineConfig(draft_prefill_region="two").validate()


def test_the_full_region_is_unchanged_for_conv_drafts(models):
    """auto on a hybrid draft: the full region, lossless."""
    plain = _tokens(_generate(models, "lfm2+lfm2", 0, "full")[1])
    assert _tokens(_generate(models, "lfm2+lfm2", 3, "auto", graphs=True)[1]) == plain


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_slot_regions_on_gpu(pair_dirs):
    """Captured graphs with the Triton step kernels: the tokens and acceptance of the full region."""
    gpu = {name: (load_model(t, device="cuda"), load_model(d, device="cuda")) for name, (t, d) in pair_dirs.items()}
    for k in (1, 4):
        outs = []
        for region in ("full", "last_two"):
            target, draft = gpu["llama+llama"]
            engine = NativeEngine(
                target, draft,
                EngineConfig(device="cuda", max_num_seqs=3, max_model_len=64, block_size=4, cudagraph_mode="full",
                             cudagraph_capture_sizes=(1, 2, 4), draft_step_kernel="triton", sampler_kernel="triton",
                             draft_prefill_region=region),
                SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode="full"),
                SamplingConfig(temperature=0.0, max_new_tokens=14, ignore_eos=True), eos_token_ids=[2])
            outs.append(engine.generate(random_prompts([5, 11, 2, 9, 14], seed=3)))
        assert _tokens(outs[0]) == _tokens(outs[1]) and _accepted(outs[0]) == _accepted(outs[1])
