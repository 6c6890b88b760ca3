"""A reused engine against engines built at each k, in one process, on a GPU.

A reused sweep (`sweep.reuse_engine=true`) serves every k from one engine built at K = the sweep's largest k, switched
between runs (`NativeEngine.use_static_depth`); an isolated job builds its engine at K = k. Both emit the same tokens
and acceptance. Is the reused engine's step as fast? This script builds, for each `--ks` value, the engine an
isolated job builds (K = k) and one engine at K = `--max-k` serving all of them, each with `engine.max_model_len=auto`
as the CLI resolves it for its K (the longest prompt + new tokens + K, rounded up to a block), and `engine=cuda`'s
kernels; the K engine captures every depth 0..K, as a reused sweep over k = 0..K does (`--serve ks`: only `--ks`).
First `--rounds` rounds of the engines built at k alone, before the K engine exists; then `--rounds` rounds, each
running every (k, engine) once over the same random prompts (batch 1, synthetic acceptance), the two engines of a k
in alternating order. The garbage collector is paused inside each run.
(`depth_headroom.py` asks the dynamic-depth form: a K engine whose batch-size schedule picks k, at larger batches.)

Per k and engine: output tokens/s per run and their mean with its 95% t interval, the median step, verify and draft
phase; the reused / isolated ratio of each round's pair of runs (mean, 95% t interval, n = rounds); the engine built
at k's tokens/s before the K engine was built (does another engine's presence in the process, its graphs and
memory, slow it?); whether both engines emitted the same tokens; the engines' max_model_len and key-length buckets.

    python benchmarks/diagnostics/reuse_cost.py --ks 1,4 --max-k 8 --rounds 4 [--serve all] --out reuse_cost.json
    python benchmarks/diagnostics/reuse_cost.py --table reuse_cost.json [...]   (any machine)

Measuring needs torch, safetensors, triton and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)

from result_tables import print_result_tables

from specexp.measure.intervals import repeat_summary

BLOCK_SIZE = 16


def engine_row(outs: list, engine) -> dict:
    """One (k, engine)'s figures over its timed runs (engine.generate outputs)."""
    steps = [s for out in outs for s in out.steps if s.num_prefill_tokens == 0]
    rates = [sum(r.num_output_tokens for r in out.requests) / out.total_s for out in outs]
    return {"output_tokens_per_s_runs": rates, "output_tokens_per_s": repeat_summary(rates),
            "step_ms_p50": statistics.median(s.step_ms for s in steps),
            "verify_ms_p50": statistics.median(s.verify_ms for s in steps),
            "draft_ms_p50": statistics.median(s.draft_ms for s in steps),
            "steps": len(steps) / len(outs),
            "graph_eager": sum(m.num_eager for m in engine.graph_managers()),
            "max_model_len": engine.cfg.max_model_len, "seq_len_buckets": list(engine.seq_len_buckets)}


def measure(pair: str, ks: list[int], max_k: int, rounds: int, num_prompts: int, prompt_len: int, new_tokens: int,
            rate: float, serve: str = "all") -> dict:
    import torch
    from gpu_cudagraphs import CUDA_KERNELS, RANDOM_PAIRS, ZOO, make_engine, timed_generate

    from specexp.models import load_model
    from specexp.run_spec import auto_max_model_len

    target_path, draft_path = RANDOM_PAIRS[pair]
    target = load_model(ZOO / target_path, weights="random", dtype=torch.bfloat16, device="cuda")
    draft = load_model(ZOO / draft_path, weights="random", dtype=torch.bfloat16, device="cuda")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, target.config.vocab_size) for _ in range(prompt_len)] for _ in range(num_prompts)]

    def length(k: int) -> int:
        return auto_max_model_len([type("P", (), {"token_ids": p})() for p in prompts], new_tokens, k, BLOCK_SIZE,
                                  1 << 20)

    def build(k: int, serve: tuple[int, ...] = ()):
        engine = make_engine(target, draft, k, 1, graphs=True, rejection="synthetic", rate=rate,
                             max_model_len=length(k), kernels=CUDA_KERNELS, serve_depths=serve,
                             max_new_tokens=new_tokens)
        print(f"  built K = {k}" + (f" serving {list(serve)}" if serve else ""), flush=True)
        return engine

    isolated = {k: build(k) for k in ks}

    def run(name: str, k: int):
        engine = isolated[k] if name == "isolated" else reused
        if name == "reused":
            engine.use_static_depth(k)
        engine.reseed(0)
        return timed_generate(engine, prompts)

    alone = {k: [] for k in ks}
    for k in ks:  # untimed: first-use costs
        run("isolated", k)
    for _ in range(rounds):
        for k in ks:
            alone[k].append(run("isolated", k))
    reused = build(max_k, tuple(range(max_k + 1)) if serve == "all" else tuple(ks))
    for k in ks:
        run("reused", k)
    outs = {(k, name): [] for k in ks for name in ("isolated", "reused")}
    for r in range(rounds):
        for k in ks:
            for name in (("isolated", "reused") if r % 2 == 0 else ("reused", "isolated")):
                outs[(k, name)].append(run(name, k))
    rows = []
    for k in ks:
        iso, reu = outs[(k, "isolated")], outs[(k, "reused")]
        ratios = [sum(r.num_output_tokens for r in b.requests) / b.total_s
                  / (sum(r.num_output_tokens for r in a.requests) / a.total_s) for a, b in zip(iso, reu)]
        same_tokens = all(ra.output_token_ids == rb.output_token_ids
                          for a, b in zip(iso, reu) for ra, rb in zip(a.requests, b.requests))
        row = {"k": k, "isolated": engine_row(iso, isolated[k]),
               "reused": engine_row(reu, reused), "isolated_alone": engine_row(alone[k], isolated[k]),
               "reused_over_isolated": repeat_summary(ratios), "same_tokens": same_tokens}
        rows.append(row)
        s = row["reused_over_isolated"]
        print(f"  k = {k}: isolated alone {row['isolated_alone']['output_tokens_per_s']['mean']:.1f}, beside the K "
              f"engine {row['isolated']['output_tokens_per_s']['mean']:.1f}, reused "
              f"{row['reused']['output_tokens_per_s']['mean']:.1f} tokens/s, reused / isolated {s['mean']:.4f} "
              f"[{s['low']:.4f}, {s['high']:.4f}] (n = {rounds}), same tokens {same_tokens}", flush=True)
    return {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                        "python": platform.python_version()},
            "settings": {"pair": pair, "ks": ks, "max_k": max_k, "serve": serve, "rounds": rounds,
                         "num_prompts": num_prompts,
                         "prompt_len": prompt_len, "new_tokens": new_tokens, "synthetic_acceptance_rate": rate},
            "rows": rows}


