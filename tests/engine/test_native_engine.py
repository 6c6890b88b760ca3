"""The native engine: greedy speculation is lossless, acceptance is exact, bad input is refused."""

from __future__ import annotations

import pytest
import torch
from pairs import VOCAB, random_prompts, save_tiny, second_token_pvalue, tiny_hf_model

from specexp.engine.config import EngineConfig, EngineConfigError, SamplingConfig, SpeculatorConfig
from specexp.engine.runner import NativeEngine
from specexp.models import load_model
from specexp.models.norm_folding import pre_norm_pairs

MAX_NEW = 10
PROMPT_LENS = [3, 11, 6, 17, 1, 9]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(PROMPT_LENS, seed=7)


@pytest.fixture(scope="module")
def hf_greedy(pair_dirs, prompts):
    """transformers' greedy generate of each target, EOS ignored."""
    from transformers import AutoModelForCausalLM

    refs = {}
    for name, (target_dir, _) in pair_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(target_dir, attn_implementation="eager").float().eval()
        outs = []
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                 min_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
            outs.append(out[0, len(p):].tolist())
        refs[name] = outs
    return refs


def _run(target_dir, draft_dir, prompts, k, max_num_seqs, budget=None, temperature=0.0, rejection="standard",
         draft_is_target=False):
    target = load_model(target_dir)
    draft = target if draft_is_target else load_model(draft_dir)
    engine = NativeEngine(
        target, draft,
        EngineConfig(max_num_seqs=max_num_seqs, max_model_len=64, block_size=4, max_num_batched_tokens=budget),
        SpeculatorConfig(num_speculative_tokens=k, rejection=rejection),
        SamplingConfig(temperature=temperature, max_new_tokens=MAX_NEW, ignore_eos=True),
        eos_token_ids=[2],
    )
    return engine.generate(prompts)


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("max_num_seqs", [1, 4, 16])
@pytest.mark.parametrize("k", range(9))
def test_greedy_speculation_is_lossless(pair_dirs, prompts, hf_greedy, pair, max_num_seqs, k):
    target_dir, draft_dir = pair_dirs[pair]
    out = _run(target_dir, draft_dir, prompts, k, max_num_seqs)
    got = [r.output_token_ids for r in out.requests]
    assert got == hf_greedy[pair]


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("k", [2, 5])
def test_chunked_prefill_mixed_with_verification_is_lossless(pair_dirs, prompts, hf_greedy, pair, k):
    target_dir, draft_dir = pair_dirs[pair]
    out = _run(target_dir, draft_dir, prompts, k, max_num_seqs=4, budget=3 * (k + 1) + 5)
    assert any(0 < s.num_prefill_tokens < s.num_tokens for s in out.steps), "prefill chunks ran beside verifies"
    assert [r.output_token_ids for r in out.requests] == hf_greedy[pair]


def test_speculation_accepts_partially_with_a_noisy_draft(pair_dirs, prompts):
    out = _run(*pair_dirs["lfm2+lfm2"], prompts, k=4, max_num_seqs=4)
    accepted = [a for r in out.requests for (_, a) in r.verifies]
    assert min(accepted) < 4 and max(accepted) > 0 and any(0 < a < 4 for a in accepted)


def _expected_acceptance_length(prompt_lens, k, max_new):
    """draft == target: every draft accepted; drafts are trimmed to the tokens still allowed."""
    drafts = accepted = 0
    for _ in prompt_lens:
        produced = 1  # the prefill samples the first token
        while produced < max_new:
            j = min(k, max_new - produced - 1)
            if j > 0:
                drafts += 1
                accepted += j
            produced += j + 1
    return 1 + accepted / drafts if drafts else 1.0


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_draft_equal_to_target_accepts_every_draft(pair_dirs, prompts, pair, k):
    target_dir, _ = pair_dirs[pair]
    out = _run(target_dir, None, prompts, k, max_num_seqs=4, draft_is_target=True)
    drafts = sum(len(r.verifies) for r in out.requests)
    accepted = sum(a for r in out.requests for _, a in r.verifies)
    assert all(a == j for r in out.requests for j, a in r.verifies)
    assert 1 + accepted / drafts == pytest.approx(_expected_acceptance_length(PROMPT_LENS, k, MAX_NEW))


