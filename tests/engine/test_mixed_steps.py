"""Mixed steps (CUDA graphs emulated on the CPU): a step of verify rows beside prompt chunks replays graphs, not one
eager forward. In parts: the verify rows' graph and a prompt graph per chunk, in the target and in the draft, then
one draft-decode graph. Joined (the default): one target graph of the verify rows and a lone chunk (a segmented
forward), the draft in parts. Either serves the eager engine's tokens and keeps the target's distribution when
sampling."""

from __future__ import annotations

import pytest
from pairs import random_prompts, save_tiny, second_token_pvalue, tiny_hf_model

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.mixed_graphs import chunk_shapes
from specexp.engine.mixed_steps import split_point
from specexp.engine.runner import NativeEngine
from specexp.models import load_model

EOS = 2
PROMPT_LENS = [3, 11, 6, 17, 1, 9, 14, 2, 7, 20, 5, 12, 4, 15]
SPECS = {
    "k0": dict(num_speculative_tokens=0),
    "k3": dict(num_speculative_tokens=3),
    "schedule": dict(num_speculative_tokens=4, num_speculative_tokens_per_batch_size=((1, 1, 4), (2, 2, 1), (3, 4, 3))),
    "confidence": dict(num_speculative_tokens=4, draft_confidence_threshold=0.5),
}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(PROMPT_LENS, seed=7)


def _engine(target, draft, spec: dict, mode: str, temperature=0.0, max_new=10, seed=0, prefill_tokens=(8, 16),
            budget=16, mixed="parts"):
    return NativeEngine(
        target, draft,
        EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, max_num_batched_tokens=budget, cudagraph_mode=mode,
                     cudagraph_prefill_tokens=prefill_tokens if mode == "full" else (), seed=seed,
                     cudagraph_mixed=mixed,
                     plain_decode_lookahead=True),  # k = 0: a step's pending tokens come from the step before
        SpeculatorConfig(cudagraph_mode=mode, **spec),
        SamplingConfig(temperature=temperature, max_new_tokens=max_new, ignore_eos=False),
        eos_token_ids=[EOS], emulate_graphs_on_cpu=True,
    )


def _kinds(steps):
    """(mixed steps: prefill and verify tokens; steps of several prompt chunks and no verify row)."""
    mixed = sum(1 for s in steps if 0 < s.num_prefill_tokens < s.num_tokens)
    prompts_only = sum(1 for s in steps if s.num_prefill_tokens == s.num_tokens and s.num_reqs > 1)
    return mixed, prompts_only


