"""CUDA graphs (run on a GPU machine: `pytest -m cuda`): replays give the eager engine's greedy tokens, with
batch composition changing every step, and nothing is captured after start-up."""

from __future__ import annotations

import pytest
import torch
from pairs import VOCAB, build_pairs

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.runner import NativeEngine
from specexp.models import load_model, triton_support
from specexp.models.pointwise import EAGER as EAGER_POINTWISE

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return build_pairs(tmp_path_factory.mktemp("gpu-pairs"))


def _prompts(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 24, (n,), generator=gen).tolist()
    return [torch.randint(3, VOCAB, (m,), generator=gen).tolist() for m in lens]


def _engine(target, draft, k, max_num_seqs, graphs, temperature=0.0, **engine_options):
    """A GPU engine on the test pairs; engine_options: further EngineConfig fields (kernels, prompt graphs, pools),
    else EngineConfig's defaults (cuBLAS, SDPA, torch conv, no prompt graphs, one graph pool)."""
    return NativeEngine(
        target, draft,
        EngineConfig(device="cuda", max_num_seqs=max_num_seqs, max_model_len=96, block_size=8,
                     max_num_batched_tokens=64, cudagraph_mode="full" if graphs else "none", seed=0,
                     **engine_options),
        SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode="full" if graphs else "none"),
        # EOS (id 2) is honoured: requests finish at different steps, so batches change every step.
        SamplingConfig(temperature=temperature, max_new_tokens=24, ignore_eos=False),
        eos_token_ids=[2],
    )


CASES = [(pair, k, 32) for pair in ("lfm2+llama", "lfm2+lfm2", "llama+llama") for k in range(9)] + [
    (pair, k, n) for pair in ("lfm2+lfm2", "llama+llama") for k in (0, 3, 8) for n in (1, 5)
]


@pytest.mark.parametrize("pair, k, max_num_seqs", CASES)
def test_graph_replay_matches_eager(pairs, pair, k, max_num_seqs):
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(40 if max_num_seqs > 1 else 6, seed=k)
    eager = _engine(target, draft, k, max_num_seqs, graphs=False).generate(prompts)
    engine = _engine(target, draft, k, max_num_seqs, graphs=True)
    captured = {m.name: set(m.graphs) for m in engine.graph_managers()}
    graphed = engine.generate(prompts)
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    assert {m.name: set(m.graphs) for m in engine.graph_managers()} == captured, "no capture after start-up"
    assert engine.verify_graphs.num_replays > 0
    if k > 1:
        assert engine.speculator.decode_graphs.num_replays > 0
    if k > 0:
        assert engine.speculator.prefill_graphs.num_replays > 0


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
@pytest.mark.parametrize("max_num_seqs", [1, 32])
def test_plain_decode_lookahead_matches_read_back_with_graphs(pairs, pair, max_num_seqs):
    """k = 0 on the GPU with graphs: queuing each step before the last is read back (tokens gathered on the
    device from page-locked double buffers) gives the tokens and finish reasons of reading every step back."""
    target = load_model(pairs[pair][0], device="cuda")
    prompts = _prompts(40 if max_num_seqs > 1 else 6, seed=11)
    base = _engine(target, None, 0, max_num_seqs, graphs=True, plain_decode_lookahead=False).generate(prompts)
    ahead = _engine(target, None, 0, max_num_seqs, graphs=True).generate(prompts)
    assert [r.output_token_ids for r in ahead.requests] == [r.output_token_ids for r in base.requests]
    assert [r.finish_reason for r in ahead.requests] == [r.finish_reason for r in base.requests]
    assert "eos" in {r.finish_reason for r in ahead.requests}


@pytest.mark.parametrize("pair, k", [("lfm2+lfm2", 3), ("llama+llama", 4), ("lfm2+llama", 0)])
def test_compiled_pointwise_ops_replay_like_eager(pairs, pair, k):
    """engine.compile_pointwise: the inductor kernels compile in the warm-up, are captured, and the replays
    give the compiled eager engine's tokens (and the plain eager engine's, these fp32 pairs having no
    near-ties the last-bit RMSNorm difference could flip)."""
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(40, seed=k)
    plain = _engine(target, draft, k, 32, graphs=False).generate(prompts)
    eager = _engine(target, draft, k, 32, graphs=False, compile_pointwise=True).generate(prompts)
    graphed = _engine(target, draft, k, 32, graphs=True, compile_pointwise=True).generate(prompts)
    tokens = [r.output_token_ids for r in graphed.requests]
    assert tokens == [r.output_token_ids for r in eager.requests] == [r.output_token_ids for r in plain.requests]


