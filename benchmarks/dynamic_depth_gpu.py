"""Static k against the dynamic depth modes, per batch size, on one GPU (needs torch, safetensors, tokenizers,
pyyaml; the depth modes are read from conf/speculator/depth/, the files `+exp=dynamic_depth` sweeps).

Per pair, one engine per depth mode (static k = 1, 2, 3, 4, 6, 8 at K = k; the batch-size schedule, the
confidence rule and adaptive goodput at K = 8), all built on the same loaded models with `engine=cuda`'s kernel
switches, graphs captured at the batch sizes measured. Random-weight 1B-class pairs run synthetic acceptance (each
rate set on the built engines between runs); the trained demo pair runs its real greedy acceptance on held-out
code prompts. Every run serves a fixed workload at a concurrency of b (`generate(max_concurrency=b)`: b requests
in flight, a new one admitted when one finishes), 64-token prompts, a token budget of 1024 a step for every
engine, `--new-tokens` tokens each, EOS ignored, max(8, b) prompts. One unmeasured round first, then rounds
that interleave: each round runs every (batch, mode) once, the modes' order rotated from round to round, so
drift of the machine reaches every mode alike.

A second phase builds the schedule tuned from the first: at each batch size the best static k of that rate
(`num_speculative_tokens_per_batch_size` over the measured batch sizes, K = 8), and measures it in rounds
alternating with that best static engine (the first phase's engine; rates with the same schedule share one
schedule engine).

    python benchmarks/dynamic_depth_gpu.py --out results.json [--pairs llama-3.2-1b+llama-100m,tiny_lfm2]
        [--batches 1,4,16,64] [--modes k1,k2,k3,k4,k6,k8,schedule,confidence,goodput] [--rates 0.6,0.8]
        [--repeats 3] [--tuned-repeats N] [--new-tokens 64] [--device cuda|cpu] [--no-tuned-schedule]

`--tuned-repeats` (default: `--repeats`) sets the tuned phase's rounds alone: its runs cost little next to the
engine builds, and its ratio is the one the target is read from.

`--mixed` (default `parts`) is every engine's `engine.cudagraph_mixed`. The workload rarely mixes prompt chunks
with verify rows: at b = 16 and 64 every request starts at once, and at b = 1 a new prompt never has a verify row
beside it. Joined mixed-step graphs (one per chunk shape and key) were still most of the graphs an engine
captured. Counted on this script's settings (sizes 1/4/16/64, prompt graphs 16-128, emulated on a CPU,
2026-12-04), joined / parts: static k = 4 214 / 20 graphs, the shipped schedule 520 / 32. With parts, a mixed
step replays the verify graph, then a prompt graph per chunk.

`--device cpu` runs the same code on emulated graphs (a check of the script, not a measurement). The JSON is
rewritten after every pair and rate, so a run cut short keeps what it finished; `dynamic_depth_report.py`
renders it.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_cudagraphs import CUDA_KERNELS, DEMO_PAIRS, RANDOM_PAIRS, ZOO, timed_generate

from specexp.engine.config import EngineConfig, SamplingConfig, SpeculatorConfig
from specexp.engine.cudagraph import FULL
from specexp.engine.depth import schedule_from_best_k
from specexp.engine.runner import NativeEngine
from specexp.measure.intervals import ratio_interval, repeat_summary
from specexp.models import load_model

DEPTH_CONF = ROOT / "conf" / "speculator" / "depth"
PROMPT_TOKENS = 64
# One step's token budget for every engine: left to its default (which grows with K), a K = 8 engine would
# prefill in fewer, larger chunks than a static k = 1 one, and the comparison would measure that.
TOKEN_BUDGET = 1024
DEFAULT_MODES = "k1,k2,k3,k4,k6,k8,schedule,confidence,goodput"


@functools.cache
def mode_settings(mode: str) -> dict:
    """The speculator keys of conf/speculator/depth/<mode>.yaml (e.g. {"num_speculative_tokens": 8, ...})."""
    path = DEPTH_CONF / f"{mode}.yaml"
    if not path.exists():
        valid = ", ".join(sorted(p.stem for p in DEPTH_CONF.glob("*.yaml")))
        raise SystemExit(f"--modes: unknown depth mode {mode!r}: valid are {valid}")
    settings = yaml.safe_load(path.read_text())
    if "num_speculative_tokens_per_batch_size" in settings:
        settings["num_speculative_tokens_per_batch_size"] = tuple(
            tuple(r) for r in settings["num_speculative_tokens_per_batch_size"])
    return settings


def is_static(mode: str) -> bool:
    return set(mode_settings(mode)) == {"num_speculative_tokens"}


def build_engine(target, draft, settings: dict, batches: list[int], device: str, synthetic: bool,
                 new_tokens: int, mixed: str = "parts") -> NativeEngine:
    """An engine for one depth mode: graphs at the measured batch sizes, one key-length bucket; mixed steps
    (prompt chunks beside verify rows) `mixed` ("parts" or "joined", `engine.cudagraph_mixed`)."""
    cuda = device == "cuda"
    kernels = {**(CUDA_KERNELS if cuda else {}), "cudagraph_mixed": mixed}
    block = 16
    max_model_len = -(-(PROMPT_TOKENS + 1 + new_tokens + 8) // block) * block
    engine = EngineConfig(device=device, dtype=str(target.lm_head.weight.dtype).replace("torch.", ""),
                          max_num_seqs=max(batches), max_model_len=max_model_len, block_size=block,
                          max_num_batched_tokens=TOKEN_BUDGET,
                          cudagraph_mode=FULL, cudagraph_capture_sizes=sorted(batches), **kernels)
    spec = SpeculatorConfig(cudagraph_mode=FULL, rejection="synthetic" if synthetic else "standard", **settings)
    return NativeEngine(target, draft, engine, spec,
                        SamplingConfig(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True),
                        emulate_graphs_on_cpu=not cuda)


def prompts_for(pair: str, vocab: int, num: int) -> list[list[int]]:
    """num prompts of PROMPT_TOKENS tokens: held-out code for a demo pair, random tokens for a random pair."""
    if pair in DEMO_PAIRS:
        from types import SimpleNamespace

        from specexp.workloads import load_prompts

        workload = SimpleNamespace(name="code", path=None, num_prompts=num, input_len=PROMPT_TOKENS, seed=0)
        prompts = load_prompts(workload, ZOO / "tokenizer.json", vocab)
        return [list(p.token_ids)[:PROMPT_TOKENS] for p in prompts]
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(num)]


def num_prompts(batch: int) -> int:
    """Prompts a run at concurrency `batch` serves: enough to fill it, and at least 8."""
    return max(8, batch)


def timed_run(engine: NativeEngine, prompts: list[list[int]], batch: int) -> dict:
    """One run at concurrency `batch` (garbage collector paused); its figures."""
    managers = engine.graph_managers()
    eager_before = sum(m.num_eager for m in managers)
    uncaptured_before = sum(sum(m.num_eager_uncaptured.values()) for m in managers)
    out = timed_generate(engine, prompts, max_concurrency=batch)
    tokens = sum(r.num_output_tokens for r in out.requests)
    decode = [s for s in out.steps if s.num_prefill_tokens == 0]
    drafts = sum(s.num_drafts for s in out.steps)
    return {
        "output_tokens_per_s": tokens / out.total_s, "wall_s": out.total_s, "output_tokens": tokens,
        "steps": len(out.steps),
        "acceptance_length": 1 + sum(s.num_accepted_tokens for s in out.steps) / drafts if drafts else 1.0,
        "mean_drafted_tokens_per_row": sum(s.num_draft_tokens for s in out.steps) / drafts if drafts else 0.0,
        "mean_k_per_decode_step": sum(s.num_speculative_tokens for s in decode) / len(decode) if decode else 0.0,
        "k_hist": {str(k): sum(1 for s in out.steps if s.num_speculative_tokens == k)
                   for k in sorted({s.num_speculative_tokens for s in out.steps})},
        "eager_steps": sum(m.num_eager for m in managers) - eager_before,
        "eager_uncaptured_steps": sum(sum(m.num_eager_uncaptured.values()) for m in managers) - uncaptured_before,
    }


def summarize(runs: list[dict]) -> dict:
    """A (mode, batch) cell: tokens/s over the rounds (mean, std, 95% t interval, n) and the pooled figures."""
    tps = [r["output_tokens_per_s"] for r in runs]
    return {"output_tokens_per_s": repeat_summary(tps), "output_tokens_per_s_runs": tps,
            **{name: sum(r[name] for r in runs) / len(runs)
               for name in ("acceptance_length", "mean_drafted_tokens_per_row", "mean_k_per_decode_step", "steps")},
            "eager_uncaptured_steps": sum(r["eager_uncaptured_steps"] for r in runs), "runs": runs}


def measure_rounds(engines: dict[str, NativeEngine], prompts: dict[int, list[list[int]]], repeats: int,
                   label: str, warmup_rounds: int = 1) -> dict[str, dict[int, dict]]:
    """`warmup_rounds` unmeasured rounds, then `repeats` measured ones; each runs every (batch, mode) once, the
    modes' order rotated by one each round. The warm-up runs every shape a measured run meets once (on the H200,
    an engine's first run at a batch size ran up to 5x slower than its later ones)."""
    names = list(engines)
    for _ in range(warmup_rounds):
        for b, batch_prompts in prompts.items():
            for name in names:
                timed_run(engines[name], batch_prompts, b)
    runs = {name: {b: [] for b in prompts} for name in names}
    for round_index in range(repeats):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for b, batch_prompts in prompts.items():
            for name in order:
                runs[name][b].append(timed_run(engines[name], batch_prompts, b))
        print(f"    {label}: round {round_index + 1}/{repeats} done", flush=True)
    return {name: {b: summarize(r) for b, r in by_batch.items()} for name, by_batch in runs.items()}