@pytest.mark.parametrize("k", [0, 3])
def test_every_step_record_reaches_on_step_once_with_its_phase_times(pair_dirs, prompts, k):
    """A step's phase times are read one step late (its draft, or with k = 0 its successor, is still queued when
    it returns): on_step still sees every record once, in order, with its phases in."""
    target, draft = (load_model(d) for d in pair_dirs["lfm2+lfm2"])
    engine = NativeEngine(target, draft, EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4),
                          SpeculatorConfig(num_speculative_tokens=k), SamplingConfig(max_new_tokens=MAX_NEW))
    seen = []
    out = engine.generate(prompts, on_step=seen.append)
    assert seen == out.steps and [s.step for s in seen] == list(range(len(out.steps)))
    for s in seen:
        phases = (s.schedule_ms, s.verify_ms, s.sample_ms, s.draft_ms)
        assert all(ms > 0 for ms in phases[:3]) and s.draft_ms >= 0 and (s.draft_ms > 0 or k == 0)
        assert sum(phases) <= s.step_ms + 50.0  # phases cover the step's own work, not the next step's


def test_sampling_run_is_reproducible_for_a_seed(pair_dirs, prompts):
    a = _run(*pair_dirs["llama+llama"], prompts, k=3, max_num_seqs=4, temperature=1.0)
    b = _run(*pair_dirs["llama+llama"], prompts, k=3, max_num_seqs=4, temperature=1.0)
    assert [r.output_token_ids for r in a.requests] == [r.output_token_ids for r in b.requests]


@pytest.mark.parametrize("k", [1, 4])
def test_first_speculated_token_follows_the_target_distribution(tmp_path, k):
    """At temperature 1, the first token emitted after the prompt's first sampled token (the first one
    produced by a verify) is distributed as the target's next-token distribution."""
    target_dir = save_tiny(tiny_hf_model("llama", 32, 1, seed=11), tmp_path / "t")
    draft_dir = save_tiny(tiny_hf_model("llama", 32, 1, seed=12), tmp_path / "d")
    target = load_model(target_dir)
    draft = load_model(draft_dir)
    prompt = [5, 9, 3]
    trials = 1500
    engine = NativeEngine(
        target, draft, EngineConfig(max_num_seqs=64, max_model_len=32, block_size=4, seed=k),
        SpeculatorConfig(num_speculative_tokens=k), SamplingConfig(temperature=1.0, max_new_tokens=2, ignore_eos=True),
    )
    out = engine.generate([prompt] * trials)
    # Condition on the first sampled token: the second must follow p(. | prompt, first).
    assert second_token_pvalue(target_dir, prompt, [r.output_token_ids for r in out.requests]) > 0.01


def test_draft_with_other_vocabulary_is_refused(tmp_path, pair_dirs):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB + 8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "other")
    with pytest.raises(EngineConfigError, match=r"draft vocab \(32\) != target vocab \(24\)"):
        _run(pair_dirs["llama+llama"][0], tmp_path / "other", [[3, 4]], k=2, max_num_seqs=1)


@pytest.mark.parametrize(
    "engine_kw, spec_kw, match",
    [
        (dict(max_num_seqs=0), {}, "max_num_seqs=0"),
        ({}, dict(num_speculative_tokens=-1), "num_speculative_tokens=-1"),
        (dict(max_model_len=8), dict(num_speculative_tokens=7), "leaves room for at most 6"),
        (dict(cudagraph_seq_len_buckets=(256, 0)), {}, r"cudagraph_seq_len_buckets=\(256, 0\): must be a non-empty"),
        (dict(cudagraph_capture_sizes=()), {}, r"cudagraph_capture_sizes=\(\): must be a non-empty"),
    ],
)
def test_bad_engine_settings_are_refused_with_the_value(pair_dirs, engine_kw, spec_kw, match):
    target = load_model(pair_dirs["llama+llama"][0])
    with pytest.raises(EngineConfigError, match=match):
        NativeEngine(target, target, EngineConfig(**engine_kw), SpeculatorConfig(**spec_kw), SamplingConfig())


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_padded_graph_execution_matches_eager(pair_dirs, prompts, pair, k):
    """FULL-graph execution emulated on the CPU: batches padded up to captured sizes (2, 8) and key-length
    buckets (8, 16, 24 and the longest) and run through the persistent buffers captured at start-up give
    the eager tokens — padded rows never change real ones, a bucket never hides a key its rows need, and no
    replay reads stale metadata while requests join, finish (EOS) and leave."""
    target_dir, draft_dir = pair_dirs[pair]
    target, draft = load_model(target_dir), load_model(draft_dir)
    many = [p for p in prompts for _ in range(3)]

    def run(mode):
        engine = NativeEngine(
            target, draft,
            EngineConfig(max_num_seqs=8, max_model_len=64, block_size=4, cudagraph_mode=mode,
                         cudagraph_capture_sizes=(2, 8), cudagraph_seq_len_buckets=(8, 16, 24)),
            SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode=mode),
            SamplingConfig(max_new_tokens=MAX_NEW, ignore_eos=False), eos_token_ids=[2],
            emulate_graphs_on_cpu=True,
        )
        return engine, engine.generate(many)

    _, eager = run("none")
    engine, padded = run("full")
    assert [r.output_token_ids for r in padded.requests] == [r.output_token_ids for r in eager.requests]
    assert engine.verify_graphs.num_replays > 0
    managers = [engine.verify_graphs]
    if k > 0:
        assert engine.speculator.prefill_graphs.num_replays > 0
        managers.append(engine.speculator.prefill_graphs)
    if k > 1:
        assert engine.speculator.decode_graphs.num_replays > 0
        managers.append(engine.speculator.decode_graphs)
    replayed_buckets = {keys for m in managers for _, _, keys in m.replays_per_graph}
    assert len(replayed_buckets) >= 2, f"only buckets {replayed_buckets} were replayed"