def test_compiled_pointwise_ops_run_only_inside_graphs(pairs):
    """With graphs, the fused kernels are captured and the steps that run eagerly (prefills) call the plain
    ops: after start-up neither model dispatches to a compiled function."""
    target_dir, draft_dir = pairs["lfm2+lfm2"]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    engine = _engine(target, draft, 3, 4, graphs=True, compile_pointwise=True)
    tables = {m.ops for model in (target, draft) for m in model.modules() if hasattr(m, "ops")}
    assert tables == {EAGER_POINTWISE}
    assert engine.verify_graphs.graphs and engine.speculator.decode_graphs.graphs


TRITON_CASES = [("lfm2+llama", 0, 1), ("lfm2+lfm2", 3, 1), ("llama+llama", 4, 5), ("llama+llama", 8, 32)]
# (linear, attention, conv kernel, fold_norm_weights)
TRITON_KERNELS = [("triton_gemv", "sdpa", "torch", False), ("cublas", "triton", "torch", False),
                  ("cublas", "sdpa", "triton", False), ("triton_gemv", "triton", "triton", False),
                  ("triton_skinny", "triton", "triton", False), ("triton_skinny", "triton", "triton", True)]


@pytest.mark.parametrize("linear_kernel, attention_kernel, conv_kernel, fold", TRITON_KERNELS)
@pytest.mark.parametrize("pair, k, max_num_seqs", TRITON_CASES)
def test_triton_kernels_replay_like_the_defaults(pairs, pair, k, max_num_seqs, linear_kernel, attention_kernel,
                                                 conv_kernel, fold, monkeypatch):
    """engine.linear_kernel=triton_gemv / attention_kernel=triton / conv_kernel=triton: single-token
    projections, uniform-batch attention and LFM2's uniform-batch short conv run on the Triton kernels
    (captured in the graphs), and the greedy tokens equal the default engine's (fp32 pairs without near-ties);
    with fold_norm_weights too (the fused norms then skip the scaling by the norm weight)."""
    from specexp.models import attention, short_conv_ops, triton_gemv
    from specexp.models.kernels import UniformKernel

    calls = {"gemv": 0, "attention": 0, "conv": 0}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(triton_gemv, "gemv", counting("gemv", triton_gemv.gemv))
    triton_kernel = UniformKernel("triton", counting("attention", attention.TRITON.uniform))
    monkeypatch.setitem(attention.ATTENTION_KERNELS, "triton", triton_kernel)
    conv = UniformKernel("triton", counting("conv", short_conv_ops.TRITON_CONV.uniform))
    monkeypatch.setitem(short_conv_ops.CONV_KERNELS, "triton", conv)
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(12 if max_num_seqs < 32 else 40, seed=k)
    plain = _engine(target, draft, k, max_num_seqs, graphs=False).generate(prompts)
    assert calls == {"gemv": 0, "attention": 0, "conv": 0}
    kernels = {"linear_kernel": linear_kernel, "attention_kernel": attention_kernel, "conv_kernel": conv_kernel,
               "fold_norm_weights": fold}
    eager = _engine(target, draft, k, max_num_seqs, graphs=False, **kernels).generate(prompts)
    assert (calls["gemv"] > 0) == linear_kernel.startswith("triton")
    assert (calls["attention"] > 0) == (attention_kernel == "triton")
    assert (calls["conv"] > 0) == (conv_kernel == "triton" and pair.startswith("lfm2"))
    graphed = _engine(target, draft, k, max_num_seqs, graphs=True, **kernels).generate(prompts)
    tokens = [r.output_token_ids for r in graphed.requests]
    assert tokens == [r.output_token_ids for r in eager.requests] == [r.output_token_ids for r in plain.requests]


