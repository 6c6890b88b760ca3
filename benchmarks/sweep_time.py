"""Wall time of a depth sweep, engines reused against one process per job, with every job's start-up breakdown.

Runs `python -m specexp run -m +exp=depth_sweep ...` (the sweep a user runs: k = 0..8, each job measured in
rounds) once per mode and round, alternating `sweep.reuse_engine=true` (jobs that differ only in k share one process
and engine, `specexp.sweep_groups`) and `=false` (a process, model load and graph capture per job), and times each
whole command. From every job's result.json it keeps k, status, acceptance length, output tokens/s and
`metrics.startup_s` (import, model_load, engine_build, warmup; graph_capture within engine_build, compile within
that), its median step phases and, on a GPU, the SM clock, temperature and power read as each measured pass ended.
Prints a table, writes JSON (rewritten after every sweep, so a run cut short keeps what it finished).

    python benchmarks/sweep_time.py --out sweep_time.json [--pair llama_1b_random] [--engine cuda]
        [--ks 0,1,2,3,4,5,6,7,8] [--rate 0.8] [--num-prompts 8] [--output-len 128] [--rounds 1]
        [--modes reused,isolated] [--warm-up] [-- EXTRA_OVERRIDE ...]

The defaults are the sweep the speed target is set on: the Llama-3.2-1B-shaped random pair, batch 1
(`engine.max_num_seqs=1`), 8 random prompts of 128 tokens, 128 new tokens each, synthetic acceptance 0.8,
`engine=cuda`. On a CPU, `--pair tiny_lfm2 --engine cpu` runs the same sweep on the demo pair. Overrides after
`--` are passed to every sweep (e.g. `-- measure.repeats=2`). `--warm-up` first runs one sweep of the first mode
that no round counts: on a fresh machine it compiles every kernel into Triton's and inductor's on-disk caches, so
the rounds time sweeps on warm caches; its wall time and start-up are kept (`warm_up`) and printed as a first line.

    python benchmarks/sweep_time.py --table FILE.json   # the tables of an earlier run

Reused and isolated jobs must agree on acceptance at every k (synthetic acceptance is drawn from the engine's
seeded generator, and a reused job's random state is its own): the script reports any k where they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTUP_PHASES = ("import", "model_load", "engine_build", "warmup")
PHASES = ("step", "verify", "draft", "schedule")  # a step's phases (`metrics.<phase>_ms`)
GPU_READINGS = ("sm_clock_mhz", "temperature_c", "power_w")  # `specexp.measure.machine.gpu_state`'s


def sweep_command(args, mode: str) -> list[str]:
    """The CLI command of one sweep in `mode` ("reused" or "isolated")."""
    return [
        sys.executable, "-m", "specexp", "run", "-m", "+exp=depth_sweep", f"pair={args.pair}",
        f"engine={args.engine}", "workload=random", f"workload.num_prompts={args.num_prompts}",
        f"workload.output_len={args.output_len}", "engine.max_num_seqs=1",
        "speculator.rejection=synthetic", f"speculator.synthetic_acceptance_rate={args.rate}",
        f"speculator.num_speculative_tokens={','.join(str(k) for k in args.ks)}",
        f"sweep.reuse_engine={'true' if mode == 'reused' else 'false'}", "tracking=disabled",
        f"name=sweep_{mode}", *args.extra,
    ]


def job_record(result_path: Path) -> dict:
    """k, status, acceptance, tokens/s and start-up phases (s) of one job's result.json."""
    record = json.loads(result_path.read_text())
    metrics = record.get("metrics") or {}
    startup = metrics.get("startup_s") or {}
    env = record.get("env") or {}
    return {
        "k": record["config"]["speculator"]["num_speculative_tokens"], "status": record["status"],
        "acceptance_length": metrics.get("acceptance_length"),
        "output_tokens_per_s": metrics.get("output_tokens_per_s"),
        "duration_s": record.get("duration_s"), "startup_s": startup,
        "graph_capture_s": metrics.get("graph_capture_s"),
        "gpu": env.get("gpu"), "git_sha": env.get("git_sha"),
        # the job's median step and phases (ms, its record's: the mean over its passes): where a reused point differs
        "phase_ms_p50": {phase: (metrics.get(f"{phase}_ms") or {}).get("p50") for phase in PHASES},
        # the GPU as each measured pass ended (SM clock, temperature): does a busy GPU slow later points?
        "gpu_after_passes": [gpu_reading(r) for r in record.get("repeats") or []],
    }


