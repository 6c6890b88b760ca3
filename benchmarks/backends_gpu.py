"""The same experiment on native, hf and vLLM: acceptance, speed, graph memory, and what each backend does
with short-conv (LFM2) pairs. One `python -m specexp run` process per point; writes JSON.

Points (batch 1: `engine.max_num_seqs=1`, greedy, `code` workload, W&B off), most important first so a run
cut short keeps them:
  1. `tiny_llama` (Llama target + Llama draft), k = 0..6, on native, vllm and hf;
  2. the short-conv rows: `tiny_lfm2` (LFM2 target + Llama draft) on vllm with CUDA graphs and eager,
     `tiny_lfm2_hybrid` (LFM2 target + hybrid LFM2 draft) on vllm;
  3. `tiny_lfm2` and `tiny_lfm2_hybrid`, k = 0..6, on native, hf and vllm (eager for LFM2 targets — with
     graphs vLLM crashes on them, row 2).
Each point records status, the exact error of a failed run (its last line and the tail of the log),
acceptance (mean, per position), output tokens/s, TPOT p50, graph-capture bytes/seconds, and every output's
token ids (to compare backends token by token).

    python benchmarks/backends_gpu.py --out backends.json [--resume backends.json] [--backends native,hf,vllm]
                                      [--pairs tiny_llama,...] [--ks 0,1,2,3,4,5,6] [--dtype float32]

`--resume FILE` skips points already in FILE (a run split over several invocations), except those that timed out.
Renders with `benchmarks/backends_report.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def point_name(pair: str, backend: str, k: int, graphs: bool) -> str:
    return f"{pair}_{backend}_k{k}_{'graphs' if graphs else 'eager'}"


def plan(pairs: list[str], backends: list[str], ks: list[int]) -> list[dict]:
    """Every point, most important first (see the module doc)."""
    points = []

    def add(pair, backend, k, graphs=True):
        if pair in pairs and backend in backends:
            points.append({"name": point_name(pair, backend, k, graphs), "pair": pair, "backend": backend,
                           "k": k, "graphs": graphs})

    for k in ks:
        for backend in ("native", "vllm", "hf"):
            add("tiny_llama", backend, k)
    short_conv_k = 2 if 2 in ks else max(ks)
    add("tiny_lfm2", "vllm", short_conv_k, graphs=True)
    add("tiny_lfm2_hybrid", "vllm", short_conv_k, graphs=True)
    add("tiny_lfm2_hybrid", "vllm", short_conv_k, graphs=False)
    for pair in ("tiny_lfm2", "tiny_lfm2_hybrid"):
        for k in ks:
            add(pair, "native", k)
            add(pair, "vllm", k, graphs=(k == 0))  # LFM2 target + draft: eager (graphs crash, row 2)
            add(pair, "hf", k)
    seen, unique = set(), []
    for p in points:
        if p["name"] not in seen:
            seen.add(p["name"])
            unique.append(p)
    return unique


def point_overrides(point: dict, args) -> list[str]:
    """The `specexp run` overrides of one point (without its name, run directory or depth)."""
    overrides = [
        f"pair={point['pair']}", f"pair.dtype={args.dtype}", f"engine={args.engine}", "engine.max_num_seqs=1",
        f"engine.cudagraph_mode={'full' if point['graphs'] else 'none'}", "workload=code",
        f"workload.num_prompts={args.num_prompts}", "sampling=greedy",
        f"sampling.max_new_tokens={args.max_new_tokens}", f"backend={point['backend']}", "tracking=disabled",
    ]
    if point["backend"] == "vllm":
        overrides.append(f"backend.gpu_memory_utilization={args.gpu_memory_utilization}")
    return overrides


def launch(overrides: list[str], runs_dir: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run `python -m specexp run OVERRIDES` in its own process: (return code or None on timeout, log)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "specexp", "run", *overrides], check=False, capture_output=True,
                              text=True, cwd=ROOT, env={**os.environ, "SPECEXP_RUNS_DIR": str(runs_dir)},
                              timeout=timeout_s)
        return proc.returncode, (proc.stderr or "") + (proc.stdout or "")
    except subprocess.TimeoutExpired as e:
        return None, _text(e.stderr) + _text(e.stdout) + f"\nkilled after {timeout_s} s"


def run_point(point: dict, args, runs_dir: Path) -> dict:
    """One point in its own process (vLLM points: vLLM keeps GPU memory until its process ends)."""
    name = point["name"]
    overrides = [*point_overrides(point, args), f"speculator.num_speculative_tokens={point['k']}", f"name={name}",
                 f"hydra.run.dir={runs_dir / name}"]
    start = time.perf_counter()
    returncode, log = launch(overrides, runs_dir, args.point_timeout_s)
    return collect(point, overrides, runs_dir / name, returncode, log, time.perf_counter() - start)


def run_depth_sweep(points: list[dict], args, runs_dir: Path) -> list[dict]:
    """Points that differ only in k (same pair, native or hf backend, graph mode) as one `specexp run -m`
    process: one interpreter start and import instead of one per point. Each job still builds its own
    engine, warms up and is timed on its own; `wall_s` is the sweep's wall time shared out evenly."""
    first = points[0]
    sweep_dir = runs_dir / f"{first['pair']}_{first['backend']}_{'graphs' if first['graphs'] else 'eager'}"
    ks = ",".join(str(p["k"]) for p in points)
    overrides = ["-m", *point_overrides(first, args), f"speculator.num_speculative_tokens={ks}",
                 f"name={first['pair']}_{first['backend']}", f"hydra.sweep.dir={sweep_dir}",
                 "hydra.sweep.subdir=k${speculator.num_speculative_tokens}"]
    start = time.perf_counter()
    returncode, log = launch(overrides, runs_dir, args.point_timeout_s * len(points))
    wall_s = (time.perf_counter() - start) / len(points)
    return [collect(p, overrides, sweep_dir / f"k{p['k']}", returncode, log, wall_s) for p in points]


