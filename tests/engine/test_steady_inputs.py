"""A steady step's inputs advanced on the device (`engine.steady_inputs_on_device`, `specexp.engine.verify_advance`):
after every step the engine advances instead of staging from the host, its buffers hold exactly what the host
would have staged (tokens, positions, KV slots, token rows, query layout, sequence lengths, block tables, the
sampler's row inputs, padding included), whatever the batch does: requests stopping at EOS or max_new_tokens,
new ones joining, prompts in chunks, rows crossing into new KV blocks, depths changing, plain decoding with
lookahead; and the tokens are those of the engine that stages every step on the host (CPU emulation of graphs)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pairs import VOCAB, random_prompts

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.runner import NativeEngine
from specexp.models import load_model


@pytest.fixture(scope="module")
def models(pair_dirs):
    models = {name: (load_model(t), load_model(d)) for name, (t, d) in pair_dirs.items()}
    models["llama+lfm2"] = (models["llama+llama"][0], models["lfm2+lfm2"][1])  # an attention target, a hybrid draft
    return models


def _engine(models, pair, k, steady, *, max_num_seqs=3, budget=None, temperature=0.0, max_new=12, eos=(2,),
            lookahead=True, spec=None, region="auto", launch_graphs=True):
    """An engine replaying full graphs (emulated on a CPU; captured on a GPU, with the Triton kernels) on the
    models' device."""
    target, draft = models[pair]
    device = next(target.parameters()).device.type
    kernels = {} if device == "cpu" else {"sampler_kernel": "triton", "draft_step_kernel": "triton"}
    return NativeEngine(
        target, draft if k else None,
        EngineConfig(device=device, max_num_seqs=max_num_seqs, max_model_len=64, block_size=4,
                     max_num_batched_tokens=budget, cudagraph_mode="full", cudagraph_capture_sizes=(1, 2, 4),
                     steady_inputs_on_device=steady, plain_decode_lookahead=lookahead, draft_prefill_region=region,
                     launch_graphs=launch_graphs, **kernels),
        SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode="full", **(spec or {})),
        SamplingConfig(temperature=temperature, max_new_tokens=max_new, ignore_eos=False),
        eos_token_ids=list(eos), emulate_graphs_on_cpu=device == "cpu",
    )