def gpu_reading(repeat: dict) -> dict:
    """SM clock (MHz), temperature (°C) and power (W) read as one measured pass ended (None where unread)."""
    gpu = ((repeat.get("machine") or {}).get("after") or {}).get("gpu") or {}
    return {key: gpu.get(key) for key in GPU_READINGS}


def run_sweep(args, mode: str, runs_dir: Path) -> dict:
    """Run one sweep; its wall time (s) and every job's record, by k."""
    before = set(runs_dir.glob("sweep_*"))
    start = time.perf_counter()
    proc = subprocess.run(sweep_command(args, mode), capture_output=True, text=True,
                          env={**os.environ, "SPECEXP_RUNS_DIR": str(runs_dir)}, check=False)
    wall_s = time.perf_counter() - start
    made = sorted(set(runs_dir.glob("sweep_*")) - before)
    jobs = [job_record(p) for d in made for p in sorted(d.glob("*/result.json"))]
    out = {"mode": mode, "wall_s": wall_s, "returncode": proc.returncode,
           "jobs": sorted(jobs, key=lambda j: j["k"]),
           "startup_sum_s": {phase: sum(j["startup_s"].get(phase, 0.0) for j in jobs) for phase in STARTUP_PHASES}}
    if proc.returncode != 0:
        out["error"] = (proc.stderr or proc.stdout)[-3000:]
    return out


def spread(values: list[float]) -> str:
    """mean ± std (n) of values, or the one value."""
    if len(values) == 1:
        return f"{values[0]:.1f} (n = 1)"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f} (n = {len(values)})"


def jobs_ok_and_phases(sweep: dict) -> tuple[str, str]:
    """A sweep's "ok/jobs" count and its start-up phases summed over its jobs ("import / ... / warmup", s)."""
    ok = sum(j["status"] == "ok" for j in sweep["jobs"])
    return f"{ok}/{len(sweep['jobs'])}", " / ".join(f"{sweep['startup_sum_s'][p]:.1f}" for p in STARTUP_PHASES)


def sweep_line(label: str, sweep: dict) -> str:
    """One sweep's wall time, jobs ok and start-up phases summed over its jobs, as a line of text."""
    ok, phases = jobs_ok_and_phases(sweep)
    return (f"{label}: {sweep['wall_s']:.1f} s wall, {ok} jobs ok, start-up s summed over jobs "
            f"(import / model_load / engine_build / warmup) {phases}")


def acceptance_mismatches(sweeps: list[dict]) -> list[int]:
    """The ks whose acceptance length differs between any two of the sweeps' jobs."""
    by_k: dict[int, set] = {}
    for sweep in sweeps:
        for job in sweep["jobs"]:
            if job["acceptance_length"] is not None:
                by_k.setdefault(job["k"], set()).add(round(job["acceptance_length"], 9))
    return sorted(k for k, values in by_k.items() if len(values) > 1)