def test_graph_memory_is_recorded_per_size(pairs):
    target_dir, draft_dir = pairs["lfm2+lfm2"]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    engine = _engine(target, draft, 3, 8, graphs=True)
    summary = engine.graph_summary()
    # graph_capture_bytes is the fall in the device's free memory, which other processes on the GPU move (pytest
    # -n 8 shares one); the allocator's reserved bytes are this process's own
    assert summary["graph_capture_reserved_bytes"] > 0 and summary["graph_capture_s"] > 0
    # each key's warm-up run (kernels compiled or loaded from the caches) is timed apart from its capture
    records = [r for m in summary["managers"].values() for r in m["per_size"]]
    assert all(r["first_run_s"] > 0 and not r["compiled"] for r in records)
    assert summary["graph_compile_s"] == pytest.approx(sum(r["first_run_s"] for r in records))
    assert summary["graph_compile_s"] + sum(r["capture_s"] for r in records) <= summary["graph_capture_s"]
    assert isinstance(summary["graph_capture_bytes"], int)
    for name in ("target_verify", "draft_prefill", "draft_decode"):
        sizes = [r["num_reqs"] for r in summary["managers"][name]["per_size"]]
        assert sorted(set(sizes)) == [1, 2, 4, 8]


def test_sampling_with_graphs_is_reproducible(pairs):
    target_dir, draft_dir = pairs["llama+llama"]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(12)
    a = _engine(target, draft, 4, 4, graphs=True, temperature=1.0).generate(prompts)
    b = _engine(target, draft, 4, 4, graphs=True, temperature=1.0).generate(prompts)
    assert [r.output_token_ids for r in a.requests] == [r.output_token_ids for r in b.requests]


@pytest.mark.parametrize("pair", ["llama+llama", "lfm2+lfm2", "lfm2+llama"])
@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("kernels", [{}, {"compile_pointwise": True, "linear_kernel": "triton_gemv",
                                          "attention_kernel": "triton", "conv_kernel": "triton"}])
def test_prefill_graphs_replay_like_eager(pairs, pair, k, kernels):
    """engine.cudagraph_prefill_tokens on the GPU: lone prompt chunks (1-23 tokens, chunks of at most 64)
    replay captured target and draft prefill graphs (attention-only, short-conv and hybrid models) and serve
    the eager engine's greedy tokens, with the same drafts accepted; nothing is captured after start-up."""
    if kernels and not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(8, seed=k)
    eager = _engine(target, draft, k, 1, graphs=False, **kernels).generate(prompts)
    graphed_engine = _engine(target, draft, k, 1, graphs=True, cudagraph_prefill_tokens=(8, 16, 32, 64), **kernels)
    captured = {m.name: set(m.graphs) for m in graphed_engine.graph_managers()}
    graphed = graphed_engine.generate(prompts)
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in eager.requests]
    assert [r.verifies for r in graphed.requests] == [r.verifies for r in eager.requests]
    assert {m.name: set(m.graphs) for m in graphed_engine.graph_managers()} == captured, "no capture after start-up"
    assert sum(m.num_replays for m in graphed_engine.prefill_graphs.managers.values()) == len(prompts)
    if k > 0:  # and the draft's prefill of each prompt (its tokens + the sampled one)
        assert sum(m.num_replays for m in graphed_engine.speculator.prompt_graphs.managers.values()) == len(prompts)