def test_capture_sizes_above_max_num_seqs_count_as_it(pair_dirs, prompts):
    """Capture sizes 1, 2, 4 with max_num_seqs = 3 capture 1, 2 and 3 rows: a step of three rows replays a graph
    (cutting 4 would leave it eager), and the tokens are the eager engine's."""
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])

    def run(mode, sizes):
        engine = NativeEngine(
            target, draft,
            EngineConfig(max_num_seqs=3, max_model_len=64, block_size=4, cudagraph_mode=mode,
                         cudagraph_capture_sizes=sizes),
            SpeculatorConfig(num_speculative_tokens=2, cudagraph_mode=mode),
            SamplingConfig(max_new_tokens=MAX_NEW, ignore_eos=True), emulate_graphs_on_cpu=True,
        )
        return engine, engine.generate(prompts[:3])

    _, eager = run("none", None)
    for sizes, expected in (((1, 2, 4), [1, 2, 3]), ((4, 8), [3]), ((2,), [2])):
        engine, out = run("full", sizes)
        assert engine.capture_sizes == expected, sizes
        assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
        three_rows = sum(n for (rows, _, _), n in engine.verify_graphs.replays_per_graph.items() if rows == 3)
        assert (three_rows > 0) == (3 in expected), (sizes, engine.verify_graphs.replays_per_graph)


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("k", [2, 5])
def test_requests_ending_mid_speculation_still_replay_graphs(pair_dirs, prompts, pair, k):
    """A verify row near max_new_tokens scores all k drafts (its batch stays uniform, so a captured graph runs
    it) but accepts no more than fit: only prefill steps run eagerly, every request stops at exactly
    max_new_tokens, and the tokens are the eager engine's."""
    target, draft = (load_model(d) for d in pair_dirs[pair])

    def run(mode):
        engine = NativeEngine(
            target, draft,
            EngineConfig(max_num_seqs=1, max_model_len=64, block_size=4, cudagraph_mode=mode),
            SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode=mode),
            SamplingConfig(max_new_tokens=11, ignore_eos=True), eos_token_ids=[2], emulate_graphs_on_cpu=True,
        )
        return engine, engine.generate(prompts)

    _, eager = run("none")
    engine, graphed = run("full")
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    assert all(len(r.output_token_ids) == 11 for r in graphed.requests)
    prefill_steps = sum(1 for step in graphed.steps if step.num_prefill_tokens > 0)
    assert engine.verify_graphs.num_eager == prefill_steps
    assert engine.verify_graphs.num_replays == len(graphed.steps) - prefill_steps


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
def test_compiled_pointwise_ops_stay_lossless(pair_dirs, prompts, hf_greedy, pair):
    """engine.compile_pointwise: the fused ops serve the same greedy tokens, speculating or not."""
    target, draft = (load_model(d) for d in pair_dirs[pair])
    outputs = {}
    for k in (0, 3):
        engine = NativeEngine(
            target, draft, EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, compile_pointwise=True),
            SpeculatorConfig(num_speculative_tokens=k), SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW,
                                                                       ignore_eos=True), eos_token_ids=[2])
        outputs[k] = [r.output_token_ids for r in engine.generate(prompts).requests]
    assert outputs[3] == outputs[0] == hf_greedy[pair]