def render(result: dict) -> str:
    """The wall-time table per mode (start-up phases summed over the jobs of its first sweep), then one row per k:
    each mode's tokens/s in every round, the ratio of the modes' means (reused over isolated) and the acceptance."""
    header = ("| mode | sweep wall s | jobs ok | start-up s summed over jobs (import / model_load / engine_build / "
              "warmup), first sweep |")
    lines = [header, "|---|---|---|---|"]
    if result.get("warm_up"):
        lines = [sweep_line(f"warm-up sweep, not in the rounds ({result['warm_up']['mode']})", result["warm_up"]),
                 "", *lines]
    by_mode = {mode: [s for s in result["sweeps"] if s["mode"] == mode] for mode in result["modes"]}
    by_mode = {mode: sweeps for mode, sweeps in by_mode.items() if sweeps}
    jobs = [j for s in [result.get("warm_up"), *result["sweeps"]] if s for j in s["jobs"]]
    where = sorted({f"{j['gpu']}, commit {j.get('git_sha') or 'unknown'}" for j in jobs if j.get("gpu")})
    if where:  # results written before the jobs' GPU was kept leave it out
        lines = [f"Jobs ran on: {'; '.join(where)}.", "", *lines]
    for mode, sweeps in by_mode.items():
        ok, phases = jobs_ok_and_phases(sweeps[0])
        lines.append(f"| {mode} | {spread([s['wall_s'] for s in sweeps])} | {ok} | {phases} |")
    lines += compile_lines(by_mode)
    ratio = "reused" in by_mode and "isolated" in by_mode
    lines += ["", "| k | " + " | ".join(f"{mode} tokens/s, by round" for mode in by_mode)
              + (" | reused / isolated" if ratio else "") + " | acceptance |",
              "|---|" + "---|" * (len(by_mode) + ratio + 1)]
    for k in sorted({j["k"] for sweeps in by_mode.values() for s in sweeps for j in s["jobs"]}):
        tps = {mode: [j["output_tokens_per_s"] for s in sweeps for j in s["jobs"]
                      if j["k"] == k and j["output_tokens_per_s"] is not None] for mode, sweeps in by_mode.items()}
        acceptance = sorted({round(j["acceptance_length"], 3) for sweeps in by_mode.values() for s in sweeps
                             for j in s["jobs"] if j["k"] == k and j["acceptance_length"] is not None})
        cells = [" / ".join(f"{v:.0f}" for v in values) or "-" for values in tps.values()]
        if ratio:
            both = tps["reused"] and tps["isolated"]
            cells.append(f"{statistics.mean(tps['reused']) / statistics.mean(tps['isolated']):.3f}" if both else "-")
        cells.append(" / ".join(f"{a:.3f}" for a in acceptance) or "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    mismatches = result["acceptance_mismatches"]
    lines.append("")
    lines.append("acceptance identical in every mode at every k" if not mismatches
                 else f"acceptance differs between sweeps at k = {mismatches}")
    lines += phase_table(by_mode)
    lines += gpu_table(by_mode)
    return "\n".join(lines)


def gpu_table(by_mode: dict) -> list[str]:
    """Per k, the mean SM clock, temperature and power as the job's measured passes ended, in each mode (joined
    by " / " in the modes' order); [] where no job read them (a CPU, or results written before jobs kept them)."""
    jobs = [j for sweeps in by_mode.values() for s in sweeps for j in s["jobs"]]
    if not any(gpu_values(j, "sm_clock_mhz") for j in jobs):
        return []
    lines = ["", f"The GPU as each job's measured passes ended, mean over them ({' / '.join(by_mode)}):", "",
             "| k | SM clock MHz | temperature °C | power W |", "|---|---|---|---|"]
    for k in sorted({j["k"] for j in jobs}):
        cells = [mode_means(by_mode, k, lambda j, key=key: gpu_values(j, key), ".0f") for key in GPU_READINGS]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def gpu_values(job: dict, key: str) -> list[float]:
    """A job's readings of `key` (one of GPU_READINGS) as its passes ended, those read."""
    return [r[key] for r in job.get("gpu_after_passes") or [] if r.get(key) is not None]


def phase_values(job: dict, phase: str) -> list[float]:
    """A job's median ms of `phase`, as a list: [] where it was not kept."""
    ms = (job.get("phase_ms_p50") or {}).get(phase)
    return [] if ms is None else [ms]


def mode_means(by_mode: dict, k: int, values, fmt: str) -> str:
    """The mean of `values(job)` over every job at k, per mode, formatted with `fmt` and joined by " / " in the
    modes' order ("-" for a mode with none)."""
    means = []
    for sweeps in by_mode.values():
        found = [v for s in sweeps for j in s["jobs"] if j["k"] == k for v in values(j)]
        means.append(format(statistics.mean(found), fmt) if found else "-")
    return " / ".join(means)


def compile_lines(by_mode: dict) -> list[str]:
    """Of each mode's first sweep's engine_build, the graph capture and its compiling summed over the jobs (s), for
    results whose jobs record `startup_s.compile`; [] otherwise."""
    lines = []
    for mode, sweeps in by_mode.items():
        starts = [j["startup_s"] for j in sweeps[0]["jobs"]]
        if starts and all("compile" in st for st in starts):
            capture = sum(st.get("graph_capture") or 0.0 for st in starts)
            compiling = sum(st["compile"] or 0.0 for st in starts)
            lines.append(f"{mode}: of engine_build, graph capture {capture:.1f} s summed over jobs, of it compiling "
                         f"{compiling:.1f} s (each graph's first run)")
    return ["", *lines] if lines else []


def phase_table(by_mode: dict) -> list[str]:
    """Per k, each phase's median ms (a job's p50 over its steps, the mean over rounds) in each mode, joined by " / "
    in the modes' order; [] for results written before the jobs kept their phases."""
    jobs = [j for sweeps in by_mode.values() for s in sweeps for j in s["jobs"]]
    if not any(j.get("phase_ms_p50") for j in jobs):
        return []
    lines = ["", f"Median ms of a step's phases ({' / '.join(by_mode)}):", "",
             "| k | " + " | ".join(f"{phase} ms" for phase in PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for k in sorted({j["k"] for j in jobs}):
        cells = [mode_means(by_mode, k, lambda j, phase=phase: phase_values(j, phase), ".3f") for phase in PHASES]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--table"]:  # the tables of earlier results
        for path in argv[1:]:
            print(render(json.loads(Path(path).read_text())))
        return {}
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", default="llama_1b_random")
    parser.add_argument("--engine", default="cuda")
    parser.add_argument("--ks", default="0,1,2,3,4,5,6,7,8")
    parser.add_argument("--rate", type=float, default=0.8)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="reused,isolated")
    parser.add_argument("--warm-up", action="store_true",
                        help="first one sweep of the first mode that no round counts (fills the kernel caches)")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    try:
        args.ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        raise SystemExit(f"--ks={args.ks}: comma-separated depths, e.g. 0,1,2,4") from None
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in ("reused", "isolated"):
            raise SystemExit(f"--modes: unknown mode {mode!r}: valid are reused, isolated")
    if args.rounds < 1:
        raise SystemExit(f"--rounds={args.rounds}: at least 1")
    out_path = Path(args.out)
    result = {"machine": {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
                          "cpu_count": os.cpu_count()},
              "settings": {"pair": args.pair, "engine": args.engine, "ks": args.ks, "rate": args.rate,
                           "num_prompts": args.num_prompts, "output_len": args.output_len, "extra": extra},
              "modes": modes, "commands": {m: sweep_command(args, m)[1:] for m in modes}, "sweeps": [],
              "acceptance_mismatches": []}
    with tempfile.TemporaryDirectory() as tmp:
        if args.warm_up:
            result["warm_up"] = run_sweep(args, modes[0], Path(tmp))
            out_path.write_text(json.dumps(result, indent=1) + "\n")
            print(sweep_line(f"warm-up sweep ({modes[0]})", result["warm_up"]), flush=True)
        for round_index in range(args.rounds):
            order = modes if round_index % 2 == 0 else modes[::-1]  # alternate which mode runs first
            for mode in order:
                sweep = run_sweep(args, mode, Path(tmp))
                sweep["round"] = round_index
                result["sweeps"].append(sweep)
                result["acceptance_mismatches"] = acceptance_mismatches(
                    ([result["warm_up"]] if args.warm_up else []) + result["sweeps"])
                out_path.write_text(json.dumps(result, indent=1) + "\n")
                status = "ok" if sweep["returncode"] == 0 else f"exit {sweep['returncode']}"
                print(f"round {round_index + 1}/{args.rounds} {mode}: {sweep['wall_s']:.1f} s wall, "
                      f"{len(sweep['jobs'])} jobs ({status})", flush=True)
    print(render(result))
    print(f"wrote {out_path}")
    return result


if __name__ == "__main__":
    main()
