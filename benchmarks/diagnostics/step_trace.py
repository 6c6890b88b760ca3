"""Where an engine step's time goes on a GPU: a profiler trace of steady-state steps, and its summary.

Two commands:

  record     (GPU; torch, safetensors, tokenizers): for each k, builds the engine on a real-size random-weight pair
             (graphs, all Triton kernels + compile_pointwise, synthetic acceptance), warms it up, and exports a
             torch.profiler trace (CPU + CUDA activities) of one generate as trace_k{k}.json.gz.
  summarize  (any machine): per trace, the steady-state step period (from one step's read-back to the next),
             the device's busy time within it (kernels, copies and memsets), the idle fraction, the pairs of
             kernels (or copies) around its idle stretches with their idle µs a step, and the host's
             median microseconds inside each kind of cudaMemcpyAsync (a copy that waits for the stream shows
             up here); and the first step (the prompt's prefill: a graph replay with engine=cuda's prompt
             graphs, else eager): its host time, the device's busy time while it runs, the host time in each
             CUDA runtime call, and the aten ops with the most host self time. Writes JSON.

    python benchmarks/diagnostics/step_trace.py record --pair lfm2-1.2b+lfm2-350m --ks 0,1,4 --out traces/
    python benchmarks/diagnostics/step_trace.py summarize traces/trace_k*.json.gz --out trace_summary.json

The profiler slows the host, so host-bound gaps come out longer than in an unprofiled run; what the trace shows
is where the device waits, and on what.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root (specexp)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (gpu_cudagraphs)

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_LABEL = "specexp::step"  # the record_function range `record` puts around each engine step


def coverage(device: list[dict], start: float, end: float, opened_by: str = "") -> tuple[float, list]:
    """One walk over `device`'s spans (sorted by ts; ts, dur in µs) through [start, end): (busy µs, idle stretches).
    Busy: the µs in which the device runs at least one span, the union of their intervals, not the sum of their
    durations (a kernel launched early, programmatic dependent launch, overlaps the one before it). Idle stretches:
    (length, name of the span whose end opened it, name of the span that closed it), `opened_by` naming what ended
    at `start`; a stretch after the last span to start before `end` is not listed."""
    busy, gaps, covered_to, last = 0.0, [], start, opened_by
    for e in device:
        if e["ts"] >= end:  # this span and every later one start past the window
            break
        if e["ts"] > covered_to:
            gaps.append((e["ts"] - covered_to, last, e.get("name")))
        lo, hi = max(e["ts"], covered_to), min(e["ts"] + e["dur"], end)
        if hi > lo:
            busy += hi - lo
        if e["ts"] + e["dur"] > covered_to:
            covered_to, last = e["ts"] + e["dur"], e.get("name")
    return busy, gaps


def busy_us(device: list[dict], start: float, end: float) -> float:
    """µs in [start, end) during which the device runs at least one of `device`'s spans (any order): `coverage`'s
    busy time."""
    return coverage(sorted(device, key=lambda e: e["ts"]), start, end)[0]


def idle_gaps(device: list[dict], start: float, end: float, opened_by: str) -> list[tuple[float, str, str]]:
    """The stretches of [start, end) in which the device runs none of `device`'s spans (sorted by ts): `coverage`'s
    idle stretches. Their lengths sum to end - start less `busy_us` when a span ends at `end`."""
    return coverage(device, start, end, opened_by)[1]


def summarize_trace(events: list[dict], skip_steps: int = 3, top_gaps: int = 12) -> dict:
    """A chrome-trace event list -> step period and device busy time (µs, medians over the steady-state steps
    between consecutive device-to-host read-backs, after `skip_steps`; busy: `busy_us`), the device's idle fraction,
    where it idles (`idle_by_kernel_pair`: the `top_gaps` pairs of spans around its idle stretches, `coverage`, by
    idle µs a step, with their count a step; means over the steps), and the host's median µs per cudaMemcpyAsync
    by copy kind."""
    spans = [e for e in events if e.get("ph") == "X"]
    device = sorted((e for e in spans if e.get("cat") in DEVICE_CATEGORIES), key=lambda e: e["ts"])
    read_backs = [e for e in device if "DtoH" in e["name"]]
    periods, busy = [], []
    idle_us: dict[tuple[str, str], float] = collections.defaultdict(float)
    idle_count: dict[tuple[str, str], int] = collections.defaultdict(int)
    for a, b in zip(read_backs[skip_steps:-1], read_backs[skip_steps + 1:], strict=False):
        start, end = a["ts"] + a["dur"], b["ts"] + b["dur"]
        busy_in_period, gaps = coverage(device, start, end, a["name"])
        periods.append(end - start)
        busy.append(busy_in_period)
        for gap, before, after in gaps:
            idle_us[(before, after)] += gap
            idle_count[(before, after)] += 1
    if not periods:
        raise ValueError(f"the trace holds {len(read_backs)} device-to-host copies: too few steps to summarize "
                         f"(need more than {skip_steps + 1})")
    copy_kind = {e["args"].get("correlation"): e["name"] for e in spans if e.get("cat") == "gpu_memcpy"}
    host_us = collections.defaultdict(list)
    for e in spans:
        if e.get("cat") == "cuda_runtime" and e["name"] == "cudaMemcpyAsync":
            host_us[copy_kind.get(e["args"].get("correlation"), "unknown")].append(e["dur"])
    period, busy_median = statistics.median(periods), statistics.median(busy)
    top = sorted(idle_us, key=lambda pair: -idle_us[pair])[:top_gaps]
    return {"steps": len(periods), "step_period_us_median": period, "device_busy_us_median": busy_median,
            "device_idle_fraction": 1 - busy_median / period,
            "idle_by_kernel_pair": [{"before": before, "after": after,
                                     "idle_us_per_step": idle_us[(before, after)] / len(periods),
                                     "gaps_per_step": idle_count[(before, after)] / len(periods)}
                                    for before, after in top],
            "host_us_in_cudaMemcpyAsync_median": {kind: statistics.median(v) for kind, v in host_us.items()}}


def _self_us(ops: list[dict]) -> dict[str, float]:
    """Host self time (µs) per op name: each op's duration less that of the ops nested in it on its thread."""
    totals: dict[str, float] = collections.defaultdict(float)
    by_thread = collections.defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for events in by_thread.values():
        stack: list[list] = []  # [end, name, children's µs]
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1][0] <= e["ts"]:
                _, name, inner = stack.pop()
                totals[name] -= inner
            if stack:
                stack[-1][2] += e["dur"]
            totals[e["name"]] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], 0.0])
        for _, name, inner in stack:
            totals[name] -= inner
    return totals