def graph_cost(engine: NativeEngine) -> dict:
    """What an engine's graphs cost: its (size, k) keys, the graphs of those keys (verify, draft prefill and
    decode at each key-length bucket), every graph it captured (`graphs`: also prompt and joined mixed-step
    graphs, one per chunk shape and key), bytes and capture seconds (None without graphs)."""
    summary = engine.graph_summary()
    if summary is None:
        return {}
    spec = engine.speculator  # the k-specialised managers' keys, as captured (a two-slot draft prefill: one a size)
    num_keys = len(engine.verify_graphs.keys) + (len(spec.prefill_graphs.keys) + len(spec.decode_graphs.keys)
                                                 if spec is not None else 0)
    return {"graph_keys": num_keys, "depth_graphs": num_keys * len(engine.seq_len_buckets),
            "graphs": sum(len(m.graphs) for m in engine.graph_managers()),
            "graph_capture_bytes": summary["graph_capture_bytes"], "graph_capture_s": summary["graph_capture_s"],
            "graph_capture_reserved_bytes": summary.get("graph_capture_reserved_bytes"),
            "step_costs": engine.step_costs.to_dict() if engine.step_costs is not None else None}


def best_static(cells: dict[str, dict[int, dict]], b: int) -> str:
    statics = [m for m in cells if is_static(m)]
    return max(statics, key=lambda m: cells[m][b]["output_tokens_per_s"]["mean"])


