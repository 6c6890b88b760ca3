"""CUDA-graph cost and benefit of the native engine on a GPU (needs only torch, safetensors, tokenizers).

Measures, per pair (trained demo pairs when present, and real-size random-weight pairs):
  1. graph memory and capture time per captured size, for target verify, draft prefill and draft decode;
  2. draft decode step latency, eager vs graph, at batch 1..64;
  3. target decode-step latency at batch 1 and the HBM bandwidth it achieves (weight bytes / step time)
     against the measured device copy bandwidth;
  4. end-to-end output tokens/s for k = 0..8 (batch 1, 8 prompts of 64 tokens, 128 new tokens; one engine per k,
     every k once per round over 5 interleaved rounds after an untimed one), with synthetic acceptance rates
     (random pairs) or real greedy acceptance (demo pairs), next to Leviathan's speedup
     (1 - a^(k+1)) / ((1 - a)(k c + 1)) with the measured cost ratio c (batch-1 decode-step replays of draft and
     target, alternating over 7 rounds: the median of the rounds' ratios). Each row also says where a request's
     wall time goes: steps and their median / mean, prefill steps, and replays vs eager runs per graph manager.

    python benchmarks/gpu_cudagraphs.py --out results.json [--quick] [--pairs A,B] [--sections capture,step,e2e]
                                        [--no-compile-pointwise] [--linear-kernel triton_skinny|triton_gemv|cublas]
                                        [--no-fold-norm-weights] [--attention-kernel triton|sdpa]
                                        [--conv-kernel triton|torch] [--prefill-graph-tokens 16,32,64,128]
                                        [--argmax-kernel torch|triton] [--sampler-kernel torch|triton]
                                        [--silu-in-down-gemv] [--draft-step-kernel torch|triton]
                                        [--[no-]programmatic-launch] [--[no-]silu-in-gate-up [target|draft]]
                                        [--skinny-early-launch both|target|draft|none]
                                        [--no-shared-graph-pool] [--attention-splits 16]
                                        [--attention-min-split-keys 512]
                                        [--draft-prefill-region auto|full|last_two]
                                        [--ks 0,1,4] [--rates 0.8] [--repeats 3] [--prompts 4]
                                        [--warm-up-rounds 1]
                                        [--no-plain-decode-lookahead]

The engine switches default to what `engine=cuda` runs (CUDA_KERNELS).

Prints each figure as it is measured and rewrites the JSON after every section, so a run cut short keeps
what it finished.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from leviathan import add_theory

from specexp.engine.config import EARLY_LAUNCH_ROLES, EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor
from specexp.engine.runner import NativeEngine
from specexp.models import load_model, skinny_configs, triton_attention, triton_gemv

ZOO = Path(__file__).resolve().parents[1] / "specexp" / "zoo"
RANDOM_PAIRS = {
    "lfm2-1.2b+lfm2-350m": ("configs/lfm2-1.2b", "configs/lfm2-350m"),
    "llama-3.2-1b+llama-100m": ("configs/llama-3.2-1b", "configs/llama-100m-draft"),
}
# What `engine=cuda` runs (conf/engine/cuda.yaml): the configuration the diagnostics
# (diagnostics/host_time.py, step_trace.py, verify_cost.py) look at, and the defaults of this script's kernel switches.
CUDA_KERNELS = {"compile_pointwise": True, "linear_kernel": "triton_skinny", "silu_in_down_gemv": True,
                "silu_in_gate_up": "target", "gemv_early_launch": "both", "skinny_early_launch": "draft",
                "fold_norm_weights": True, "attention_kernel": "triton", "conv_kernel": "triton",
                "argmax_kernel": "triton", "sampler_kernel": "triton", "draft_step_kernel": "triton",
                "programmatic_launch": "auto",
                "cudagraph_prefill_tokens": (16, 32, 64, 128)}
DEMO_PAIRS = {
    "tiny_lfm2": ("tiny-lfm2", "tiny-llama-draft"),
    "tiny_lfm2_hybrid": ("tiny-lfm2", "tiny-lfm2-draft"),
    "tiny_llama": ("tiny-llama", "tiny-llama-draft"),
}


def add_linear_kernel_flags(parser: argparse.ArgumentParser) -> None:
    """The Triton linear kernels' per-model switches, defaults CUDA_KERNELS': `--silu-in-gate-up
    [true|false|target|draft]` (bare: true) and `--no-silu-in-gate-up` into `args.silu_in_gate_up`
    (engine.silu_in_gate_up), `--skinny-early-launch` and `--gemv-early-launch` into `args.skinny_early_launch`
    and `args.gemv_early_launch`."""
    values = {"true": True, "false": False, "target": "target", "draft": "draft"}

    def value(text: str):
        if text not in values:
            raise argparse.ArgumentTypeError(f"{text!r}: valid are {', '.join(values)}")
        return values[text]

    parser.add_argument("--silu-in-gate-up", nargs="?", const=True, type=value,
                        default=CUDA_KERNELS["silu_in_gate_up"],
                        help="engine.silu_in_gate_up: the MLP's SiLU product of 2-16 tokens in the gate/up "
                             "projection's skinny kernel, in both models (bare flag), one (target, draft) or none")
    parser.add_argument("--no-silu-in-gate-up", dest="silu_in_gate_up", action="store_const", const=False,
                        help="engine.silu_in_gate_up=false")
    parser.add_argument("--skinny-early-launch", default=CUDA_KERNELS["skinny_early_launch"],
                        choices=EARLY_LAUNCH_ROLES,
                        help="engine.skinny_early_launch: whose skinny kernels (2-16 tokens) launch early")
    parser.add_argument("--gemv-early-launch", default=CUDA_KERNELS["gemv_early_launch"], choices=EARLY_LAUNCH_ROLES,
                        help="engine.gemv_early_launch: whose one-row GEMVs (batch-1 decode steps) launch early")


def cuda_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `iters` runs, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def back_to_back_ms(fn, iters: int = 100, repeats: int = 5) -> float:
    """Milliseconds per fn() when `iters` calls are queued back to back (CUDA events around the whole run;
    median over `repeats` runs): the device time of a step in a steady stream, without the host's launch
    latency that a synchronised single call also times."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def copy_bandwidth_bytes_per_s(num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth counting bytes read + written."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_ms(functools.partial(dst.copy_, src), iters=10)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * num_bytes / (ms / 1e3)