def test_split_point_takes_only_verify_rows_of_one_length_then_prompt_chunks():
    assert split_point([True, True, False], [4, 4, 9]) == 2
    assert split_point([True, False, False], [1, 3, 16]) == 1
    assert split_point([True, True], [4, 4]) is None  # pure verify
    assert split_point([False, False], [3, 5]) == 0  # prompt chunks alone
    assert split_point([False], [5]) is None  # a lone chunk: its prompt graph
    assert split_point([True, True, False], [4, 2, 9]) is None  # verify rows of two lengths
    assert split_point([True, False, True], [4, 9, 4]) is None  # out of the scheduler's order


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_mixed_steps_in_parts_serve_the_eager_tokens(pair_dirs, prompts, pair, spec):
    """A closed loop of 3 requests (each new one's prompt chunks join the running verify rows), prompts of 1-20
    tokens in chunks of at most 16, requests ending at EOS or max_new_tokens: every mixed step runs in parts, and so
    do steps of several prompt chunks alone (a prompt graph each); tokens and verifies are the eager engine's."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    eager = _engine(target, draft, SPECS[spec], "none").generate(prompts, max_concurrency=3)
    engine = _engine(target, draft, SPECS[spec], "full")
    out = engine.generate(prompts, max_concurrency=3)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
    assert [r.verifies for r in out.requests] == [r.verifies for r in eager.requests]
    mixed, prompts_only = _kinds(out.steps)
    assert mixed >= len(prompts) // 2, f"only {mixed} mixed steps"
    assert engine.num_mixed_in_parts == mixed
    assert engine.graph_summary()["mixed_steps_in_parts"] == mixed
    assert prompts_only > 0 and engine.num_prompt_batches_graphed == prompts_only
    assert engine.graph_summary()["prompt_batches_graphed"] == prompts_only
    assert engine.verify_graphs.num_eager == 0
    speculator = engine.speculator
    if speculator is None:  # k = 0 without a draft
        return
    assert speculator.prefill_graphs.num_eager == 0
    assert speculator.num_prompt_batches_graphed == prompts_only
    target_prompts = sum(m.num_replays for m in engine.prefill_graphs.managers.values())
    assert sum(m.num_replays for m in speculator.prompt_graphs.managers.values()) == target_prompts


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_joined_mixed_steps_serve_the_eager_tokens(pair_dirs, prompts, pair, spec):
    """A closed loop of 4 with joined graphs (a budget of 32 tokens: two chunks of up to 16 fit a step): a mixed
    step (one to three chunks beside verify rows, the chunks taking the last rows), or a step of several chunks
    alone (beside one inert verify row), whose chunks fit a captured shape (M >= chunks rows of C >= the longest)
    replays one joined target graph and one joined draft-prefill graph, counted per chunk shape, any other in
    parts; tokens and verifies are the eager engine's."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    eager = _engine(target, draft, SPECS[spec], "none", budget=32).generate(prompts, max_concurrency=4)
    engine = _engine(target, draft, SPECS[spec], "full", mixed="joined", budget=32)
    choices = []  # per mixed batch: (verify rows, its chunks, its longest chunk, how it ran: joined / parts / eager)
    choose = engine._mixed_parts

    def spy(batch):
        parts = choose(batch)
        chunks = [r.num_query_tokens for r in batch.rows if r.is_prefill]
        num_verify = len(batch.rows) - len(chunks)
        if chunks and (num_verify or len(chunks) >= 2):
            choices.append((num_verify, len(chunks), max(chunks),
                            "eager" if parts is None else "joined" if parts.joined is not None else "parts"))
        return parts

    engine._mixed_parts = spy
    out = engine.generate(prompts, max_concurrency=4)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
    assert [r.verifies for r in out.requests] == [r.verifies for r in eager.requests]
    mixed, prompts_only = _kinds(out.steps)
    if spec == "k3":  # this loop admits several prompts beside verify rows in some steps
        assert any(nv and num >= 2 and ran == "joined" for nv, num, _, ran in choices), choices
    assert any(not nv and ran == "parts" for nv, *_, ran in choices), choices  # the first step: 4 chunks, M <= 3
    shapes = engine.mixed_graphs.managers
    assert len(choices) == mixed + prompts_only
    for _, num, longest, ran in choices:
        expected = ("eager" if longest > 16 else
                    "joined" if any(m >= num and c >= longest for m, c in shapes) else "parts")
        assert ran == expected, (num, longest, ran)
    joined_mixed = sum(bool(nv) and ran == "joined" for nv, *_, ran in choices)
    assert joined_mixed == engine.num_mixed_joined
    assert sum(bool(nv) and ran == "parts" for nv, *_, ran in choices) == engine.num_mixed_in_parts
    assert sum(not nv and ran != "eager" for nv, *_, ran in choices) == engine.num_prompt_batches_graphed
    summary = engine.graph_summary()
    assert summary["mixed_steps_joined"] == engine.num_mixed_joined
    joined_replays = sum(m["num_replays"] for name, m in summary["managers"].items() if name.startswith("target_mixed"))
    assert joined_replays == sum(ran == "joined" for *_, ran in choices)
    num_eager = sum(ran == "eager" for *_, ran in choices)
    assert engine.verify_graphs.num_eager == num_eager
    speculator = engine.speculator
    if speculator is not None:
        assert speculator.prefill_graphs.num_eager == num_eager
        assert speculator.num_mixed_joined == engine.num_mixed_joined
        assert speculator.num_prompt_batches_graphed == engine.num_prompt_batches_graphed
        assert sum(m["num_replays"] for name, m in summary["managers"].items()
                   if name.startswith("draft_mixed")) == joined_replays
        target_prompts = sum(m.num_replays for m in engine.prefill_graphs.managers.values())
        assert sum(m.num_replays for m in speculator.prompt_graphs.managers.values()) == target_prompts


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("spec", ["k0", "k3", "schedule"])
def test_prompt_chunks_alone_replay_one_joined_graph(pair_dirs, prompts, pair, spec):
    """The first step of a closed loop of 3 holds three prompt chunks and no verify row: it replays one joined
    target graph (its verify segment one inert row) and one joined draft prefill, and the run serves the eager
    engine's tokens."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    eager = _engine(target, draft, SPECS[spec], "none", budget=32).generate(prompts[:6], max_concurrency=3)
    engine = _engine(target, draft, SPECS[spec], "full", mixed="joined", budget=32)
    ran = []
    choose = engine._mixed_parts
    engine._mixed_parts = lambda batch: ran.append(choose(batch)) or ran[-1]
    out = engine.generate(prompts[:6], max_concurrency=3)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
    assert [r.verifies for r in out.requests] == [r.verifies for r in eager.requests]
    first = out.steps[0]
    assert first.num_reqs == 3 and first.num_prefill_tokens == first.num_tokens
    assert ran[0] is not None and ran[0].joined is not None and ran[0].joined[2][0] == 3  # M = 3 chunk rows
    assert ran[0].joined[0].num_reqs == 1  # the inert verify segment
    assert engine.num_prompt_batches_graphed >= 1
    joined = sum(m.num_replays for m in engine.mixed_graphs.managers.values())
    assert joined == engine.num_mixed_joined + engine.num_prompt_batches_graphed
    if engine.speculator is not None:
        assert engine.speculator.num_prompt_batches_graphed == engine.num_prompt_batches_graphed
        assert engine.speculator.prefill_graphs.num_eager == engine.verify_graphs.num_eager


def test_joined_graphs_are_captured_per_chunk_shape_and_verify_key_below_max_num_seqs(pair_dirs):
    """max_num_seqs 4, capture sizes 1, 2, 4, a budget of 16 tokens, prompt graphs of 8 and 16: chunk shapes of M
    rows x C slots, M = 1, 2, ... up to min(16 // C + 2, 3); joined graphs hold verify rows up to 4 - M at each; the
    draft's regions are one slot longer; `parts` captures none."""
    target, draft = (load_model(d) for d in pair_dirs["lfm2+lfm2"])
    engine = _engine(target, draft, SPECS["k3"], "full", mixed="joined")
    assert sorted(engine.mixed_graphs.managers) == [(1, 8), (1, 16), (2, 8), (2, 16), (3, 8), (3, 16)]
    for (rows, _), manager in engine.mixed_graphs.managers.items():
        expected = sorted({(min(size, 4 - rows), 3) for size in (1, 2, 4)})
        assert sorted({(size, k) for size, k, _ in manager.graphs}) == expected
    assert sorted(engine.speculator.mixed_graphs.managers) == [(1, 9), (1, 17), (2, 9), (2, 17), (3, 9), (3, 17)]
    assert not _engine(target, draft, SPECS["k3"], "full", mixed="parts").mixed_graphs.managers


def test_chunk_shapes_cover_the_budget_in_powers_of_two():
    """Per count C: 1, 2, 4, ... up to the whole chunks of C a budget holds plus a partial one at each end (416 //
    64 + 2 = 8: a prompt's last 38 tokens, five of 64, the next prompt's first 8), at most max_num_seqs - 1."""
    assert chunk_shapes((16, 64), 416, 64) == ((1, 16), (1, 64), (2, 16), (2, 64), (4, 16), (4, 64), (8, 16),
                                               (8, 64), (16, 16), (28, 16))
    assert chunk_shapes((16,), 416, 8) == ((1, 16), (2, 16), (4, 16), (7, 16))
    assert chunk_shapes((128,), 64, 8) == ((1, 128), (2, 128))
    assert chunk_shapes((16,), 416, 1) == ()


def test_a_chunk_without_a_graph_keeps_the_step_eager(pair_dirs, prompts):
    """Prompt graphs of 8 tokens only, a budget of 32 tokens a step: a mixed step with a longer chunk runs as one
    eager forward (target and draft), one with chunks of at most 8 in parts; the tokens are the eager engine's
    either way."""
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])
    spec = SPECS["k3"]
    eager = _engine(target, draft, spec, "none", budget=32).generate(prompts, max_concurrency=3)
    engine = _engine(target, draft, spec, "full", prefill_tokens=(8,), budget=32)
    out = engine.generate(prompts, max_concurrency=3)
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
    mixed, prompts_only = _kinds(out.steps)
    assert 0 < engine.num_mixed_in_parts < mixed
    assert engine.verify_graphs.num_eager == prompts_only + mixed - engine.num_mixed_in_parts


