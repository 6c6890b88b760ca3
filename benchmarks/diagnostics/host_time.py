"""Host time per engine step on a GPU: where a step's CPU work goes, and how much it varies between runs.

At batch 1 a graph-replayed step is short (~1 ms for a 1B target), so the host's work around it, step inputs,
conv metadata, the rejection sampler and the draft's inputs, is a large share of the step. Some of it runs
while the device waits. Per k this script:
  1. runs `--rounds` timed generates per engine, every engine once per round in alternating order. Without
     `--no-twin`, k = 0 gets a second, identical engine ("0b"): two engines that cannot differ, so any gap between
     them is the host's run-to-run noise; with `--eager-launches`, each k also gets an engine ("ke") whose steady
     advance kernel is launched from Python instead of replayed from its small graph (`engine.launch_graphs`);
  2. times one more generate with the engine's host-side pieces wrapped (wall clock, median µs per call):
     target step inputs (staged from the host, or advanced on the device), conv metadata builds, rejection
     sampler, draft prefill / decode inputs, commit.

    python benchmarks/diagnostics/host_time.py --pair lfm2-1.2b+lfm2-350m [--ks 0,3] [--rounds 4] [--out host.json]

Needs only torch, safetensors and tokenizers (and a CUDA GPU). Kernels as `engine=cuda` with compile_pointwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)

from gpu_cudagraphs import CUDA_KERNELS, RANDOM_PAIRS, ZOO, make_engine, timed_generate

from specexp.models import load_model


def run_summary(out) -> dict:
    """tokens/s of one generate and the medians of its decode steps' phases (ms)."""
    steps = [s for s in out.steps if s.num_prefill_tokens == 0]
    row = {"output_tokens_per_s": sum(r.num_output_tokens for r in out.requests) / out.total_s}
    for phase in ("step_ms", "schedule_ms", "verify_ms", "sample_ms", "draft_ms"):
        row[f"{phase.removesuffix('_ms')}_ms_p50"] = statistics.median(getattr(s, phase) for s in steps)
    return row


def host_pieces(engine) -> list[tuple[object, str, str]]:
    """(object, method name, label) of the host-side pieces of a step worth timing."""
    pieces = [(engine, "step", "step"), (engine.scheduler, "schedule", "schedule"),
              (engine, "_prepare_target_inputs", "target_inputs"),
              (engine, "_advance_steady_rows", "target_advance"), (engine.verify_graphs, "replay", "verify_replay"),
              (engine, "rejection", "rejection_sampler"), (engine.read_back, "start", "start_read_back"),
              (engine, "_commit", "commit"), (engine, "_commit_provisional", "commit_provisional"),
              (engine, "_commit_read_back", "commit_read_back"), (engine, "finish_timing", "finish_timing")]
    if engine.conv_states:
        pieces.append((engine.conv_builder, "build", "target_conv_metadata"))
    spec = engine.speculator
    if spec is not None:
        pieces += [(spec, "_prepare_prefill_inputs", "draft_prefill_inputs"),
                   (spec, "_prepare_decode_inputs", "draft_decode_inputs"), (spec, "propose", "draft_propose"),
                   (spec.prefill_graphs, "replay", "draft_prefill_replay"),
                   (spec.decode_graphs, "replay", "draft_decode_replay")]
        if spec.conv_states:
            pieces += [(spec.prefill_conv_builder, "build", "draft_prefill_conv_metadata"),
                       (spec.decode_conv_builder, "build", "draft_decode_conv_metadata")]
    return pieces


