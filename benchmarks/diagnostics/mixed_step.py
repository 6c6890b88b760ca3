"""What a mixed step costs on a GPU: a new prompt's prefill beside the verify rows, against a pure verify step.

Under load nearly every step that admits a request mixes its prompt into the verify batch. Per pair (real-size
random weights, bf16, the kernels of `engine=cuda`, synthetic acceptance `--rate`) and per concurrency b, this
script builds one engine at K = `--k` with graphs at the measured batch sizes, warms it up, and serves 4b prompts
of `--prompt-tokens` tokens at concurrency b (a new request admitted when one finishes, so the steady state
mixes one prompt into b - 1 verify rows every few steps). Per step it sums the device phases (schedule, verify,
sample, draft: the step's period on the device) and reports, per batch size, the median of

  - pure verify steps (every row a verify, no prefill token), and
  - mixed steps (at least one verify row and one prompt chunk), with their ratio to the pure steps of the
    same batch size,

with the count of each. `--profile` adds torch.profiler tables of one more run at the largest b, written next to
the JSON: the aten ops ranked by CPU self time, and the kernels ranked by GPU time.

    python benchmarks/diagnostics/mixed_step.py --pairs llama-3.2-1b+llama-100m --batches 4,16,64 --out mixed.json
        [--k 4] [--rate 0.8] [--prompt-tokens 64] [--new-tokens 128] [--mixed joined,parts,eager] [--profile]

`--mixed`: how mixed steps run, one engine each: `joined` (one target graph of the verify rows and the chunks,
`specexp.engine.mixed_graphs`; the default), `parts` (the verify rows' graph and a prompt graph per chunk,
`specexp.engine.mixed_steps`) and/or `eager` (no prompt graphs: one eager forward).

Needs only torch, safetensors and tokenizers (and a CUDA GPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

from gpu_cudagraphs import CUDA_KERNELS, RANDOM_PAIRS, ZOO

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor
from specexp.engine.runner import NativeEngine
from specexp.models import load_model


# How a mixed step runs: one joined target graph, in parts (a graph each for the verify rows and the prompt chunk:
# the prompt graphs of `engine=cuda`), or as one eager forward (no prompt graphs: what every mixed step did before
# parts). Each mode: (engine.cudagraph_prefill_tokens, engine.cudagraph_mixed).
PROMPT_GRAPHS = CUDA_KERNELS["cudagraph_prefill_tokens"]
MIXED_MODES = {"joined": (PROMPT_GRAPHS, "joined"), "parts": (PROMPT_GRAPHS, "parts"), "eager": ((), "parts")}


def build(target, draft, batches: list[int], k: int, rate: float, max_model_len: int, mixed: str = "joined"
          ) -> NativeEngine:
    """One engine at K = k, graphs at `batches`, synthetic acceptance `rate`; mixed steps run as `mixed` says."""
    prompt_graphs, mixed_steps = MIXED_MODES[mixed]
    kernels = {**CUDA_KERNELS, "cudagraph_prefill_tokens": prompt_graphs, "cudagraph_mixed": mixed_steps}
    engine = EngineConfig(device="cuda", dtype="bfloat16", max_num_seqs=max(batches), max_model_len=max_model_len,
                          block_size=16, cudagraph_mode=FULL, cudagraph_capture_sizes=sorted(batches), **kernels)
    spec = SpeculatorConfig(num_speculative_tokens=k, cudagraph_mode=FULL, rejection="synthetic",
                            synthetic_acceptance_rate=rate)
    return NativeEngine(target, draft, engine, spec, SamplingConfig(temperature=0.0, ignore_eos=True))


def device_ms(step) -> float:
    """The step's period on the device: its four phases, ms."""
    return step.schedule_ms + step.verify_ms + step.sample_ms + step.draft_ms


def split_steps(steps, batch: int) -> tuple[list, list]:
    """The steps of `batch` rows: (pure verify steps, no prefill token; mixed steps, prefill tokens beside at
    least one verify row). Prefill-only steps are in neither."""
    full = [s for s in steps if s.num_reqs == batch]
    pure = [s for s in full if s.num_prefill_tokens == 0]
    mixed = [s for s in full if s.num_prefill_tokens and s.num_reqs > 1]
    return pure, mixed