def ratios(cells: dict[str, dict[int, dict]]) -> dict[str, dict[int, dict]]:
    """Per mode and batch, tokens/s over the best static k's at that batch (delta-method interval)."""
    out = {}
    for mode, by_batch in cells.items():
        out[mode] = {}
        for b, cell in by_batch.items():
            best = best_static(cells, b)
            out[mode][b] = {"best_static": best, **ratio_interval(cell["output_tokens_per_s_runs"],
                                                                  cells[best][b]["output_tokens_per_s_runs"])}
    return out


def bench_pair(pair: str, args, result: dict, out_path: Path) -> None:
    synthetic = pair in RANDOM_PAIRS
    target_path, draft_path = RANDOM_PAIRS.get(pair) or DEMO_PAIRS[pair]
    dtype = torch.bfloat16 if synthetic and args.device == "cuda" else torch.float32
    weights = "random" if synthetic else "trained"
    print(f"== {pair} ({weights}, {dtype})", flush=True)
    target = load_model(ZOO / target_path, dtype=dtype, device=args.device, weights=weights, seed=0)
    draft = load_model(ZOO / draft_path, dtype=dtype, device=args.device, weights=weights, seed=1)
    vocab = target.config.vocab_size
    every = prompts_for(pair, vocab, max(num_prompts(b) for b in args.batches))
    prompts = {b: every[:num_prompts(b)] for b in args.batches}
    engines, build = {}, {}
    for mode in args.modes:
        start = time.perf_counter()
        engines[mode] = build_engine(target, draft, mode_settings(mode), args.batches, args.device, synthetic,
                                     args.new_tokens, args.mixed)
        build[mode] = {"build_s": time.perf_counter() - start, **graph_cost(engines[mode])}
        print(f"  built {mode}: {build[mode]['build_s']:.1f} s, {build[mode].get('graphs', 0)} graphs", flush=True)
    entry = result["pairs"].setdefault(pair, {"target": target_path, "draft": draft_path, "weights": weights,
                                              "dtype": str(dtype), "engines": build, "by_rate": {}})
    tuned_engines: dict[tuple, NativeEngine] = {}  # by schedule: rates whose best k agree share one
    for rate in (args.rates if synthetic else [None]):
        label = f"rate {rate}" if synthetic else "greedy"
        for engine in engines.values():
            if synthetic:
                engine.set_synthetic_acceptance(rate=rate)
            engine.generate(prompts[min(args.batches)][:2], max_new_tokens=8)  # warm-up
        cells = measure_rounds(engines, prompts, args.repeats, label)
        by_rate = {"cells": cells, "ratio_to_best_static": ratios(cells)}
        for b in args.batches:
            best = best_static(cells, b)
            line = "  ".join(f"{m} {cells[m][b]['output_tokens_per_s']['mean']:.0f}" for m in args.modes)
            print(f"  {label} batch {b}: best static {best}; tokens/s {line}", flush=True)
        entry["by_rate"][str(rate) if synthetic else "greedy"] = by_rate
        out_path.write_text(json.dumps(result, indent=1))  # kept if the tuned phase is cut short
        if args.tuned_schedule:
            by_rate["tuned_schedule"] = measure_tuned(target, draft, engines, tuned_engines, cells, prompts, args,
                                                      synthetic, rate)
            out_path.write_text(json.dumps(result, indent=1))
    del engines, tuned_engines
    if args.device == "cuda":
        torch.cuda.empty_cache()