def timed_pieces(engine, prompts) -> dict:
    """Median wall µs per call of each host piece over one generate (wrappers removed afterwards)."""
    times: dict[str, list[float]] = {}
    originals = []
    for obj, name, label in host_pieces(engine):
        original = getattr(obj, name)
        originals.append((obj, name, original, name in vars(obj)))  # an instance attribute, or a method

        def wrapped(*args, _fn=original, _label=label, **kwargs):
            start = time.perf_counter()
            result = _fn(*args, **kwargs)
            times.setdefault(_label, []).append((time.perf_counter() - start) * 1e6)
            return result

        setattr(obj, name, wrapped)
    try:
        engine.generate(prompts)
    finally:
        for obj, name, original, own in originals:
            if own:
                setattr(obj, name, original)
            else:
                delattr(obj, name)  # the wrapper shadowed the class's method
    return {label: {"us_p50": statistics.median(v), "us_mean": statistics.fmean(v), "calls": len(v)}
            for label, v in times.items()}


def profiled_hot_spots(engine, prompts, top: int = 40) -> list[dict]:
    """One generate under cProfile: the `top` functions by their own time (µs per step, calls per step)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    out = engine.generate(prompts)
    profiler.disable()
    num_steps = len(out.steps)
    rows = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items():
        rows.append({"function": f"{Path(path).name}:{line}:{name}", "own_us_per_step": tottime / num_steps * 1e6,
                     "cum_us_per_step": cumtime / num_steps * 1e6, "calls_per_step": calls / num_steps})
    return sorted(rows, key=lambda r: -r["own_us_per_step"])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="lfm2-1.2b+lfm2-350m", choices=sorted(RANDOM_PAIRS))
    parser.add_argument("--ks", default="0,3", help="comma-separated depths")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="random 64-token prompts per run (128 new tokens)")
    parser.add_argument("--rate", type=float, default=0.8, help="synthetic acceptance rate")
    parser.add_argument("--no-twin", action="store_true", help="no second k = 0 engine")
    parser.add_argument("--cprofile", action="store_true", help="also profile one generate per k (cProfile)")
    parser.add_argument("--eager-launches", action="store_true",
                        help="per k also an engine (k'e') that launches its steady advance kernel without a graph")
    parser.add_argument("--out", default="host_time.json")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    if any(k < 0 for k in ks):
        parser.error(f"--ks: depths must be >= 0, got {args.ks}")
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    target_path, draft_path = RANDOM_PAIRS[args.pair]
    target = load_model(ZOO / target_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
    draft = load_model(ZOO / draft_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, target.config.vocab_size, (64,), generator=gen).tolist()
               for _ in range(args.prompts)]
    names = [str(k) for k in ks] + (["0b"] if 0 in ks and not args.no_twin else [])
    names += [f"{k}e" for k in ks] if args.eager_launches else []
    engines = {}
    for name in names:
        k = int(name.rstrip("be"))
        kernels = {**CUDA_KERNELS, "launch_graphs": not name.endswith("e")}
        engines[name] = make_engine(target, draft if k else None, k, 1, graphs=True, rejection="synthetic",
                                    rate=args.rate, kernels=kernels)
        engines[name].generate(prompts[:1], max_new_tokens=8)
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__},
              "pair": args.pair, "rate": args.rate, "runs": {n: [] for n in names}, "host_us": {}}
    for round_index in range(args.rounds):
        for name in (names if round_index % 2 == 0 else names[::-1]):
            row = run_summary(timed_generate(engines[name], prompts))
            result["runs"][name].append(row)
            print(f"k={name} round {round_index}: " + ", ".join(f"{key} {value:.3f}" for key, value in row.items()),
                  flush=True)
    for name in names:
        result["host_us"][name] = timed_pieces(engines[name], prompts)
        print(f"k={name} host µs (median per call): " + ", ".join(
            f"{label} {v['us_p50']:.0f}" for label, v in result["host_us"][name].items()), flush=True)
        if args.cprofile:
            result.setdefault("cprofile", {})[name] = profiled_hot_spots(engines[name], prompts)
            for row in result["cprofile"][name][:25]:
                print(f"    {row['own_us_per_step']:8.1f} us own {row['cum_us_per_step']:8.1f} us cum "
                      f"{row['calls_per_step']:6.1f}/step  {row['function']}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