def model_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_engine(target, draft, k, max_num_seqs, graphs, rejection="standard", rate=0.7, max_model_len=512,
                kernels=None, serve_depths=(), max_new_tokens=128):
    """kernels: EngineConfig switches (compile_pointwise, the kernels, plain_decode_lookahead); None = defaults.
    serve_depths: the static depths besides k the engine captures graphs for (`NativeEngine(serve_depths=...)`)."""
    mode = FULL if graphs else "none"
    return NativeEngine(
        target, draft,
        EngineConfig(device="cuda", dtype=str(target.lm_head.weight.dtype).replace("torch.", ""),
                     max_num_seqs=max_num_seqs, max_model_len=max_model_len, block_size=16,
                     cudagraph_mode=mode, **(kernels or {})),
        SpeculatorConfig(num_speculative_tokens=k, rejection=rejection, synthetic_acceptance_rate=rate,
                         cudagraph_mode=mode),
        SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True),
        serve_depths=serve_depths,
    )


def capture_costs(target, draft, k, max_num_seqs, kernels=None) -> dict:
    engine = make_engine(target, draft, k, max_num_seqs, graphs=True, kernels=kernels)
    summary = engine.graph_summary()
    summary["persistent_buffer_bytes"] = engine.persistent_buffer_bytes()
    decode = {}
    spec = engine.speculator
    keys = max(engine.seq_len_buckets)  # the longest key-length bucket: the cost at max_model_len
    for size in engine.capture_sizes:
        desc = BatchExecutionDescriptor(size, size, FULL, keys, k)  # the fused graph of k - 1 steps
        spec._prepare_decode_capture(desc)
        eager_ms = cuda_ms(functools.partial(spec._fused_multi_step_decode, desc), iters=10)
        graph_ms = cuda_ms(functools.partial(spec.decode_graphs.replay, desc), iters=10)
        decode[size] = {"eager_step_ms": eager_ms / (k - 1), "graph_step_ms": graph_ms / (k - 1),
                        "graph_speedup": eager_ms / graph_ms}
        print(f"    draft decode batch {size:3d}: eager {eager_ms / (k - 1):.3f} ms/step, "
              f"graph {graph_ms / (k - 1):.3f} ms/step ({eager_ms / graph_ms:.1f}x)", flush=True)
    del engine
    torch.cuda.empty_cache()
    return {"capture": summary, "draft_decode_step": decode}