def measure_tuned(target, draft, engines: dict[str, NativeEngine], tuned_engines: dict[tuple, NativeEngine],
                  cells, prompts, args, synthetic: bool, rate) -> dict:
    """The schedule of each batch size's best static k, at K = 8, against those best static engines (the ones
    the first phase measured, `engines` by mode). The schedule's engine is built once per schedule
    (`tuned_engines`, filled here) and its build time and graph cost recorded."""
    best = {b: best_static(cells, b) for b in args.batches}
    best_k = {b: mode_settings(m)["num_speculative_tokens"] for b, m in best.items()}
    schedule = schedule_from_best_k(best_k)
    settings = {"num_speculative_tokens": 8, "num_speculative_tokens_per_batch_size": schedule}
    start = time.perf_counter()
    if schedule not in tuned_engines:
        tuned_engines[schedule] = build_engine(target, draft, settings, args.batches, args.device, synthetic,
                                               args.new_tokens, args.mixed)
    tuned = tuned_engines[schedule]
    build = {"build_s": time.perf_counter() - start, **graph_cost(tuned)}
    statics = {m: engines[m] for m in sorted(set(best.values()))}
    for engine in (tuned, *statics.values()):
        if synthetic:
            engine.set_synthetic_acceptance(rate=rate)
        engine.generate(prompts[min(args.batches)][:2], max_new_tokens=8)
    out = {"schedule": [list(r) for r in schedule], "engine": build, "by_batch": {}}
    for b in args.batches:
        pair_engines = {"tuned_schedule": tuned, best[b]: statics[best[b]]}
        cells = measure_rounds(pair_engines, {b: prompts[b]}, args.tuned_repeats, f"tuned schedule, batch {b}")
        t, s = cells["tuned_schedule"][b], cells[best[b]][b]
        out["by_batch"][b] = {"best_static": best[b], "tuned": t, "static": s,
                              "ratio": ratio_interval(t["output_tokens_per_s_runs"], s["output_tokens_per_s_runs"])}
        print(f"    tuned schedule batch {b}: {out['by_batch'][b]['ratio']['value']:.3f} x {best[b]}", flush=True)
    return out


def machine(device: str) -> dict:
    info = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(), "torch": torch.__version__,
            "device": device}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pairs", default="llama-3.2-1b+llama-100m,lfm2-1.2b+lfm2-350m,tiny_lfm2")
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--modes", default=DEFAULT_MODES)
    parser.add_argument("--rates", default="0.6,0.8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tuned-repeats", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--no-tuned-schedule", dest="tuned_schedule", action="store_false")
    parser.add_argument("--mixed", default="parts", choices=["parts", "joined"])
    args = parser.parse_args(argv)
    args.batches = sorted(int(b) for b in args.batches.split(","))
    if args.tuned_repeats is None:
        args.tuned_repeats = args.repeats
    for name in ("repeats", "tuned_repeats"):
        if getattr(args, name) < 2:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)}: needs at least 2 rounds for a spread")
    args.modes = args.modes.split(",")
    args.rates = [float(r) for r in args.rates.split(",")]
    pairs = args.pairs.split(",")
    for pair in pairs:
        if pair not in RANDOM_PAIRS and pair not in DEMO_PAIRS:
            raise SystemExit(f"--pairs: unknown pair {pair!r}: valid are {', '.join([*RANDOM_PAIRS, *DEMO_PAIRS])}")
    for mode in args.modes:
        mode_settings(mode)
    if not any(is_static(m) for m in args.modes):
        raise SystemExit(f"--modes={','.join(args.modes)}: needs at least one static k (e.g. k4) to compare with")
    out_path = Path(args.out)
    result = {"machine": machine(args.device), "batches": args.batches, "modes": args.modes,
              "repeats": args.repeats, "tuned_repeats": args.tuned_repeats, "new_tokens": args.new_tokens,
              "prompt_tokens": PROMPT_TOKENS, "mixed_steps": args.mixed,
              "argv": sys.argv[1:] if argv is None else argv, "pairs": {}}
    for pair in pairs:
        bench_pair(pair, args, result, out_path)
    out_path.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