@pytest.mark.parametrize("pair", ["lfm2+lfm2", "llama+llama"])
def test_one_graph_pool_serves_every_manager(pairs, pair):
    """engine.cudagraph_shared_pool: every graph, target and draft, captures into the engine's one pool, and the
    replays still give the eager engine's tokens and accepted drafts (batches changing every step, lone prompt
    chunks on prompt graphs) while needing no more device memory than a pool per manager."""
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    batch, lone = _prompts(24, seed=5), _prompts(1, seed=6)  # lone: a prompt prefilled alone, on a prompt graph
    eager = [_engine(target, draft, 3, 8, graphs=False).generate(prompts) for prompts in (batch, lone)]
    # The first capture in a process also pays one-time device allocations (library workspaces, the allocator's
    # first segments) that would land in whichever mode is measured first: capture once and discard it.
    warm = _engine(target, draft, 3, 8, graphs=True, cudagraph_prefill_tokens=(16, 32))
    warm.generate(lone)
    del warm
    torch.cuda.empty_cache()
    runs = {}
    for shared in (True, False):
        graphed = _engine(target, draft, 3, 8, graphs=True, cudagraph_prefill_tokens=(16, 32),
                          cudagraph_shared_pool=shared)
        managers = graphed.graph_managers()
        mixed_pools = [m.pool for m in managers if m.name.startswith(("target_mixed", "draft_mixed"))]
        pools = [m.pool for m in managers if not m.name.startswith(("target_mixed", "draft_mixed"))]
        prompt_pools = {m.pool for m in graphed.prefill_graphs.managers.values()}
        if shared:
            assert set(pools) | set(mixed_pools) == {graphed.graph_pool}
        else:
            assert graphed.graph_pool is None and len(prompt_pools) == 1
            assert len(set(pools)) == 5, "verify, target prompts, draft prefill, draft prompts, draft decode"
            assert mixed_pools and len(set(mixed_pools)) == len(mixed_pools)  # a pool per joined-graph manager
            assert not set(mixed_pools) & set(pools)
        prompt_managers = [*graphed.prefill_graphs.managers.values(), *graphed.speculator.prompt_graphs.managers.values()]
        for prompts, expected in zip((batch, lone), eager):
            before = sum(m.num_replays for m in prompt_managers)
            result = graphed.generate(prompts)
            assert [r.output_token_ids for r in result.requests] == [r.output_token_ids for r in expected.requests]
            assert [r.verifies for r in result.requests] == [r.verifies for r in expected.requests]
        assert sum(m.num_replays for m in prompt_managers) - before == 2, "the lone prompt: target and draft graphs"
        # the allocator's reserved bytes (this process's graph pools): the device's free memory, which
        # graph_capture_bytes follows, also moves with other processes on the GPU (pytest -n 8 shares one)
        runs[shared] = graphed.graph_summary()["graph_capture_reserved_bytes"]
        del graphed
        torch.cuda.empty_cache()
    assert 0 < runs[True] <= runs[False], runs


# engine=cuda's kernel settings (conf/engine/cuda.yaml) but the three that name models, varied below
CUDA_YAML_KERNELS = {"compile_pointwise": True, "linear_kernel": "triton_skinny", "silu_in_down_gemv": True,
                     "fold_norm_weights": True, "attention_kernel": "triton",
                     "conv_kernel": "triton", "argmax_kernel": "triton", "sampler_kernel": "triton",
                     "draft_step_kernel": "triton", "programmatic_launch": "auto"}


@pytest.mark.parametrize("skinny_early_launch, silu_in_gate_up, gemv_early_launch",
                         [("draft", "target", "draft"), ("target", True, "both"), ("none", "draft", "none")])
@pytest.mark.parametrize("pair, k, max_num_seqs", [("llama+llama", 4, 1), ("lfm2+lfm2", 3, 5), ("lfm2+llama", 2, 1)])
def test_cuda_yaml_kernels_replay_like_the_defaults(pairs, pair, k, max_num_seqs, skinny_early_launch,
                                                    silu_in_gate_up, gemv_early_launch):
    """engine=cuda's kernels (the gate/up SiLU product of 2-16 tokens in either model's skinny kernel, each
    model's skinny kernels and one-row GEMVs launched early or in order) give the default engine's greedy tokens
    (fp32 pairs without near-ties), replaying verify and draft graphs and capturing nothing after start-up."""
    target_dir, draft_dir = pairs[pair]
    target, draft = load_model(target_dir, device="cuda"), load_model(draft_dir, device="cuda")
    prompts = _prompts(10, seed=k)
    plain = _engine(target, draft, k, max_num_seqs, graphs=False).generate(prompts)
    engine = _engine(target, draft, k, max_num_seqs, graphs=True, skinny_early_launch=skinny_early_launch,
                     silu_in_gate_up=silu_in_gate_up, gemv_early_launch=gemv_early_launch, **CUDA_YAML_KERNELS)
    captured = {m.name: set(m.graphs) for m in engine.graph_managers()}
    graphed = engine.generate(prompts)
    assert [r.output_token_ids for r in graphed.requests] == [r.output_token_ids for r in plain.requests]
    assert {m.name: set(m.graphs) for m in engine.graph_managers()} == captured, "no capture after start-up"
    assert engine.verify_graphs.num_replays > 0 and engine.speculator.prefill_graphs.num_replays > 0