def batch1_decode_step(model, kernels=None) -> tuple[NativeEngine, BatchExecutionDescriptor]:
    """A k = 0 engine on `model` at batch 1, with its decode-step graph's inputs staged at the shortest key-length
    bucket (a short context, <= 256 keys): (engine, desc), replayed by engine.verify_graphs.replay(desc)."""
    engine = make_engine(model, None, 0, 1, graphs=True, kernels=kernels)
    desc = BatchExecutionDescriptor(1, 1, FULL, min(engine.seq_len_buckets))
    engine._prepare_verify_capture(desc)
    return engine, desc


def target_decode_step(step: tuple[NativeEngine, BatchExecutionDescriptor], copy_bw: float) -> dict:
    """A model's batch-1 decode step alone (k = 0; `batch1_decode_step`): graph replay vs eager, and bandwidth."""
    engine, desc = step
    graph_ms = cuda_ms(lambda: engine.verify_graphs.replay(desc), iters=30)
    stream_ms = back_to_back_ms(lambda: engine.verify_graphs.replay(desc))
    eager_ms = cuda_ms(lambda: engine._verify_graph(desc), iters=10)
    # the kernels of the replayed graph: the engine's eager steps call the plain pointwise ops, not the fused
    # ones the graphs captured (`engine.compile_pointwise`), so an eager step's kernels are not the graph's
    breakdown = kernel_breakdown(lambda: engine.verify_graphs.replay(desc), profiled="one graph replay")
    weights = model_bytes(engine.target)
    achieved = weights / (graph_ms / 1e3)
    # graph_ms: one synchronised replay (includes the host's launch latency); graph_back_to_back_ms: replays
    # queued back to back (the device's time per step)
    return {"graph_ms": graph_ms, "graph_back_to_back_ms": stream_ms, "eager_ms": eager_ms, "weight_bytes": weights,
            "achieved_bytes_per_s": achieved, "fraction_of_copy_bandwidth": achieved / copy_bw,
            "fraction_of_copy_bandwidth_back_to_back": weights / (stream_ms / 1e3) / copy_bw,
            "kernels": breakdown}


def interleaved_cost_ratio(target_step, draft_step, rounds: int = 7, iters: int = 30) -> dict:
    """Leviathan's c from the batch-1 decode-step replays of draft and target (`batch1_decode_step`) alternating
    over `rounds` rounds (each round: the target's median synchronised replay over `iters`, then the draft's): c
    is the median of the rounds' ratios, so a drift of the device's clocks or of the host between the two
    measurements moves both. Returns {"cost_ratio_c", "cost_ratio_per_round", "target_step_ms_per_round",
    "draft_step_ms_per_round"}."""
    replays = [functools.partial(engine.verify_graphs.replay, desc) for engine, desc in (target_step, draft_step)]
    target_ms, draft_ms = [], []
    for _ in range(rounds):
        for replay, times in zip(replays, (target_ms, draft_ms), strict=True):
            times.append(cuda_ms(replay, iters=iters))
    ratios = [d / t for d, t in zip(draft_ms, target_ms, strict=True)]
    return {"cost_ratio_c": statistics.median(ratios), "cost_ratio_per_round": ratios,
            "target_step_ms_per_round": target_ms, "draft_step_ms_per_round": draft_ms}