def _snapshot(engine: NativeEngine, num_reqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
    """What a graph replay of num_reqs rows / num_tokens tokens (padded) reads of the staged inputs."""
    b = engine.buffers
    return {"tokens": b.tokens[:, :num_tokens].clone(), "query_start_loc": b.query_start_loc[: num_reqs + 1].clone(),
            "seq_lens": b.seq_lens[:num_reqs].clone(), "block_table": b.block_table[:num_reqs].clone(),
            "row_inputs": engine.row_inputs[:num_reqs].clone(),
            # a target with conv state: the conv metadata its graphs read, padding included
            "conv": engine.conv_builder.spec_graph_buffers.buffer.clone() if engine.conv_states else None}


def checked_against_the_host(engine: NativeEngine) -> list[int]:
    """Wrap the engine's staging: after each step it advances on the device, stage the same step from the host and
    require identical buffers (then carry on as if the step had been advanced). Returns a list that counts the
    advanced steps (its length)."""
    advanced = []
    stage = engine._stage_step

    def stage_and_check(batch, desc):
        prep = stage(batch, desc)
        if prep is None:
            advanced.append(batch.num_reqs)
            on_device = _snapshot(engine, desc.num_reqs, desc.num_tokens)
            table_for_the_draft = engine._staged.block_table  # what _verified_batch hands the speculator
            host_prep = engine._prepare_target_inputs(batch, desc)
            assert torch.equal(table_for_the_draft, host_prep["block_table"])
            from_host = _snapshot(engine, desc.num_reqs, desc.num_tokens)
            for name, tensor in from_host.items():
                assert (tensor is None and on_device[name] is None) or torch.equal(on_device[name], tensor), (
                    name, on_device[name], tensor)
            engine._staged.version = engine.buffers.version
        return prep

    engine._stage_step = stage_and_check
    if engine.speculator is not None:
        _check_draft_prefill_against_the_host(engine.speculator, advanced)
    return advanced


def _check_draft_prefill_against_the_host(spec, advanced: list) -> None:
    """As checked_against_the_host, for the draft's prefill (`draft_steady.advance_prefill`, or the two-slot
    regions' `draft_catch_up`): its buffers, the rows' last-token indices and the device facts it hands the decode
    steps. Counts the draft's advances in `advanced` as -R."""
    prepare = spec._prepare_prefill_inputs

    def prepare_and_check(batch, desc, *args, **kwargs):
        version = spec.prefill_buffers.version
        rows = prepare(batch, desc, *args, **kwargs)
        if spec.prefill_buffers.version != version:
            return rows  # staged from the host (a load counts a version)
        assert batch.target_buffers is not None and not args and not kwargs
        advanced.append(-batch.query_lens.numel())
        b = spec.prefill_buffers
        on_device = {"tokens": b.tokens[:, : desc.num_tokens].clone(), "seq_lens": b.seq_lens[: desc.num_reqs].clone(),
                     "query_start_loc": b.query_start_loc[: desc.num_reqs + 1].clone(),
                     "block_table": b.block_table[: desc.num_reqs].clone(),
                     "last_token_indices": spec.last_token_indices[: desc.num_reqs].clone()}
        facts = {name: getattr(rows, name).clone() for name in ("num_valid", "start", "samples")}
        from_host = prepare(dataclasses.replace(batch, target_buffers=None), desc)
        for name, tensor in facts.items():
            assert torch.equal(tensor, getattr(from_host, name)), name
        now = {"tokens": b.tokens[:, : desc.num_tokens], "seq_lens": b.seq_lens[: desc.num_reqs],
               "query_start_loc": b.query_start_loc[: desc.num_reqs + 1], "block_table": b.block_table[: desc.num_reqs],
               "last_token_indices": spec.last_token_indices[: desc.num_reqs]}
        for name, tensor in on_device.items():
            assert torch.equal(tensor, now[name]), (name, tensor, now[name])
        return rows

    spec._prepare_prefill_inputs = prepare_and_check


def _outputs(out) -> list[tuple]:
    return [(r.output_token_ids, r.finish_reason, r.verifies, r.emitted_per_step) for r in out.requests]


def _check(models, pair, k, prompts, *, expect_advanced=True, **kw):
    """Host staging against device advances: checked step by step (each advanced step also staged from the host,
    which the next step then advances from), and unchecked (advance after advance); the same outputs all three."""
    host = _engine(models, pair, k, False, **kw).generate(prompts)
    assert _outputs(_engine(models, pair, k, True, **kw).generate(prompts)) == _outputs(host)
    engine = _engine(models, pair, k, True, **kw)
    advanced = checked_against_the_host(engine)
    out = engine.generate(prompts)
    assert _outputs(out) == _outputs(host)
    if expect_advanced:
        assert any(n > 0 for n in advanced), "no step was advanced on the device"
        if k > 0:
            assert any(n < 0 for n in advanced), "no draft prefill was advanced on the device"
    return advanced


@pytest.mark.parametrize("k, region", [(0, "full"), (1, "full"), (1, "last_two"), (3, "full"), (3, "last_two")])
@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_advanced_steps_equal_host_staging(models, k, max_num_seqs, region):
    """Requests of different lengths stopping at EOS or max_new_tokens, a batch that shrinks and refills; the draft's
    prefill over each row's v + 2 slots or its last two (k = 0 runs no draft: one region setting)."""
    prompts = random_prompts([5, 11, 2, 9, 14], seed=3)
    _check(models, "llama+llama", k, prompts, max_num_seqs=max_num_seqs, max_new=16, eos=(2, 19), region=region)
    advanced = _check(models, "llama+llama", k, prompts, max_num_seqs=max_num_seqs, max_new=16, eos=(),
                      region=region)
    assert max(advanced) == max_num_seqs  # batches of every row advanced too (sizes 1, 2, 4 capture 3 rows as 3)
    if k:
        assert -min(advanced) == max_num_seqs


def test_advanced_with_prompt_chunks_and_plain_read_back(models):
    """A token budget that splits prompts into chunks beside verify rows; k = 0 read back every step."""
    prompts = random_prompts([15, 3, 12, 7], seed=8)
    _check(models, "llama+llama", 2, prompts, max_num_seqs=3, budget=6)
    _check(models, "llama+llama", 0, prompts, max_num_seqs=3, budget=6, lookahead=False)


def test_advanced_with_sampling_and_changing_depth(models):
    """Temperature sampling (the same draws either way) and a depth that follows the batch size."""
    prompts = random_prompts([4, 9, 6, 13, 2], seed=4)
    _check(models, "llama+llama", 3, prompts, temperature=1.0)
    spec = {"num_speculative_tokens_per_batch_size": ((1, 1, 3), (2, 2, 1), (3, 4, 2))}
    _check(models, "llama+llama", 3, prompts, spec=spec)


@pytest.mark.parametrize("k", [0, 2])
def test_targets_with_conv_state_advance_too(models, k):
    """An LFM2 target: its graphs' conv metadata (accepted counts) advanced with the rest; an unrelated Llama draft's
    prefill too."""
    prompts = random_prompts([6, 3, 10], seed=1)
    _check(models, "lfm2+llama", k, prompts, max_num_seqs=2, max_new=14, eos=(2,))


def test_hybrid_drafts_stage_their_prefill_on_the_host(models):
    """A draft with conv state builds its prefill's conv metadata on the host: its target's steps advance on the
    device, its prefills do not."""
    prompts = random_prompts([6, 3], seed=1)
    for pair in ("lfm2+lfm2", "llama+lfm2"):
        advanced = _check(models, pair, 2, prompts, expect_advanced=False)
        assert [n for n in advanced if n > 0] and not [n for n in advanced if n < 0], pair


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_advanced_steps_property(models, data):
    lens = data.draw(st.lists(st.integers(1, 16), min_size=1, max_size=5))
    prompts = [data.draw(st.lists(st.integers(3, VOCAB - 1), min_size=n, max_size=n)) for n in lens]
    _check(models, data.draw(st.sampled_from(["llama+llama", "lfm2+llama"])), data.draw(st.integers(0, 4)), prompts,
           expect_advanced=False,
           max_num_seqs=data.draw(st.integers(1, 4)), budget=data.draw(st.sampled_from([None, 5, 9])),
           max_new=data.draw(st.integers(1, 14)), region=data.draw(st.sampled_from(["full", "last_two"])),
           eos=data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=3, unique=True)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("k", [0, 1, 4])
def test_advanced_steps_equal_host_staging_on_gpu(pair_dirs, k):
    """Captured graphs and the Triton kernels (`verify_advance`): the same buffers and tokens, an attention-only
    and a hybrid target."""
    prompts = random_prompts([5, 11, 2, 9, 14], seed=3)
    for pair in ("llama+llama", "lfm2+llama"):
        models = {pair: tuple(load_model(path, device="cuda") for path in pair_dirs[pair])}
        for max_num_seqs in (1, 3):  # EOS stops (few steady steps, maybe none), then none (steady runs)
            _check(models, pair, k, prompts, max_num_seqs=max_num_seqs, max_new=16, eos=(2, 19), expect_advanced=False)
            _check(models, pair, k, prompts, max_num_seqs=max_num_seqs, max_new=16, eos=())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_launch_graphs_off_launches_the_advance_from_python(pair_dirs):
    """`engine.launch_graphs`: on, the steady advance is replayed from small graphs; off, launched from Python
    every step (none captured); the same outputs. One row at a time, so that every decode step after the first
    replays a graph and is steady."""
    prompts = random_prompts([5, 11, 9], seed=4)
    models = {"llama+llama": tuple(load_model(path, device="cuda") for path in pair_dirs["llama+llama"])}
    outputs = {}
    for on in (True, False):
        engine = _engine(models, "llama+llama", 2, True, max_num_seqs=1, max_new=16, eos=(), launch_graphs=on)
        outputs[on] = _outputs(engine.generate(prompts))
        assert (engine._advance_launches.num_graphs > 0) == on
    assert outputs[True] == outputs[False]