def collect(point: dict, overrides: list[str], run_dir: Path, returncode: int | None, log: str, wall_s: float) -> dict:
    """The point's row from its run directory (result.json, outputs.jsonl), or its status and error."""
    row = {**point, "overrides": overrides, "returncode": returncode, "wall_s": wall_s}
    result_path = run_dir / "result.json"
    record = json.loads(result_path.read_text()) if result_path.exists() else None
    if record is None or record.get("status") != "ok":
        row["status"] = record["status"] if record else ("timeout" if returncode is None else "crashed")
        row["error"] = (record or {}).get("error") or last_error_line(log)
        row["log_tail"] = log[-3000:]
        return row
    m = record["metrics"]
    outputs = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines() if line]
    row.update({
        "status": "ok", "error": None,
        "acceptance_length": m.get("acceptance_length"),
        "per_position_acceptance": m.get("per_position_acceptance"),
        "accepted_per_position": m.get("accepted_per_position"),
        "num_drafts": m.get("num_drafts"),
        "output_tokens_per_s": m.get("output_tokens_per_s"),
        "tpot_ms_p50": (m.get("tpot_ms") or {}).get("p50"),
        "ttft_ms_p50": (m.get("ttft_ms") or {}).get("p50"),
        "num_output_tokens": m.get("num_output_tokens"),
        "graph_capture_bytes": m.get("graph_capture_bytes"),
        "graph_capture_s": m.get("graph_capture_s"),
        "env": record.get("env"),
        "outputs": {o["prompt_id"]: o["output_token_ids"] for o in outputs},
        # the prompts themselves: the `code` workload is built from the running interpreter's stdlib, so
        # another Python version draws other prompts — these let any machine replay exactly these
        "prompt_token_ids": {o["prompt_id"]: o["prompt_token_ids"] for o in outputs},
    })
    return row


def batches(points: list[dict]) -> list[list[dict]]:
    """Points in plan order, grouped for running: each vLLM point alone (one process per run); native and hf
    points of one (pair, backend, graph mode) together as one depth sweep, placed where the group's first
    point falls in the plan."""
    groups: dict[tuple, list[dict]] = {}
    order: list[list[dict]] = []
    for p in points:
        if p["backend"] == "vllm":
            order.append([p])
            continue
        key = (p["pair"], p["backend"], p["graphs"])
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(p)
    return order


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def last_error_line(log: str) -> str:
    """The most telling line of a failed run's log: the last `Error`/`error:` line, else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line or "CUDA error" in line:
            return line[:1000]
    return lines[-1][:1000] if lines else ""


def machine() -> dict:
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as e:  # noqa: BLE001 - recorded, not fatal: native and hf still run
        info["vllm"] = f"not importable: {type(e).__name__}: {e}"
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="backends.json")
    parser.add_argument("--resume", default=None, help="JSON of an earlier, partial run: its points are kept")
    parser.add_argument("--pairs", default="tiny_llama,tiny_lfm2,tiny_lfm2_hybrid")
    parser.add_argument("--backends", default="native,vllm,hf")
    parser.add_argument("--ks", default="0,1,2,3,4,5,6")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--engine", default="cuda", help="engine config group (cpu: native and hf only)")
    parser.add_argument("--point-timeout-s", type=float, default=300.0)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--deadline-s", type=float, default=None, help="start no point after this many seconds")
    args = parser.parse_args()
    result = {"machine": machine(), "settings": vars(args), "points": []}
    if args.resume and Path(args.resume).exists():
        # A point that hit its time limit has no result: it runs again (a crash or refusal is a result, kept).
        result["points"] = [p for p in json.loads(Path(args.resume).read_text())["points"]
                            if p.get("status") != "timeout"]
    done = {p["name"] for p in result["points"]}
    todo = [p for p in plan(args.pairs.split(","), args.backends.split(","), [int(k) for k in args.ks.split(",")])
            if p["name"] not in done]
    print(f"{len(todo)} points to run ({len(done)} already done)", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches(todo):
            if args.deadline_s is not None and time.perf_counter() - start > args.deadline_s:
                print("deadline reached; the rest stays for --resume", flush=True)
                break
            rows = run_point(batch[0], args, Path(tmp)) if len(batch) == 1 else None
            rows = [rows] if rows is not None else run_depth_sweep(batch, args, Path(tmp))
            for row in rows:
                result["points"].append(row)
                summary = {key: row.get(key) for key in ("name", "status", "acceptance_length",
                                                         "output_tokens_per_s", "tpot_ms_p50",
                                                         "graph_capture_bytes", "wall_s")}
                if row["status"] != "ok":
                    summary["error"] = row["error"]
                print(json.dumps(summary), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