def summary(values: list[float]) -> dict:
    """Median, 10th and 90th percentile (ms) and count of step times."""
    ordered = sorted(values)
    return {"median_ms": statistics.median(ordered), "n": len(ordered),
            "p10_ms": ordered[len(ordered) // 10], "p90_ms": ordered[(9 * len(ordered)) // 10]}


PHASES = ("schedule_ms", "verify_ms", "sample_ms", "draft_ms", "step_ms")


def phase_medians(steps) -> dict:
    """Median of each phase (and the host's step_ms) over steps, ms."""
    return {name: statistics.median(getattr(s, name) for s in steps) for name in PHASES} if steps else {}


def measure(engine: NativeEngine, prompts: list[list[int]], batch: int, new_tokens: int) -> dict:
    """One warm-up and one measured run at concurrency `batch`: the pure and mixed steps of `batch` rows."""
    engine.generate(prompts[: 2 * batch], max_concurrency=batch, max_new_tokens=new_tokens)  # warm-up
    out = engine.generate(prompts, max_concurrency=batch, max_new_tokens=new_tokens)
    pure, mixed = split_steps(out.steps, batch)
    result = {"wall_s": out.total_s, "steps": len(out.steps),
              "output_tokens": sum(r.num_output_tokens for r in out.requests),
              "pure": summary([device_ms(s) for s in pure]) if pure else None,
              "mixed": summary([device_ms(s) for s in mixed]) if mixed else None,
              "pure_phases": phase_medians(pure), "mixed_phases": phase_medians(mixed),
              "mixed_step_ms_total": sum(device_ms(s) for s in out.steps if s.num_prefill_tokens),
              "device_ms_total": sum(device_ms(s) for s in out.steps)}
    if pure and mixed:
        result["mixed_over_pure"] = result["mixed"]["median_ms"] / result["pure"]["median_ms"]
    return result


def graph_replay_ms(engine: NativeEngine, batch: int, reps: int = 20) -> dict[str, float]:
    """GPU time of one replay of each graph a step of `batch` rows can replay at the smallest key-length bucket
    (target verify and draft prefill/decode at the size holding `batch` rows, every one-row prompt graph), each
    on the inert batch it was captured on and replayed alone `reps` times between CUDA events: median, ms."""
    spec = engine.speculator
    managers = [(engine.verify_graphs, engine._prepare_verify_capture)]
    managers += [(m, engine._prepare_prefill_capture) for m in engine.prefill_graphs.managers.values()]
    managers += [(m, functools.partial(engine._prepare_mixed_capture, count))
                 for count, m in engine.mixed_graphs.managers.items()]
    if spec is not None:
        managers += [(spec.prefill_graphs, spec._prepare_prefill_capture), (spec.decode_graphs,
                                                                            spec._prepare_decode_capture)]
        managers += [(m, spec._prepare_prompt_capture) for m in spec.prompt_graphs.managers.values()]
    times = {}
    for manager, prepare in managers:
        sizes = sorted({size for size, _, _ in manager.graphs})
        held = next((size for size in sizes if size >= batch), sizes[-1] if sizes else None)  # prompt graphs: 1
        for (size, k, bucket), graph in sorted(manager.graphs.items()):
            if graph is None or bucket != min(manager.seq_len_buckets) or size != held:
                continue
            prepare(BatchExecutionDescriptor(size, size * manager.tokens_for(k), FULL, bucket, k))
            samples = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end))
            times[f"{manager.name} {size}x{bucket}@k{k}"] = statistics.median(samples)
    return times


def profile(engine: NativeEngine, prompts: list[list[int]], batch: int, new_tokens: int, out_dir: Path,
            name: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.generate(prompts, max_concurrency=batch, max_new_tokens=new_tokens)
    averages = prof.key_averages()
    (out_dir / f"{name}_host.txt").write_text(averages.table(sort_by="self_cpu_time_total", row_limit=40))
    (out_dir / f"{name}_device.txt").write_text(averages.table(sort_by="self_cuda_time_total", row_limit=40))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="llama-3.2-1b+llama-100m")
    parser.add_argument("--batches", default="4,16,64")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rate", type=float, default=0.8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--mixed", default="joined", help="how mixed steps run, one or more of: joined, parts, eager")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    batches = sorted(int(b) for b in args.batches.split(","))
    mixed_modes = args.mixed.split(",")
    if any(m not in MIXED_MODES for m in mixed_modes):
        raise SystemExit(f"--mixed={args.mixed!r}: valid are {', '.join(MIXED_MODES)} (comma-separated)")
    out_path = Path(args.out)
    result = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "k": args.k, "rate": args.rate, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "pairs": {}}
    max_model_len = -(-(args.prompt_tokens + args.new_tokens + args.k + 2) // 16) * 16
    for pair in args.pairs.split(","):
        if pair not in RANDOM_PAIRS:
            raise SystemExit(f"--pairs: unknown pair {pair!r}: valid are {', '.join(RANDOM_PAIRS)}")
        target_path, draft_path = RANDOM_PAIRS[pair]
        target = load_model(ZOO / target_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
        draft = load_model(ZOO / draft_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=1)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, target.config.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
                   for _ in range(4 * max(batches))]
        result["pairs"][pair] = {}
        for mode in mixed_modes:
            engine = build(target, draft, batches, args.k, args.rate, max_model_len, mode)
            result["pairs"][pair][mode] = {}
            for b in batches:
                cell = measure(engine, prompts[: 4 * b], b, args.new_tokens)
                cell["mixed_steps_in_parts"] = engine.num_mixed_in_parts
                cell["mixed_steps_joined"] = engine.num_mixed_joined
                cell["graph_replay_ms"] = graph_replay_ms(engine, b)
                print(json.dumps(cell["graph_replay_ms"], indent=1), flush=True)
                result["pairs"][pair][mode][str(b)] = cell
                ratio = cell.get("mixed_over_pure")
                print(f"{pair} {mode} batch {b}: pure {cell['pure_phases']} mixed {cell['mixed_phases']} "
                      f"ratio {ratio}", flush=True)
                out_path.write_text(json.dumps(result, indent=1))
            if args.profile:
                profile(engine, prompts[: 4 * batches[-1]], batches[-1], args.new_tokens, out_path.parent,
                        f"{out_path.stem}_{pair.replace('+', '_')}_{mode}")
            del engine
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