def summarize_first_step(events: list[dict], top: int = 15) -> dict:
    """The first engine step of a trace (`STEP_LABEL` ranges; in `record`'s traces, the prompt's prefill): its
    host µs, the device's busy µs from its start to the next step's (work it queued that runs after it returns
    counts), its kernels, the host µs and calls of each CUDA runtime function inside it, and the `top` aten ops
    by host self µs inside it. For comparison, the median host µs of the steps after it."""
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and e.get("name") == STEP_LABEL), key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"the trace has no '{STEP_LABEL}' ranges: record it with step_trace.py record")
    first = steps[0]
    start, host_end = first["ts"], first["ts"] + first["dur"]
    device_end = steps[1]["ts"] if len(steps) > 1 else float("inf")
    spans = [e for e in events if e.get("ph") == "X"]
    device = [e for e in spans if e.get("cat") in DEVICE_CATEGORIES and start <= e["ts"] < device_end]
    runtime: dict[str, dict] = {}
    for e in spans:
        if e.get("cat") == "cuda_runtime" and start <= e["ts"] < host_end:
            row = runtime.setdefault(e["name"], {"calls": 0, "host_us": 0.0})
            row["calls"] += 1
            row["host_us"] += e["dur"]
    ops = [e for e in spans if e.get("cat") == "cpu_op" and start <= e["ts"] and e["ts"] + e["dur"] <= host_end]
    self_us = sorted(_self_us(ops).items(), key=lambda kv: -kv[1])[:top]
    return {"first_step_host_us": first["dur"],
            "later_steps_host_us_median": statistics.median(e["dur"] for e in steps[1:]) if len(steps) > 1 else None,
            "device_busy_us": busy_us(device, start, device_end),
            "kernels": sum(e.get("cat") == "kernel" for e in device),
            "cuda_runtime": dict(sorted(runtime.items(), key=lambda kv: -kv[1]["host_us"])),
            "top_aten_self_us": dict(self_us)}


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def record(pair: str, ks: list[int], out_dir: Path, rate: float, new_tokens: int) -> None:
    import gc

    import torch
    from gpu_cudagraphs import CUDA_KERNELS, RANDOM_PAIRS, ZOO, make_engine
    from torch.profiler import ProfilerActivity, profile, record_function

    from specexp.models import load_model

    if not torch.cuda.is_available():
        sys.exit("step_trace.py record needs a CUDA GPU")
    target_path, draft_path = RANDOM_PAIRS[pair]
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        target = load_model(ZOO / target_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=0)
        draft = load_model(ZOO / draft_path, dtype=torch.bfloat16, device="cuda", weights="random", seed=1)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, target.config.vocab_size, (64,), generator=gen).tolist() for _ in range(2)]
        for k in ks:
            engine = make_engine(target, draft if k else None, k, 1, graphs=True, rejection="synthetic", rate=rate,
                                 kernels=CUDA_KERNELS)
            untraced_step = engine.step

            def traced_step(untraced_step=untraced_step):
                with record_function(STEP_LABEL):
                    return untraced_step()

            engine.step = traced_step  # generate() calls self.step(): each step becomes one range of the trace
            engine.generate(prompts[:1], max_new_tokens=16)
            engine.generate(prompts[1:], max_new_tokens=new_tokens)
            gc.collect()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                engine.generate(prompts[:1], max_new_tokens=new_tokens)
            plain = out_dir / f"trace_k{k}.json"
            prof.export_chrome_trace(str(plain))
            with open(plain, "rb") as src, gzip.open(f"{plain}.gz", "wb") as dst:
                dst.write(src.read())
            plain.unlink()
            print(f"k={k}: wrote {plain}.gz", flush=True)
            del engine
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="profile steady-state steps on a GPU")
    rec.add_argument("--pair", default="lfm2-1.2b+lfm2-350m")
    rec.add_argument("--ks", default="0,1,4", help="comma-separated depths")
    rec.add_argument("--rate", type=float, default=0.8, help="synthetic acceptance rate")
    rec.add_argument("--new-tokens", type=int, default=48, help="tokens of the profiled generate")
    rec.add_argument("--out", default="traces", help="folder for trace_k{k}.json.gz")
    summ = commands.add_parser("summarize", help="summarize traces (any machine)")
    summ.add_argument("traces", nargs="+", type=Path)
    summ.add_argument("--skip-steps", type=int, default=3, help="read-backs to skip (prefill, warm-up)")
    summ.add_argument("--out", default="trace_summary.json")
    args = parser.parse_args()
    if args.command == "record":
        from gpu_cudagraphs import RANDOM_PAIRS

        if args.pair not in RANDOM_PAIRS:
            parser.error(f"--pair={args.pair}: valid are {', '.join(RANDOM_PAIRS)}")
        try:
            ks = [int(k) for k in args.ks.split(",")]
        except ValueError:
            parser.error(f"--ks={args.ks!r}: comma-separated integers expected")
        if min(ks) < 0 or not 0 <= args.rate < 1 or args.new_tokens < 8:
            parser.error("--ks must be >= 0, --rate in [0, 1), --new-tokens >= 8")
        record(args.pair, ks, Path(args.out), args.rate, args.new_tokens)
        return
    missing = [str(p) for p in args.traces if not p.is_file()]
    if missing:
        parser.error(f"no such trace file: {', '.join(missing)}")
    summary = {}
    for path in args.traces:
        match = re.search(r"trace_k(\d+)", path.name)
        key = f"k={match.group(1)}" if match else path.name
        events = load_trace(path)
        summary[key] = s = summarize_trace(events, args.skip_steps)
        print(f"{key}: step {s['step_period_us_median'] / 1e3:.2f} ms, device busy "
              f"{s['device_busy_us_median'] / 1e3:.2f} ms ({s['device_idle_fraction']:.0%} idle) over {s['steps']} "
              "steps", flush=True)
        for pair in s["idle_by_kernel_pair"][:5]:
            print(f"  idle {pair['idle_us_per_step']:5.1f} us a step ({pair['gaps_per_step']:.1f} gaps) between "
                  f"{pair['before'][:48]} and {pair['after'][:48]}", flush=True)
        if any(e.get("name") == STEP_LABEL for e in events):
            s["first_step"] = f = summarize_first_step(events)
            launches = f["cuda_runtime"].get("cudaLaunchKernel", {"calls": 0, "host_us": 0.0})
            print(f"  first step (prefill): host {f['first_step_host_us'] / 1e3:.2f} ms, device busy "
                  f"{f['device_busy_us'] / 1e3:.2f} ms, {f['kernels']} kernels, cudaLaunchKernel "
                  f"{launches['calls']}x {launches['host_us'] / 1e3:.2f} ms; top aten self ms: "
                  + ", ".join(f"{name} {us / 1e3:.2f}" for name, us in list(f["top_aten_self_us"].items())[:5]),
                  flush=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
