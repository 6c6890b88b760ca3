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

`--resume FILE` skips points already in FILE (a run split over several calls). Renders with
`benchmarks/backends_report.py`.
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


def run_point(point: dict, args, runs_dir: Path) -> dict:
    name = point["name"]
    overrides = [
        f"pair={point['pair']}", f"pair.dtype={args.dtype}", f"engine={args.engine}", "engine.max_num_seqs=1",
        f"engine.cudagraph_mode={'full' if point['graphs'] else 'none'}", "workload=code",
        f"workload.num_prompts={args.num_prompts}", "sampling=greedy",
        f"sampling.max_new_tokens={args.max_new_tokens}", f"backend={point['backend']}",
        f"speculator.num_speculative_tokens={point['k']}", "tracking=disabled", f"name={name}",
        f"hydra.run.dir={runs_dir / name}",
    ]
    if point["backend"] == "vllm":
        overrides.append(f"backend.gpu_memory_utilization={args.gpu_memory_utilization}")
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "specexp", "run", *overrides], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "SPECEXP_RUNS_DIR": str(runs_dir)},
                              timeout=args.point_timeout_s)
        returncode, log = proc.returncode, (proc.stderr or "") + (proc.stdout or "")
    except subprocess.TimeoutExpired as e:
        returncode = None
        log = _text(e.stderr) + _text(e.stdout) + f"\nkilled after {args.point_timeout_s} s"
    row = {**point, "overrides": overrides, "returncode": returncode, "wall_s": time.perf_counter() - start}
    result_path = runs_dir / name / "result.json"
    record = json.loads(result_path.read_text()) if result_path.exists() else None
    if record is None or record.get("status") != "ok":
        row["status"] = record["status"] if record else ("timeout" if returncode is None else "crashed")
        row["error"] = (record or {}).get("error") or last_error_line(log)
        row["log_tail"] = log[-3000:]
        return row
    m = record["metrics"]
    outputs = [json.loads(line) for line in (runs_dir / name / "outputs.jsonl").read_text().splitlines() if line]
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
        result["points"] = json.loads(Path(args.resume).read_text())["points"]
    done = {p["name"] for p in result["points"]}
    todo = [p for p in plan(args.pairs.split(","), args.backends.split(","), [int(k) for k in args.ks.split(",")])
            if p["name"] not in done]
    print(f"{len(todo)} points to run ({len(done)} already done)", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for point in todo:
            if args.deadline_s is not None and time.perf_counter() - start > args.deadline_s:
                print("deadline reached; the rest stays for --resume", flush=True)
                break
            row = run_point(point, args, Path(tmp))
            result["points"].append(row)
            Path(args.out).write_text(json.dumps(result, indent=1))
            summary = {key: row.get(key) for key in ("name", "status", "acceptance_length", "output_tokens_per_s",
                                                     "tpot_ms_p50", "graph_capture_bytes", "wall_s")}
            if row["status"] != "ok":
                summary["error"] = row["error"]
            print(json.dumps(summary), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