@pytest.mark.parametrize("pair", ["llama+llama", "lfm2+lfm2", "lfm2+llama", "llama+lfm2"])
@pytest.mark.parametrize("k", [0, 1, 4])
@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_prefill_graphs_serve_the_eager_tokens(pair_dirs, prompts, pair, k, max_num_seqs):
    """engine.cudagraph_prefill_tokens, emulated on the CPU: a lone prompt chunk is padded up to the smallest
    captured token count (8 or 16; chunks are cut at 16 tokens) and replayed through the persistent buffers,
    including chunks after the first (cached keys, stored conv windows) and one-token prompts. A step of verify
    rows beside prompt chunks replays graphs: beside one chunk, one joined target graph (`mixed_graphs`), else in
    parts (the verify rows' graph, then a prompt graph per chunk); so does a step of several prompt chunks and no
    verify row (a joined graph beside one inert verify row, or a prompt graph per chunk). The draft's prefill of a chunk replays a graph of one more
    slot. Attention-only, short-conv and hybrid targets and drafts: the greedy tokens are the eager engine's, and
    every chunk replayed, in the target and in the draft."""
    target_dir, draft_dir = pair_dirs[pair] if pair != "llama+lfm2" else (pair_dirs["llama+llama"][0],
                                                                           pair_dirs["lfm2+lfm2"][1])
    target, draft = load_model(target_dir), load_model(draft_dir)
    many = [p + p[: 5 * i] for i, p in enumerate(prompts)]  # up to ~45 tokens: two or three chunks

    def run(mode, prefill_tokens=()):
        engine = NativeEngine(
            target, draft,
            EngineConfig(max_num_seqs=max_num_seqs, max_model_len=96, block_size=4, max_num_batched_tokens=16,
                         cudagraph_mode=mode, cudagraph_prefill_tokens=prefill_tokens),
            SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode=mode),
            SamplingConfig(max_new_tokens=MAX_NEW, ignore_eos=True), emulate_graphs_on_cpu=True,
        )
        return engine, engine.generate(many)

    _, eager = run("none")
    engine, graphed = run("full", (8, 16))
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    # Lossless speculation keeps the tokens whatever the drafts: the drafts themselves (what each verify
    # accepted) show the draft's prefill graphs left its KV and conv state as the eager prefill does.
    assert [r.verifies for r in graphed.requests] == [r.verifies for r in eager.requests]
    lone_chunks = sum(1 for s in graphed.steps if s.num_prefill_tokens > 0 and s.num_reqs == 1)
    mixed = sum(1 for s in graphed.steps if 0 < s.num_prefill_tokens < s.num_tokens)
    prompts_only = sum(1 for s in graphed.steps if s.num_prefill_tokens == s.num_tokens and s.num_reqs > 1)
    replays = {n: engine.prefill_graphs.managers[n].num_replays for n in (8, 16)}
    assert engine.num_mixed_in_parts + engine.num_mixed_joined == mixed
    assert engine.num_prompt_batches_graphed == prompts_only
    assert engine.verify_graphs.num_eager == 0  # every step replayed graphs only
    assert sum(replays.values()) >= lone_chunks + engine.num_mixed_in_parts
    if max_num_seqs == 1:  # every prefill chunk is alone: short ones take the 8-token graph, full ones the 16
        assert replays[8] > 0 and replays[16] > 0 and mixed == 0
    else:
        assert mixed > 0
    if k > 0:  # the draft's region of each chunk it replayed (its tokens + the sampled one) replays too
        prompt_graphs = engine.speculator.prompt_graphs.managers
        assert set(prompt_graphs) == {9, 17}
        assert sum(m.num_replays for m in prompt_graphs.values()) == sum(replays.values())
        assert engine.speculator.num_mixed_joined == engine.num_mixed_joined  # the draft joins the same steps
        assert engine.speculator.prefill_graphs.num_eager == 0
        assert engine.speculator.num_prompt_batches_graphed == prompts_only
    assert {f"target_prefill_{n}" for n in (8, 16)} <= {m.name for m in engine.graph_managers()}


def test_prefill_graphs_are_validated():
    with pytest.raises(EngineConfigError, match=r"cudagraph_prefill_tokens=\(8, 64\).*\[1, 32\]"):
        EngineConfig(max_num_batched_tokens=32, cudagraph_prefill_tokens=(8, 64)).validate()


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
def test_folded_norm_weights_serve_the_same_tokens(pair_dirs, prompts, pair):
    """engine.fold_norm_weights folds each pre-norm's weight into its projections (fresh models: folding is in
    place): the greedy tokens and every verify's accepted drafts are the unfolded engine's."""

    def run(fold):
        target, draft = (load_model(d) for d in pair_dirs[pair])
        engine = NativeEngine(
            target, draft, EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, fold_norm_weights=fold),
            SpeculatorConfig(num_speculative_tokens=3), SamplingConfig(max_new_tokens=MAX_NEW, ignore_eos=True),
        )
        return engine, engine.generate(prompts)

    _, plain = run(False)
    engine, folded = run(True)
    assert all(norm.folded for model in (engine.target, engine.speculator.model)
               for norm, _ in pre_norm_pairs(model))
    assert [r.output_token_ids for r in folded.requests] == [r.output_token_ids for r in plain.requests]
    assert [r.verifies for r in folded.requests] == [r.verifies for r in plain.requests]
    with pytest.raises(EngineConfigError, match="engine.fold_norm_weights='yes': must be true or false"):
        EngineConfig(fold_norm_weights="yes").validate()
