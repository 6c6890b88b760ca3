"""What the headroom of a larger K costs: an engine sized for K running every step at k, against one sized for k.

A dynamic depth mode sizes its buffers, caches, conv states and graphs for K = `num_speculative_tokens` and runs
each step at a k <= K. Per pair and batch size b, this builds two engines on the same loaded models (the kernels
of `engine=cuda`, graphs at the measured batch sizes; synthetic acceptance `--rate` on a random-weight pair, real
greedy acceptance on a demo pair): static k (K = k), and K =
`--max-k` with a batch-size schedule that gives every step k. Both serve the same workload as
`dynamic_depth_gpu.py` (max(8, b) prompts of 64 tokens, `--new-tokens` each, concurrency b), in alternating runs
after one unmeasured run each. Per run: output tokens/s, steps, and the median of each device phase over the
steps of b rows with no prefill token. Printed and written to --out: per b, both engines' means and the ratio of
the K engine's tokens/s to the static one's (95% interval).

    python benchmarks/diagnostics/depth_headroom.py --out headroom.json [--pairs lfm2-1.2b+lfm2-350m]
        [--k 1] [--max-k 8] [--batches 1,16,64] [--rate 0.6] [--repeats 6] [--new-tokens 128]

Needs only torch, safetensors and tokenizers (and a CUDA GPU; `--device cpu` checks the script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

from dynamic_depth_gpu import build_engine, machine, num_prompts, prompts_for
from gpu_cudagraphs import DEMO_PAIRS, RANDOM_PAIRS, ZOO, timed_generate

from specexp.measure.intervals import ratio_interval, repeat_summary
from specexp.models import load_model

PHASES = ("schedule_ms", "verify_ms", "sample_ms", "draft_ms", "step_ms")


def run_once(engine, prompts: list[list[int]], batch: int) -> dict:
    """One run at concurrency `batch`: tokens/s, steps, the k its steps ran, and the phase medians of its full
    pure-verify steps (ms)."""
    out = timed_generate(engine, prompts, max_concurrency=batch)
    pure = [s for s in out.steps if s.num_reqs == batch and s.num_prefill_tokens == 0]
    return {"output_tokens_per_s": sum(r.num_output_tokens for r in out.requests) / out.total_s,
            "steps": len(out.steps), "pure_steps": len(pure),
            "step_ks": sorted({s.num_speculative_tokens for s in out.steps}),
            **{name: statistics.median(getattr(s, name) for s in pure) if pure else None for name in PHASES}}


def compare(engines: dict[str, object], prompts: list[list[int]], batch: int, repeats: int) -> dict:
    """Alternating runs of both engines at one batch size, after one unmeasured run each."""
    for engine in engines.values():
        run_once(engine, prompts, batch)
    runs = {name: [] for name in engines}
    for index in range(repeats):
        order = list(engines) if index % 2 == 0 else list(engines)[::-1]
        for name in order:
            runs[name].append(run_once(engines[name], prompts, batch))
    out = {}
    for name, rs in runs.items():
        out[name] = {"output_tokens_per_s": repeat_summary([r["output_tokens_per_s"] for r in rs]),
                     "steps": statistics.mean(r["steps"] for r in rs),
                     **{p: statistics.mean(r[p] for r in rs) if all(r[p] is not None for r in rs) else None
                        for p in PHASES}, "runs": rs}
    static, headroom = list(engines)
    out["ratio"] = ratio_interval([r["output_tokens_per_s"] for r in runs[headroom]],
                                  [r["output_tokens_per_s"] for r in runs[static]])
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pairs", default="lfm2-1.2b+lfm2-350m")
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--rate", type=float, default=0.6)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    if not 1 <= args.k <= args.max_k:
        raise SystemExit(f"--k={args.k} --max-k={args.max_k}: needs 1 <= k <= max-k")
    batches = sorted(int(b) for b in args.batches.split(","))
    result = {"machine": machine(args.device), "k": args.k, "max_k": args.max_k, "rate": args.rate,
              "repeats": args.repeats, "new_tokens": args.new_tokens, "pairs": {}}
    static_name, headroom_name = f"K={args.k}", f"K={args.max_k} at k={args.k}"
    for pair in args.pairs.split(","):
        if pair not in RANDOM_PAIRS and pair not in DEMO_PAIRS:
            raise SystemExit(f"--pairs: unknown pair {pair!r}: valid are {', '.join([*RANDOM_PAIRS, *DEMO_PAIRS])}")
        synthetic = pair in RANDOM_PAIRS
        target_path, draft_path = RANDOM_PAIRS.get(pair) or DEMO_PAIRS[pair]
        dtype = torch.bfloat16 if synthetic and args.device == "cuda" else torch.float32
        weights = "random" if synthetic else "trained"
        target = load_model(ZOO / target_path, dtype=dtype, device=args.device, weights=weights, seed=0)
        draft = load_model(ZOO / draft_path, dtype=dtype, device=args.device, weights=weights, seed=1)
        every = prompts_for(pair, target.config.vocab_size, max(num_prompts(b) for b in batches))
        schedule = {"num_speculative_tokens": args.max_k,
                    "num_speculative_tokens_per_batch_size": ((1, max(batches), args.k),)}
        engines = {static_name: build_engine(target, draft, {"num_speculative_tokens": args.k}, batches,
                                             args.device, synthetic, args.new_tokens),
                   headroom_name: build_engine(target, draft, schedule, batches, args.device, synthetic,
                                               args.new_tokens)}
        if synthetic:
            for engine in engines.values():
                engine.set_synthetic_acceptance(rate=args.rate)
        result["pairs"][pair] = {}
        for b in batches:
            cell = compare(engines, every[:num_prompts(b)], b, args.repeats)
            result["pairs"][pair][b] = cell
            phases = "  ".join(f"{p} {cell[static_name][p] or 0:.3f}/{cell[headroom_name][p] or 0:.3f}"
                               for p in PHASES)
            ratio = cell["ratio"]
            print(f"{pair} b={b}: {headroom_name} / {static_name} tokens/s {ratio['value']:.3f} "
                  f"[{ratio['low']:.3f}, {ratio['high']:.3f}]; steps {cell[static_name]['steps']:.1f}/"
                  f"{cell[headroom_name]['steps']:.1f}; pure-step medians {phases}", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
        del engines
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return result


if __name__ == "__main__":
    main()