def render_table(results: list[tuple[str, dict]]) -> str:
    """Markdown: per file and k, each engine's tokens/s [95% t], median step / verify / draft ms, and the ratio."""
    def interval(s: dict, digits: int) -> str:
        return f"{s['mean']:.{digits}f} [{s['low']:.{digits}f}, {s['high']:.{digits}f}]"

    lines = [("| file | GPU | k | isolated (K = k) tokens/s | reused (K = max) tokens/s | reused / isolated | "
              "step ms, isolated / reused | verify ms | draft ms | same tokens | isolated before the K engine "
              "existed, tokens/s | n |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for file, result in results:
        for row in result["rows"]:
            a, b = row["isolated"], row["reused"]
            lines.append(
                f"| `{file}` | {result['machine']['gpu']} | {row['k']} | {interval(a['output_tokens_per_s'], 1)} | "
                f"{interval(b['output_tokens_per_s'], 1)} | {interval(row['reused_over_isolated'], 4)} | "
                f"{a['step_ms_p50']:.3f} / {b['step_ms_p50']:.3f} | {a['verify_ms_p50']:.3f} / "
                f"{b['verify_ms_p50']:.3f} | {a['draft_ms_p50']:.3f} / {b['draft_ms_p50']:.3f} | "
                f"{'yes' if row['same_tokens'] else '**no**'} | "
                f"{interval(row['isolated_alone']['output_tokens_per_s'], 1) if 'isolated_alone' in row else '-'} | "
                f"{result['settings']['rounds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", nargs="+", metavar="FILE", help="print the files' table and exit (any machine)")
    parser.add_argument("--out", default="reuse_cost.json")
    parser.add_argument("--pair", default="llama-3.2-1b+llama-100m")
    parser.add_argument("--ks", default="1,4", help="comma-separated depths, each 1..max-k")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rate", type=float, default=0.8, help="synthetic acceptance rate")
    parser.add_argument("--serve", choices=["all", "ks"], default="all",
                        help="the depths the K engine captures: all of 0..K (as a reused sweep over them) or --ks")
    args = parser.parse_args(argv)
    if args.table:
        print_result_tables(parser, args.table, render_table)
        return
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error(f"--ks {args.ks!r}: comma-separated integers")
    if any(not 1 <= k <= args.max_k for k in ks) or args.rounds < 2 or not 0 < args.rate <= 1:
        parser.error(f"--ks each in 1..--max-k ({args.max_k}); --rounds >= 2; --rate in (0, 1]")
    from gpu_cudagraphs import RANDOM_PAIRS
    if args.pair not in RANDOM_PAIRS:
        parser.error(f"--pair {args.pair!r}: one of {', '.join(RANDOM_PAIRS)}")
    import torch
    if not torch.cuda.is_available():
        sys.exit("reuse_cost.py needs a CUDA GPU")
    result = measure(args.pair, ks, args.max_k, args.rounds, args.prompts, args.prompt_len, args.new_tokens,
                     args.rate, args.serve)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
