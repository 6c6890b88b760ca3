"""Step graphs compiled for a CPU (`engine.cudagraph_mode=full` on a CPU device, `specexp.engine.compiled_graphs`):
the same tokens as eager and as emulated graphs, nothing compiled after start-up, one line when compiling fails.

Each engine here compiles three graphs (verify, draft prefill, draft decode at one size, k and bucket); a
compile takes seconds, so the cases are few and share shapes (inductor caches what it compiled)."""

from __future__ import annotations

import pytest
import torch
from pairs import random_prompts

from specexp.engine import compiled_graphs
from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.progress import CAPTURE, COMPILING
from specexp.engine.runner import NativeEngine
from specexp.models import load_model
from specexp.zoo import ZOO_DIR as ZOO

K = 3
PROMPTS = random_prompts([3, 11, 6, 17, 1, 9, 14, 5], seed=11)


def _engine(target, draft, mode: str, emulate: bool = False, temperature: float = 0.0, progress=None,
            synthetic: float | None = None) -> NativeEngine:
    """Four rows at most, graphs at size 4 only (smaller batches pad up to it), one key-length bucket; EOS
    honoured, so requests finish at different steps and new prompts prefill beside running rows."""
    return NativeEngine(
        target, draft,
        EngineConfig(max_num_seqs=4, max_model_len=64, block_size=4, cudagraph_mode=mode,
                     cudagraph_capture_sizes=(4,), cudagraph_seq_len_buckets=(80,)),
        SpeculatorConfig(num_speculative_tokens=K, cudagraph_mode=mode,
                         **({} if synthetic is None else {"rejection": "synthetic",
                                                          "synthetic_acceptance_rate": synthetic})),
        SamplingConfig(temperature=temperature, max_new_tokens=12, ignore_eos=False), eos_token_ids=[2],
        emulate_graphs_on_cpu=emulate, progress=progress,
    )


def _compiled_graph_count() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("pair", ["lfm2+llama", "lfm2+lfm2", "llama+llama"])
def test_compiled_graphs_give_the_eager_tokens_and_compile_only_at_start_up(pair_dirs, pair):
    target, draft = (load_model(d) for d in pair_dirs[pair])
    eager = _engine(target, draft, "none").generate(PROMPTS)
    compiled_before, events = _compiled_graph_count(), []
    engine = _engine(target, draft, "full", progress=events.append)
    assert _compiled_graph_count() > compiled_before  # the counter sees compiles
    captures = [e for e in events if e.phase == CAPTURE]
    assert [e.done for e in captures] == [0, 1, 2, 3] and {e.activity for e in captures} == {COMPILING}
    managers = [engine.verify_graphs, engine.speculator.prefill_graphs, engine.speculator.decode_graphs]
    assert all(m.compile_on_cpu and len(m.records) == 1 and m.records[0].capture_s > 0 for m in managers)
    summary = engine.graph_summary()
    assert summary["graph_capture_s"] >= sum(m.records[0].capture_s for m in managers)
    # compiling: every key's first (eager) run and its compile, within the capture phase's seconds
    assert all(m.records[0].compiled and m.records[0].first_run_s > 0 for m in managers)
    assert sum(m.records[0].capture_s for m in managers) < summary["graph_compile_s"] <= summary["graph_capture_s"]
    compiled_before = _compiled_graph_count()
    out = engine.generate(PROMPTS)
    assert _compiled_graph_count() == compiled_before, "a step compiled after start-up"
    assert [r.output_token_ids for r in out.requests] == [r.output_token_ids for r in eager.requests]
    assert all(m.num_replays > 0 for m in managers)
    assert engine.verify_graphs.num_eager > 0  # prompt prefills (and mixed steps) stay eager, counted


@pytest.mark.parametrize("sampling", ["T=1", "synthetic"])
def test_compiled_graphs_draw_the_emulated_graphs_random_numbers(pair_dirs, sampling):
    """Steps that draw random numbers (sampling at T = 1; synthetic acceptance) take them from a tape filled from
    the generator just before each call, in the eager step's order (or, where inductor fails on a step with the
    tape, as here on the 24-token vocabulary's verify at T = 1, draw them inside): the same seed gives the
    emulated graphs' tokens."""
    target, draft = (load_model(d) for d in pair_dirs["lfm2+lfm2"])
    options = {"temperature": 1.0} if sampling == "T=1" else {"synthetic": 0.6}
    runs = []
    for emulate in (True, False):
        engine = _engine(target, draft, "full", emulate=emulate, **options)
        runs.append([r.output_token_ids for r in engine.generate(PROMPTS).requests])
    assert runs[0] == runs[1]


def test_a_sampling_step_compiles_whole_and_samples_as_eager():
    """On the demo pair (T = 1, batch 1, k = 3) every step graph compiles without a graph break: the tape, not a
    generator call, feeds its random numbers; and the compiled run samples the eager run's tokens."""
    target, draft = (load_model(ZOO / name) for name in ("tiny-lfm2", "tiny-llama-draft"))
    prompts = [[1, *range(40, 40 + n)] for n in (5, 12)]

    def run(mode):
        engine = NativeEngine(target, draft, EngineConfig(max_num_seqs=1, max_model_len=48, cudagraph_mode=mode),
                              SpeculatorConfig(num_speculative_tokens=K, cudagraph_mode=mode),
                              SamplingConfig(temperature=1.0, max_new_tokens=16, ignore_eos=True))
        return engine, [r.output_token_ids for r in engine.generate(prompts).requests]

    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    engine, compiled = run("full")
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == breaks
    assert all(m.num_replays > 0 for m in (engine.verify_graphs, engine.speculator.decode_graphs))
    assert compiled == run("none")[1]


def test_a_failed_compile_is_one_line_naming_the_way_out(pair_dirs, monkeypatch):
    target, draft = (load_model(d) for d in pair_dirs["llama+llama"])

    def no_compiler(fn, **_):
        def run():
            raise RuntimeError("C++ compile error\nlong compiler output\nmore lines")
        return run

    monkeypatch.setattr(compiled_graphs.torch, "compile", no_compiler)
    with pytest.raises(compiled_graphs.StepCompileError) as err:
        _engine(target, draft, "full")
    message = str(err.value)
    assert "\n" not in message and "C++ compile error" in message and "engine.cudagraph_mode=none" in message