@pytest.mark.parametrize(("threshold", "mixed"), [(0.0, "parts"), (0.3, "parts"), (0.0, "joined"), (0.3, "joined")])
def test_sampling_through_mixed_steps_keeps_the_target_distribution(tmp_path, threshold, mixed):
    """At temperature 1 in a closed loop of 6, each request's prompt is prefilled in a mixed step, in parts or
    joined, and its first verify checks the draft sampled there (its token, probabilities and draft length moved to
    its row): the token after the first sampled one is distributed as the target's next-token distribution."""
    target_dir = save_tiny(tiny_hf_model("llama", 32, 1, seed=21), tmp_path / "t")
    draft_dir = save_tiny(tiny_hf_model("llama", 32, 1, seed=22), tmp_path / "d")
    target, draft = load_model(target_dir), load_model(draft_dir)
    prompt = [5, 9, 3, 7, 11, 4, 8, 6, 10, 12]
    spec = dict(num_speculative_tokens=3, draft_confidence_threshold=threshold)
    engine = _engine(target, draft, spec, "full", temperature=1.0, max_new=3, seed=3, mixed=mixed)
    out = engine.generate([prompt] * 1200, max_concurrency=6)
    assert engine.num_mixed_in_parts + engine.num_mixed_joined > 900
    assert engine.num_mixed_joined > 300 if mixed == "joined" else engine.num_mixed_joined == 0
    assert second_token_pvalue(target_dir, prompt, [r.output_token_ids for r in out.requests]) > 0.01