def profile_kernels(fn, calls: int) -> list[tuple[str, int, float]]:
    """(kernel name, launches, device µs) of every GPU kernel `fn` runs over `calls` calls (after one unprofiled
    call; graph replays' kernels included)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if us > 0 and str(getattr(event, "device_type", "")).endswith("CUDA"):
            kernels.append((event.key, event.count, us))
    return kernels


def kernel_breakdown(fn, steps: int = 5, top: int = 20, profiled: str = "one graph replay") -> dict:
    """GPU kernels of `fn` (one step: a graph replay), averaged over `steps` calls: launches per step, summed
    kernel ms per step, the `top` kernels by time ({name, launches_per_step, ms_per_step}), and `profiled`, what
    one call was. Where the step's time goes — weight-streaming GEMVs or many small kernels — is what the
    bandwidth figure alone cannot say."""
    try:
        rows = [{"name": name[:160], "launches_per_step": count / steps, "ms_per_step": us / 1e3 / steps}
                for name, count, us in profile_kernels(fn, steps)]
    except Exception as e:  # noqa: BLE001 - the breakdown is extra information, never a reason to stop
        return {"error": f"{type(e).__name__}: {e}"}
    rows.sort(key=lambda r: -r["ms_per_step"])
    return {"profiled": profiled, "launches_per_step": sum(r["launches_per_step"] for r in rows),
            "kernel_ms_per_step": sum(r["ms_per_step"] for r in rows), "top": rows[:top]}


def timed_generate(engine, prompts, max_concurrency: int | None = None):
    """One timed run (`engine.generate(prompts, max_concurrency=...)`) with the garbage collector paused
    (collected just before), so a collection of the process's objects cannot land inside one run and not
    another's."""
    gc.collect()
    gc.disable()
    try:
        return engine.generate(prompts, max_concurrency=max_concurrency)
    finally:
        gc.enable()


def end_to_end(target, draft, ks, prompts, rates, synthetic: bool, repeats: int = 3,
               kernels=None, warm_up_rounds: int = 1) -> list[dict]:
    """Per rate: one engine per k (graphs captured once, then a short warm-up generate), `warm_up_rounds`
    untimed rounds, then `repeats` rounds that each run every k once over the same prompts, in alternating
    order. A k's tokens/s is the median of its runs (`output_tokens_per_s_runs` keeps each). Interleaving puts
    every k under the same drift of the machine (clocks, other tenants of the host), which running all of one
    k's repeats back to back did not; the untimed rounds take first-use costs (the allocator's and the driver's
    first touches of a whole run's sizes and positions) out of the timed ones."""
    rows = []
    for rate in rates:
        engines, before = {}, {}
        for k in ks:
            engine = make_engine(target, draft if k else None, k, 1, graphs=True,
                                 rejection="synthetic" if synthetic else "standard", rate=rate if synthetic else 1.0,
                                 kernels=kernels)
            engine.generate(prompts[:1], max_new_tokens=8)
            engines[k] = engine
            before[k] = {m.name: (m.num_replays, m.num_eager) for m in engine.graph_managers()}
        for _ in range(warm_up_rounds):
            for k in ks:
                timed_generate(engines[k], prompts)
        runs_by_k = {k: [] for k in ks}
        for round_index in range(repeats):
            for k in (ks if round_index % 2 == 0 else ks[::-1]):
                runs_by_k[k].append(timed_generate(engines[k], prompts))
        for k in ks:
            row = _end_to_end_row(k, rate if synthetic else None, runs_by_k[k], engines[k], before[k], len(prompts))
            rows.append(row)
            print(f"    k={k} rate={rate} AL={row['acceptance_length']:.2f} tok/s={row['output_tokens_per_s']:.1f} "
                  f"(runs {', '.join(f'{r:.0f}' for r in row['output_tokens_per_s_runs'])}) "
                  f"step={row['step_ms_p50']:.2f}ms (draft {row['draft_ms_p50']:.2f}, "
                  f"verify {row['verify_ms_p50']:.2f}, host {row['schedule_ms_p50']:.2f})", flush=True)
        del engines
        torch.cuda.empty_cache()
    return rows


def acceptance_length(verifies: list[tuple[int, int]]) -> float:
    """Tokens a verify emits on average: 1 + mean accepted drafts over (drafts verified, accepted) pairs; 1.0
    without verifies."""
    return 1 + sum(a for _, a in verifies) / len(verifies) if verifies else 1.0


