"""Batch-1 decode steps with and without the kernel cuts `engine=cuda` runs, on a GPU: what the cuts buy in step
time, kernel launches and Leviathan's c, all together ("defaults" against "none"), each alone ("only_*") and each
left out ("no_*"), and whose one-row GEMVs launch early ("gemv_early_*"), measured in alternating rounds.

For every pair and every configuration (CONFIGS: `engine=cuda`'s kernels with some switches changed) it builds
three engines on the same models: the target's k = 0 batch-1 decode step and the draft's (as
`gpu_cudagraphs.py` times them: c = draft step / target step), and a k = K speculative engine whose fused
multi-step draft decode graph (K - 1 draft steps, the draft's own bookkeeping between them) is replayed alone.
Then, over `--rounds` rounds, each configuration's three graphs are replayed in turn (the median of `--iters`
synchronised replays each). Per configuration it reports each figure's mean over rounds with a 95% t interval
(n = rounds), c per round, the target step's share of the copy bandwidth, and each graph's kernel launches (one
profiled replay; the speculative decode graph's are those of its K - 1 draft steps together), and whether each
graph emitted the first configuration's tokens (the same inert inputs everywhere). A configuration that fails to
build is recorded with its error (`errors`) and the others are measured.

    python benchmarks/diagnostics/kernel_cuts.py --out kernel_cuts.json [--pairs llama-3.2-1b+llama-100m,...]
                                                 [--configs defaults,none] [--rounds 7] [--iters 30] [--k 4]

    python benchmarks/diagnostics/kernel_cuts.py --table FILE.json [FILE.json ...]   # the table of earlier runs

Needs only torch, safetensors, tokenizers and triton, and a CUDA GPU (the table needs neither GPU nor triton).
Prints each configuration's row as its rounds finish and rewrites the JSON after each pair.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

from gpu_cudagraphs import (
    CUDA_KERNELS,
    RANDOM_PAIRS,
    ZOO,
    batch1_decode_step,
    copy_bandwidth_bytes_per_s,
    cuda_ms,
    kernel_breakdown,
    make_engine,
    model_bytes,
)

from specexp.engine.cudagraph import FULL, BatchExecutionDescriptor
from specexp.measure.intervals import repeat_summary
from specexp.models import load_model

# The kernel cuts and the value each takes when on; `engine=cuda` (CUDA_KERNELS) runs with every one on.
CUTS = {"argmax_kernel": "triton", "sampler_kernel": "triton", "silu_in_down_gemv": True,
        "draft_step_kernel": "triton", "programmatic_launch": True}
NO_CUTS = {"argmax_kernel": "torch", "sampler_kernel": "torch", "silu_in_down_gemv": False,
           "draft_step_kernel": "torch", "programmatic_launch": False}
# Each cut's short name and its switch; the switches turned on beside it in its "only_*" configuration (the
# sampler cut is measured on top of the argmax cut, whose output it reads, as it ships).
CUT_NAMES = {"argmax": "argmax_kernel", "sampler": "sampler_kernel", "silu_in_down": "silu_in_down_gemv",
             "draft_step": "draft_step_kernel", "pdl": "programmatic_launch"}
ALONG_WITH = {"sampler_kernel": ("argmax_kernel",)}
# Whose one-row GEMVs launch early (programmatic launch on), beside the cuts: "gemv_early_<role>" sets
# engine.gemv_early_launch to that role (engine=cuda: both).
LAUNCH_ORDERS = {f"gemv_early_{role}": {"gemv_early_launch": role} for role in ("target", "draft", "none")}
# The argmax in two launches and greedy verification in a third, against the one launch of the defaults.
ARGMAX_LAUNCHES = {"argmax_two_launches": {"argmax_kernel": "triton_two_launches"}}
# Each configuration: the switches it changes from engine=cuda's defaults (CUDA_KERNELS). "none" turns every cut
# off; each "only_*" turns on that cut alone (with ALONG_WITH's); each "no_*" turns that cut off alone; then
# LAUNCH_ORDERS and ARGMAX_LAUNCHES.
CONFIGS = {
    "defaults": {},
    "none": NO_CUTS,
    **{f"only_{name}": {**NO_CUTS, **{s: CUTS[s] for s in (*ALONG_WITH.get(switch, ()), switch)}}
       for name, switch in CUT_NAMES.items()},
    **{f"no_{name}": {switch: NO_CUTS[switch]} for name, switch in CUT_NAMES.items()},
    **LAUNCH_ORDERS,
    **ARGMAX_LAUNCHES,
}


def _mean_interval(summary: dict, digits: int) -> str:
    """A repeat_summary as "mean [low, high]" at `digits` decimals."""
    return f"{summary['mean']:.{digits}f} [{summary['low']:.{digits}f}, {summary['high']:.{digits}f}]"


def build(target, draft, kernels: dict, k: int) -> dict:
    """The three graphs of one configuration: {"target", "draft", "spec_decode"} -> (replay fn, what it is)."""
    target_engine, target_desc = batch1_decode_step(target, kernels)
    draft_engine, draft_desc = batch1_decode_step(draft, kernels)
    for engine in (target_engine, draft_engine):  # the inert row samples: each replay emits the argmax token
        engine.row_inputs[:1, engine.k + 3] = 1
    spec_engine = make_engine(target, draft, k, 1, graphs=True, kernels=kernels, rejection="synthetic", rate=0.8)
    spec_desc = BatchExecutionDescriptor(1, 1, FULL, min(spec_engine.seq_len_buckets), k)
    spec_engine.speculator._prepare_decode_capture(spec_desc)
    return {"engines": (target_engine, draft_engine, spec_engine),
            "target": functools.partial(target_engine.verify_graphs.replay, target_desc),
            "draft": functools.partial(draft_engine.verify_graphs.replay, draft_desc),
            "spec_decode": functools.partial(spec_engine.speculator.decode_graphs.replay, spec_desc)}


def bench_pair(name: str, configs: list[str], rounds: int, iters: int, k: int, copy_bw: float) -> dict:
    target_path, draft_path = RANDOM_PAIRS[name]
    target = load_model(ZOO / target_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
    draft = load_model(ZOO / draft_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=1)
    graphs, errors = {}, {}
    for config in configs:
        # no prompt-prefill graphs: the decode steps measured here do not use them, and they lengthen each build
        kernels = {**CUDA_KERNELS, **CONFIGS[config], "cudagraph_prefill_tokens": ()}
        try:
            graphs[config] = build(target, draft, kernels, k)
        except Exception as exc:  # noqa: BLE001 - one configuration that cannot run leaves the others measured
            errors[config] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"  {config} failed to build: {errors[config]}", flush=True)
            continue
        print(f"  built {config}", flush=True)
    configs = [config for config in configs if config in graphs]
    times = {config: {"target": [], "draft": [], "spec_decode": []} for config in configs}
    for _ in range(rounds):
        for config in configs:
            for part in ("target", "draft", "spec_decode"):
                ms = cuda_ms(graphs[config][part], iters=iters)
                times[config][part].append(ms / (k - 1) if part == "spec_decode" else ms)
    # what each graph's last replay emitted (the same inert inputs in every configuration): the target's and the
    # draft's sampled tokens, and the speculative engine's drafts
    emitted = {}
    for config in configs:
        target_engine, draft_engine, spec_engine = graphs[config]["engines"]
        emitted[config] = {"target": target_engine.step_out[0].tolist(), "draft": draft_engine.step_out[0].tolist(),
                           "spec_decode": spec_engine.speculator.draft_tokens[0].tolist()}
    weights = model_bytes(target)
    out = {"target_weight_bytes": weights, "draft_weight_bytes": model_bytes(draft), "configs": {},
           "errors": errors}
    for config in configs:
        t = times[config]
        c = [d / tt for d, tt in zip(t["draft"], t["target"], strict=True)]
        row = {"switches": CONFIGS[config],
               "target_step_ms": repeat_summary(t["target"]), "draft_step_ms": repeat_summary(t["draft"]),
               "spec_draft_step_ms": repeat_summary(t["spec_decode"]), "cost_ratio_c": repeat_summary(c),
               "spec_cost_ratio_c": repeat_summary([s / tt for s, tt in zip(t["spec_decode"], t["target"],
                                                                              strict=True)]),
               "target_fraction_of_copy_bandwidth": weights / (repeat_summary(t["target"])["mean"] / 1e3) / copy_bw,
               "per_round_ms": t, "emitted": emitted[config],
               "same_tokens_as_first": emitted[config] == emitted[configs[0]],
               "kernels": {part: kernel_breakdown(graphs[config][part], top=12) for part in
                           ("target", "draft", "spec_decode")}}
        out["configs"][config] = row
        launches = {part: row["kernels"][part].get("launches_per_step") for part in row["kernels"]}
        print(f"  {config:>12}: target {_mean_interval(row['target_step_ms'], 4)} ms "
              f"({100 * row['target_fraction_of_copy_bandwidth']:.1f}% of copy bw), "
              f"draft {row['draft_step_ms']['mean']:.4f} ms, c = {_mean_interval(row['cost_ratio_c'], 3)}, "
              "speculative draft step "
              f"{row['spec_draft_step_ms']['mean']:.4f} ms; launches {launches}; tokens as {configs[0]}: "
              f"{row['same_tokens_as_first']} (n = {rounds})", flush=True)
    del graphs, target, draft
    torch.cuda.empty_cache()
    return out


def cuts_on(result: dict, row: dict) -> list[str]:
    """The short names (CUT_NAMES) of the cuts a configuration ran with: the result's recorded defaults with the
    row's switches over them, so files written under older configuration names read alike. A switch left at
    `auto` (on where the GPU can, sm_90+ for programmatic launch) is named with "(auto)"."""
    switches = {**result.get("defaults", {}), **row["switches"]}
    return [name + (" (auto)" if switches.get(switch) == "auto" else "") for name, switch in CUT_NAMES.items()
            if switches.get(switch) in (CUTS[switch], "auto")]


def render_table(results: list[tuple[str, dict]]) -> str:
    """One row per (file, pair, configuration) of kernel_cuts.py results: the cuts on, each step's mean ms with
    its 95% interval over rounds, the target's share of the copy bandwidth, c, kernel launches per step and
    whether the graphs emitted the file's first configuration's tokens. results: (file name, result)."""
    lines = [("| file | GPU | pair | configuration | cuts on | target step ms (% of copy bw) | draft step ms | c "
              "| draft step in the speculative graph, ms | launches a step: target / draft / speculative | "
              "same tokens | n |"), "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for file, result in results:
        gpu = result["machine"]["gpu"]
        for pair, measured in result["pairs"].items():
            for config, row in measured["configs"].items():
                launches = " / ".join(f"{row['kernels'][part].get('launches_per_step', 0):.0f}"
                                      for part in ("target", "draft", "spec_decode"))
                lines.append(
                    f"| `{file}` | {gpu} | {pair} | {config} | {', '.join(cuts_on(result, row)) or 'none'} "
                    f"| {_mean_interval(row['target_step_ms'], 3)} "
                    f"({100 * row['target_fraction_of_copy_bandwidth']:.1f}%) "
                    f"| {_mean_interval(row['draft_step_ms'], 3)} | {_mean_interval(row['cost_ratio_c'], 3)} "
                    f"| {_mean_interval(row['spec_draft_step_ms'], 3)} | {launches} "
                    f"| {'yes' if row['same_tokens_as_first'] else 'no'} | {row['cost_ratio_c']['n']} |")
            for config, error in measured.get("errors", {}).items():
                lines.append(f"| `{file}` | {gpu} | {pair} | {config} | failed to build: {error} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--table"]:
        files = argv[1:]
        missing = [f for f in files if not Path(f).is_file()]
        if not files or missing:
            print(f"kernel_cuts.py --table: no such result file: {', '.join(missing) or '(none given)'}",
                  file=sys.stderr)
            sys.exit(2)
        print(render_table([(Path(f).name, json.loads(Path(f).read_text())) for f in files]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="kernel_cuts.json")
    parser.add_argument("--pairs", default=",".join(RANDOM_PAIRS),
                        help="comma-separated, of " + ", ".join(RANDOM_PAIRS))
    parser.add_argument("--configs", default="defaults,none", help="comma-separated, of " + ", ".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=30, help="synchronised replays per figure and round (median)")
    parser.add_argument("--k", type=int, default=4, help="depth of the speculative engine (k - 1 draft steps)")
    args = parser.parse_args(argv)
    pairs, configs = args.pairs.split(","), args.configs.split(",")
    for bad, valid, flag in ((set(pairs) - set(RANDOM_PAIRS), RANDOM_PAIRS, "--pairs"),
                             (set(configs) - set(CONFIGS), CONFIGS, "--configs")):
        if bad:
            parser.error(f"{flag}: unknown {sorted(bad)}; valid: {', '.join(valid)}")
    if args.rounds < 2 or args.iters < 1 or args.k < 2:
        parser.error(f"--rounds {args.rounds} (>= 2), --iters {args.iters} (>= 1), --k {args.k} (>= 2)")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "python": platform.python_version()},
              "defaults": {key: list(v) if isinstance(v, tuple) else v for key, v in CUDA_KERNELS.items()},
              "rounds": args.rounds, "iters": args.iters, "k": args.k, "pairs": {}}
    result["copy_bandwidth_bytes_per_s"] = copy_bandwidth_bytes_per_s()
    print(f"copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    for name in pairs:
        print(f"== {name}", flush=True)
        result["pairs"][name] = bench_pair(name, configs, args.rounds, args.iters, args.k,
                                           result["copy_bandwidth_bytes_per_s"])
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