def _end_to_end_row(k, rate, runs, engine, before, num_prompts) -> dict:
    """One k's figures over its timed runs (each an engine.generate output)."""
    rates_per_run = [sum(r.num_output_tokens for r in out.requests) / out.total_s for out in runs]
    verifies = [v for out in runs for r in out.requests for v in r.verifies]
    steps = [s for out in runs for s in out.steps]
    prefill_steps = [s for s in steps if s.num_prefill_tokens > 0]
    num_requests = len(runs) * num_prompts
    managers = {m.name: m for m in engine.graph_managers()}
    return {"k": k, "acceptance_rate": rate,
            "acceptance_length": acceptance_length(verifies),
            # each run draws its own acceptance (synthetic rates): its tokens/s moves with it
            "acceptance_length_runs": [acceptance_length([v for r in out.requests for v in r.verifies])
                                       for out in runs],
            "output_tokens_per_s": statistics.median(rates_per_run),
            "output_tokens_per_s_runs": rates_per_run,
            "step_ms_p50": statistics.median(s.step_ms for s in steps),
            "step_ms_mean": statistics.fmean(s.step_ms for s in steps),
            "draft_ms_p50": statistics.median(s.draft_ms for s in steps),
            "verify_ms_p50": statistics.median(s.verify_ms for s in steps),
            "sample_ms_p50": statistics.median(s.sample_ms for s in steps),
            "schedule_ms_p50": statistics.median(s.schedule_ms for s in steps),
            # where the time beyond steps x median step goes: prefill steps, other slow steps, gaps
            "prefill_steps_per_request": len(prefill_steps) / num_requests,
            "prefill_step_ms_mean": statistics.fmean(s.step_ms for s in prefill_steps) if prefill_steps else 0.0,
            "steps_per_request": len(steps) / num_requests,
            "step_ms_sum_per_request": sum(s.step_ms for s in steps) / num_requests,
            "wall_ms_per_request": 1e3 * sum(out.total_s for out in runs) / num_requests,
            # replays / eager executions per graph manager over the timed runs
            "graph_replays": {name: m.num_replays - before[name][0] for name, m in managers.items()},
            "graph_eager": {name: m.num_eager - before[name][1] for name, m in managers.items()}}


SECTIONS = ("capture", "step", "e2e")


def bench_pair(name, target_path, draft_path, weights, dtype, quick, copy_bw, sections=SECTIONS,
               kernels=None, e2e=None) -> dict:
    """e2e: overrides of the end-to-end grid ({"ks", "rates", "repeats", "prompts", "warm_up_rounds"}; None = the
    defaults)."""
    e2e = e2e or {}
    print(f"== {name} ({weights}, {dtype})", flush=True)
    target = load_model(ZOO / target_path, dtype=dtype, device="cuda", weights=weights, seed=0)
    draft = load_model(ZOO / draft_path, dtype=dtype, device="cuda", weights=weights, seed=1)
    out = {"target": target_path, "draft": draft_path, "weights": weights, "dtype": str(dtype),
           "target_params": sum(p.numel() for p in target.parameters()),
           "draft_params": sum(p.numel() for p in draft.parameters())}
    if "capture" in sections:
        out.update(capture_costs(target, draft, k=4, max_num_seqs=16 if quick else 64,
                                 kernels=kernels))
    if "step" not in sections and "e2e" not in sections:
        return out
    target_step, draft_step = batch1_decode_step(target, kernels), batch1_decode_step(draft, kernels)
    out["target_decode_step"] = target_decode_step(target_step, copy_bw)
    out["draft_decode_step_batch1"] = target_decode_step(draft_step, copy_bw)
    # c for the formula: the two steps timed alternately over rounds; the ratio of the two separate measurements
    # above (c in results written before the interleaved rounds) is kept beside it
    out["cost_ratio_c_separate"] = out["draft_decode_step_batch1"]["graph_ms"] / out["target_decode_step"]["graph_ms"]
    out.update(interleaved_cost_ratio(target_step, draft_step))
    del target_step, draft_step
    torch.cuda.empty_cache()
    c = out["cost_ratio_c"]
    step = out["target_decode_step"]
    # the same ratio from replays queued back to back (the device's time alone), which cudagraphs_report also
    # derives from these two steps' figures to check the end-to-end rows against
    c_back_to_back = out["draft_decode_step_batch1"]["graph_back_to_back_ms"] / step["graph_back_to_back_ms"]
    print(f"  target step {step['graph_ms']:.3f} ms ({100 * step['fraction_of_copy_bandwidth']:.0f}% of copy bw); "
          f"back to back {step['graph_back_to_back_ms']:.3f} ms "
          f"({100 * step['fraction_of_copy_bandwidth_back_to_back']:.0f}%), c={c:.3f} "
          f"(rounds {min(out['cost_ratio_per_round']):.3f}-{max(out['cost_ratio_per_round']):.3f}; "
          f"separate {out['cost_ratio_c_separate']:.3f}; back to back {c_back_to_back:.3f})", flush=True)
    if "e2e" not in sections:
        return out
    gen = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    # 8 prompts x 128 tokens per run: at k = 8 a run then holds ~230 verifies, so its acceptance length (and
    # with it its tokens/s) is within ~4% of the expected one; 4 prompts left ~6%
    num_prompts = e2e.get("prompts") or (2 if quick else 8)
    prompts = [torch.randint(3, vocab, (64,), generator=gen).tolist() for _ in range(num_prompts)]
    ks = e2e.get("ks") or ([0, 1, 2, 4, 8] if quick else list(range(9)))
    synthetic = weights == "random"
    rates = (e2e.get("rates") or [0.6, 0.8]) if synthetic else [None]
    warm_up_rounds = e2e.get("warm_up_rounds")
    out["end_to_end"] = end_to_end(target, draft, ks, prompts, rates, synthetic,
                                   repeats=e2e.get("repeats") or (1 if quick else 5), kernels=kernels,
                                   warm_up_rounds=(0 if quick else 1) if warm_up_rounds is None else warm_up_rounds)
    add_theory(out["end_to_end"], c)
    del target, draft
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_cudagraphs.json")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and depths")
    parser.add_argument("--pairs", default="all", help="comma-separated pair names, or 'all'")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (e2e needs the step's cost ratio)")
    parser.add_argument("--compile-pointwise", action=argparse.BooleanOptionalAction,
                        default=CUDA_KERNELS["compile_pointwise"],
                        help="engine.compile_pointwise: fused (torch.compile) pointwise ops inside the graphs")
    # kernel defaults: those of conf/engine/cuda.yaml (what `engine=cuda` runs)
    parser.add_argument("--linear-kernel", default=CUDA_KERNELS["linear_kernel"],
                        choices=["cublas", "triton_gemv", "triton_skinny"],
                        help="engine.linear_kernel: single-token projections on cuBLAS or the Triton GEMV; "
                             "triton_skinny: also projections of up to 16 tokens (verify, draft prefill)")
    parser.add_argument("--silu-in-down-gemv", action=argparse.BooleanOptionalAction,
                        default=CUDA_KERNELS["silu_in_down_gemv"],
                        help="engine.silu_in_down_gemv: the MLP's SiLU product of one token inside the down GEMV")
    add_linear_kernel_flags(parser)
    parser.add_argument("--fold-norm-weights", action=argparse.BooleanOptionalAction,
                        default=CUDA_KERNELS["fold_norm_weights"],
                        help="engine.fold_norm_weights: pre-norm weights folded into the projections (the fused "
                             "norms of the Triton kernels skip scaling x)")
    parser.add_argument("--attention-kernel", default="triton", choices=["sdpa", "triton"],
                        help="engine.attention_kernel: decode/verify attention by gather + SDPA or one Triton kernel")
    parser.add_argument("--ks", default=None, help="end to end: comma-separated depths (must include 0; default 0..8)")
    parser.add_argument("--rates", default=None, help="end to end: comma-separated synthetic acceptance rates "
                                                      "(default 0.6,0.8)")
    parser.add_argument("--repeats", type=int, default=None, help="end to end: interleaved rounds (default 5)")
    parser.add_argument("--prompts", type=int, default=None, help="end to end: prompts per run (default 8)")
    parser.add_argument("--warm-up-rounds", type=int, default=None,
                        help="end to end: untimed rounds of every k before the timed ones (default 1, --quick 0)")
    parser.add_argument("--no-plain-decode-lookahead", action="store_true",
                        help="engine.plain_decode_lookahead=false: k = 0 reads each step back before the next")
    parser.add_argument("--steady-inputs-on-device", action=argparse.BooleanOptionalAction, default=True,
                        help="engine.steady_inputs_on_device: a steady step's inputs advanced by one kernel from "
                             "what the last step accepted (--no-...: staged on the host after the read-back)")
    parser.add_argument("--draft-prefill-region", default="auto", choices=["auto", "full", "last_two"],
                        help="engine.draft_prefill_region: the draft's prefill after a verify over each row's last "
                             "two slots or its v + 2 (auto: two for attention-only drafts)")
    parser.add_argument("--conv-kernel", default="triton", choices=["torch", "triton"],
                        help="engine.conv_kernel: LFM2's decode/verify short conv in torch or one Triton kernel")
    parser.add_argument("--argmax-kernel", default=CUDA_KERNELS["argmax_kernel"],
                        choices=["torch", "triton", "triton_two_launches"],
                        help="engine.argmax_kernel: the argmax over the vocabulary (greedy draft and verify) in "
                             "torch, one Triton launch (verifying too), or two")
    parser.add_argument("--sampler-kernel", default=CUDA_KERNELS["sampler_kernel"], choices=["torch", "triton"],
                        help="engine.sampler_kernel: greedy verification after the argmax in torch or one Triton "
                             "kernel")
    parser.add_argument("--draft-step-kernel", default=CUDA_KERNELS["draft_step_kernel"], choices=["torch", "triton"],
                        help="engine.draft_step_kernel: the draft's bookkeeping between decode steps in torch or one "
                             "Triton kernel")
    parser.add_argument("--programmatic-launch", action=argparse.BooleanOptionalAction,
                        default=CUDA_KERNELS["programmatic_launch"],
                        help="engine.programmatic_launch: the Triton GEMV, attention and conv kernels launched with "
                             "programmatic dependent launch (sm_90+)")
    parser.add_argument("--prefill-graph-tokens", default=",".join(map(str, CUDA_KERNELS["cudagraph_prefill_tokens"])),
                        help="engine.cudagraph_prefill_tokens: lone prompt chunks replay a captured prefill graph, "
                             "in the target and the draft ('' = none)")
    parser.add_argument("--attention-splits", type=int, default=None,
                        help="most programs the attention kernel splits a row's keys over "
                             "(triton_attention.MAX_SPLITS; 1: one program walks them all)")
    parser.add_argument("--attention-min-split-keys", type=int, default=None,
                        help="launches over fewer keys keep one program (triton_attention.MIN_SPLIT_KEYS)")
    parser.add_argument("--shared-graph-pool", action=argparse.BooleanOptionalAction, default=True,
                        help="engine.cudagraph_shared_pool: every graph, target and draft, in one memory pool "
                             "(--no-shared-graph-pool: a pool per manager)")
    parser.add_argument("--row-grid-max-tokens", type=int, default=None,
                        help="triton_gemv.ROW_GRID_MAX_TOKENS: products of 2 up to this many rows (narrow ones) on the "
                             "GEMV kernel a program per row; 1 = every product of 2+ rows on the skinny kernel")
    args = parser.parse_args()
    sections = tuple(args.sections.split(","))
    try:
        e2e = {"ks": [int(k) for k in args.ks.split(",")] if args.ks else None,
               "rates": [float(a) for a in args.rates.split(",")] if args.rates else None,
               "repeats": args.repeats, "prompts": args.prompts, "warm_up_rounds": args.warm_up_rounds}
    except ValueError:
        parser.error(f"--ks / --rates: comma-separated numbers expected, got {args.ks!r} / {args.rates!r}")
    if e2e["ks"] is not None and (0 not in e2e["ks"] or min(e2e["ks"]) < 0):
        parser.error(f"--ks={args.ks}: depths >= 0, including 0 (the baseline every speedup is over)")
    if e2e["rates"] is not None and any(not 0 <= a < 1 for a in e2e["rates"]):
        parser.error(f"--rates={args.rates}: each in [0, 1)")
    for name in ("repeats", "prompts"):
        if e2e[name] is not None and e2e[name] < 1:
            parser.error(f"--{name}={e2e[name]}: must be >= 1")
    if args.warm_up_rounds is not None and args.warm_up_rounds < 0:
        parser.error(f"--warm-up-rounds={args.warm_up_rounds}: must be >= 0")
    try:
        prefill_tokens = tuple(int(n) for n in args.prefill_graph_tokens.split(",") if n)
    except ValueError:
        parser.error(f"--prefill-graph-tokens={args.prefill_graph_tokens!r}: comma-separated token counts expected")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; valid: {', '.join(SECTIONS)}")
    if args.attention_splits is not None and args.attention_splits < 1:
        parser.error(f"--attention-splits={args.attention_splits}: must be >= 1")
    if args.attention_min_split_keys is not None and args.attention_min_split_keys < 0:
        parser.error(f"--attention-min-split-keys={args.attention_min_split_keys}: must be >= 0")
    if args.row_grid_max_tokens is not None and not 1 <= args.row_grid_max_tokens <= triton_gemv.MAX_TOKENS:
        parser.error(f"--row-grid-max-tokens={args.row_grid_max_tokens}: must be in [1, {triton_gemv.MAX_TOKENS}]")
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    if args.row_grid_max_tokens is not None:
        triton_gemv.ROW_GRID_MAX_TOKENS = args.row_grid_max_tokens
    if args.attention_splits is not None:
        triton_attention.MAX_SPLITS = args.attention_splits
    if args.attention_min_split_keys is not None:
        triton_attention.MIN_SPLIT_KEYS = args.attention_min_split_keys
    kernels = {"compile_pointwise": args.compile_pointwise, "linear_kernel": args.linear_kernel,
               "silu_in_down_gemv": args.silu_in_down_gemv, "silu_in_gate_up": args.silu_in_gate_up,
               "gemv_early_launch": args.gemv_early_launch, "skinny_early_launch": args.skinny_early_launch,
               "fold_norm_weights": args.fold_norm_weights,
               "attention_kernel": args.attention_kernel, "conv_kernel": args.conv_kernel,
               "argmax_kernel": args.argmax_kernel, "sampler_kernel": args.sampler_kernel,
               "draft_step_kernel": args.draft_step_kernel, "programmatic_launch": args.programmatic_launch,
               "plain_decode_lookahead": not args.no_plain_decode_lookahead,
               "steady_inputs_on_device": args.steady_inputs_on_device,
               "draft_prefill_region": args.draft_prefill_region,
               "cudagraph_prefill_tokens": prefill_tokens, "cudagraph_shared_pool": args.shared_graph_pool}
    # the engine switches are recorded as run (JSON writes the tuple of token counts as a list)
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "python": platform.python_version()}, "pairs": {}, "errors": {}, **kernels,
              "skinny_tiles": skinny_configs.table_in_use(torch.device("cuda")),
              "attention_max_splits": triton_attention.MAX_SPLITS,
              "attention_min_split_keys": triton_attention.MIN_SPLIT_KEYS,
              "row_grid_max_tokens": triton_gemv.ROW_GRID_MAX_TOKENS,
              "end_to_end_grid": e2e}
    result["copy_bandwidth_bytes_per_s"] = copy_bandwidth_bytes_per_s()
    print(f"copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    pairs = [(n, t, d, "random", torch.bfloat16) for n, (t, d) in RANDOM_PAIRS.items()]
    pairs += [(n, t, d, "trained", torch.bfloat16) for n, (t, d) in DEMO_PAIRS.items()
              if (ZOO / t / "model.safetensors").exists() and (ZOO / d / "model.safetensors").exists()]
    wanted = None if args.pairs == "all" else set(args.pairs.split(","))
    for name, t, d, weights, dtype in pairs:
        if wanted is not None and name not in wanted:
            continue
        try:
            result["pairs"][name] = bench_pair(name, t, d, weights, dtype, args.quick,
                                               result["copy_bandwidth_bytes_per_s"], sections,
                                               kernels, e2e)
        except Exception:  # noqa: BLE001 - keep the other pairs' figures
            result["errors"][name] = traceback.format_exc()
            print(result["errors"][name], flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    start = time.perf_counter()
    with torch.inference_mode():  # as the engine runs (its own entry points are inference_mode too)
        main()
    print(f"total {time.perf_counter() - start:.0f} s")
