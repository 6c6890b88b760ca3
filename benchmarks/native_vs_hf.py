"""Native engine vs Hugging Face assisted generation: output tokens/s on the same pair and prompts.

Runs `python -m specexp run` once per point (each its own process, W&B off) and reads each run's
result.json:  hf and native at k = 0 and k = 4 with batch 1 (engine.max_num_seqs = 1), and native at
batch 16 (with at least 16 prompts, so that 16 requests are in flight). Prints a table and writes JSON (rewritten after every point, so a run cut short keeps what it
finished).

    python benchmarks/native_vs_hf.py [--pair tiny_lfm2] [--workload code] [--num-prompts 8]
                                      [--max-new-tokens 64] [--engine cpu|cuda] [--native-override KEY=VALUE]
                                      [--out native_vs_hf.json]

`--engine cuda` runs both backends on the GPU (native with its CUDA graphs, hf eager as transformers runs).
`--native-override KEY=VALUE` (repeatable) adds a config override to the native runs alone, e.g.
`engine.cudagraph_mode=full`: on a CPU, native's step graphs compiled by torch.compile at start-up
(`specexp.engine.compiled_graphs`; its compile time is start-up, outside the measured tokens/s).

    python benchmarks/native_vs_hf.py --table FILE.json ...   # the markdown table of earlier runs, one column each
                                                              # (of --ab runs: one row each)
    python benchmarks/native_vs_hf.py --ab 5 [--out ab.json]   # only k = 4, batch 1: hf and native alternating

`--ab N` measures the one point the comparison is judged on, k = 4 at batch 1, as N rounds of an hf run then a
native run (each its own process, one after the other), so drift of the machine's load falls on both alike; it
prints each backend's tokens/s (mean ± std, n = N), native / hf with a 95% interval (delta method over the
rounds) and whether every run's acceptance length agreed.
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
from pathlib import Path

POINTS = [("hf", 0, 1), ("native", 0, 1), ("hf", 4, 1), ("native", 4, 1), ("native", 0, 16), ("native", 4, 16)]


def run_point(backend: str, k: int, batch: int, args, runs_dir: Path) -> dict:
    name = f"{backend}_k{k}_b{batch}"
    num_prompts = max(args.num_prompts, batch)  # a batch of 16 needs 16 requests to fill it
    cmd = [
        sys.executable, "-m", "specexp", "run", f"pair={args.pair}", f"engine={args.engine}",
        f"workload={args.workload}",
        f"workload.num_prompts={num_prompts}", f"sampling.max_new_tokens={args.max_new_tokens}",
        f"backend={backend}", f"speculator.num_speculative_tokens={k}", f"engine.max_num_seqs={batch}",
        "tracking.wandb.mode=disabled", f"name={name}", f"hydra.run.dir={runs_dir / name}",
        *(args.native_override if backend == "native" else []),
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "SPECEXP_RUNS_DIR": str(runs_dir)})
    result_path = runs_dir / name / "result.json"
    if not result_path.exists():
        return {"backend": backend, "k": k, "batch": batch, "num_prompts": num_prompts,
                "error": (proc.stderr or proc.stdout)[-2000:]}
    record = json.loads(result_path.read_text())
    m = record["metrics"] or {}
    return {
        "backend": backend, "k": k, "batch": batch, "num_prompts": num_prompts, "status": record["status"],
        "error": record["error"],
        "output_tokens_per_s": m.get("output_tokens_per_s"), "acceptance_length": m.get("acceptance_length"),
        "tpot_ms_p50": (m.get("tpot_ms") or {}).get("p50"), "num_output_tokens": m.get("num_output_tokens"),
        "startup_s": m.get("startup_s"),
    }


def native_over_hf(rows: list[dict]) -> float | None:
    """native / hf output tokens/s at k = 4, batch 1 (None until both points are measured)."""
    by = {(r["backend"], r["k"], r["batch"]): r.get("output_tokens_per_s") for r in rows}
    if by.get(("native", 4, 1)) and by.get(("hf", 4, 1)):
        return by[("native", 4, 1)] / by[("hf", 4, 1)]
    return None


def render(results: list[tuple[str, dict]]) -> str:
    """One row per point (backend, k, batch), one column per result (file name, its JSON): output tokens/s and
    TPOT p50 ms; the acceptance length (one value when every result agrees); last, native / hf at k = 4, batch 1."""
    keys = list(dict.fromkeys((r["backend"], r["k"], r["batch"]) for _, data in results for r in data["points"]))
    lines = ["| backend | k | batch (max_num_seqs) | prompts | acceptance length | "
             + " | ".join(f"`{name}`: tokens/s (TPOT p50 ms)" for name, _ in results) + " |",
             "|---|---|---|---|---|" + "---|" * len(results)]
    for key in keys:
        rows = [next((r for r in data["points"] if (r["backend"], r["k"], r["batch"]) == key), None)
                for _, data in results]
        # results written before points recorded their prompt count ran every point with the settings' count
        prompts = list(dict.fromkeys(r.get("num_prompts", data["settings"]["num_prompts"])
                                     for r, (_, data) in zip(rows, results, strict=True) if r))
        lengths = list(dict.fromkeys(f"{r['acceptance_length']:.2f}" for r in rows if r and r.get("acceptance_length")))
        cells = ["-" if not r or r.get("output_tokens_per_s") is None
                 else f"{r['output_tokens_per_s']:.1f} ({r['tpot_ms_p50']:.2f})" for r in rows]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {' / '.join(map(str, prompts)) or '-'} | "
                     f"{' / '.join(lengths) or '-'} | " + " | ".join(cells) + " |")
    ratios = [native_over_hf(data["points"]) for _, data in results]
    lines.append("| **native / hf** | 4 | 1 | | | " + " | ".join("-" if r is None else f"**{r:.2f}x**" for r in ratios)
                 + " |")
    return "\n".join(lines)


def render_ab(results: list[tuple[str, dict]]) -> str:
    """One row per `--ab` result (file name, its JSON): the native runs' overrides, each backend's tokens/s (mean ±
    std, n), native / hf with its 95% interval, the acceptance lengths seen and the start-up seconds native spent
    capturing (on a CPU: compiling) graphs, in its first run and then in the later ones (mean ± std): inductor
    caches what it compiled on disk, so a first run on a cold cache compiles and later ones mostly trace."""
    header = ("| file | native overrides | hf tokens/s | native tokens/s | native / hf [95%] | acceptance length "
              "(native / hf) | native graph capture s (run 1, then the rest) |")
    from specexp.measure.intervals import repeat_summary

    lines = [header, "|---|---|---|---|---|---|---|"]
    for name, data in results:
        ab, speeds = data["ab"], data["ab"]["tokens_per_s"]
        cells = [f"{speeds[b]['mean']:.1f} ± {speeds[b]['std'] or 0:.1f} (n = {speeds[b]['n']})" if b in speeds
                 else "-" for b in ("hf", "native")]
        ratio = ab["native_over_hf"]
        ratio_cell = "-" if not ratio else f"**{ratio['value']:.2f}x** [{ratio['low']:.2f}, {ratio['high']:.2f}]"
        lengths = " / ".join(f"{statistics.mean(r['acceptance_length'] for r in ab['runs'][b]):.4f}"
                             for b in ("native", "hf"))
        captures = [(r.get("startup_s") or {}).get("graph_capture") for r in ab["runs"]["native"]]
        captures = [c for c in captures if c is not None]
        rest = repeat_summary(captures[1:])
        capture = "-" if not captures else f"{captures[0]:.1f} first" + (
            f", then {rest['mean']:.1f} ± {rest['std'] or 0:.1f} (n = {rest['n']})" if rest["n"] else "")
        overrides = " ".join(f"`{o}`" for o in data["settings"].get("native_override") or []) or "none"
        lines.append(f"| `{name}` | {overrides} | {cells[0]} | {cells[1]} | {ratio_cell} | {lengths} | {capture} |")
    return "\n".join(lines)


def ab_rounds(rounds: int, args, runs_dir: Path) -> dict:
    """`--ab`: `rounds` rounds of (hf, native) at k = 4, batch 1; each backend's runs, their tokens/s summary,
    native / hf with its 95% interval, and the acceptance lengths seen."""
    from specexp.measure.intervals import ratio_interval, repeat_summary

    runs = {"hf": [], "native": []}
    for r in range(rounds):
        for backend in ("hf", "native"):
            row = run_point(backend, 4, 1, args, runs_dir / f"round{r}")
            print(json.dumps({"round": r, **row}), flush=True)
            runs[backend].append(row)
    speeds = {b: [row["output_tokens_per_s"] for row in rows if row.get("output_tokens_per_s")] for b, rows in runs.items()}
    lengths = sorted({round(row["acceptance_length"], 6) for rows in runs.values() for row in rows
                      if row.get("acceptance_length") is not None})
    return {"rounds": rounds, "runs": runs, "tokens_per_s": {b: repeat_summary(v) for b, v in speeds.items() if v},
            "native_over_hf": ratio_interval(speeds["native"], speeds["hf"]) if all(speeds.values()) else None,
            "acceptance_lengths": lengths, "acceptance_identical": len(lengths) == 1}


def machine(engine: str) -> dict:
    """Where the figures come from: host, Python, torch and (engine=cuda) the GPU."""
    import torch

    info = {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__}
    if engine == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny_lfm2")
    parser.add_argument("--workload", default="code")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--engine", default="cpu", choices=["cpu", "cuda"], help="engine config group")
    parser.add_argument("--native-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for the native runs alone, e.g. engine.cudagraph_mode=full (step "
                             "graphs compiled for the CPU); repeatable")
    parser.add_argument("--out", default="native_vs_hf.json")
    parser.add_argument("--table", nargs="+", metavar="FILE", help="print the table of earlier results; run nothing")
    parser.add_argument("--ab", type=int, default=0, metavar="N",
                        help="only k = 4, batch 1: N rounds of hf then native (see the module doc)")
    args = parser.parse_args()
    if args.table:
        missing = [f for f in args.table if not Path(f).is_file()]
        if missing:
            parser.error(f"--table: no such file: {', '.join(missing)}")
        results = [(Path(f).name, json.loads(Path(f).read_text())) for f in args.table]
        ab = [r for r in results if "ab" in r[1]]
        if ab and len(ab) != len(results):
            parser.error("--table: give files of --ab runs or files of full runs, not both")
        print(render_ab(results) if ab else render(results))
        return
    if args.ab < 0:
        parser.error(f"--ab={args.ab}: must be a number of rounds >= 1 (or 0: every point once)")
    if args.ab:
        with tempfile.TemporaryDirectory() as tmp:
            ab = ab_rounds(args.ab, args, Path(tmp))
        Path(args.out).write_text(json.dumps({"machine": machine(args.engine), "settings": vars(args), "ab": ab},
                                             indent=1))
        for backend, summary in ab["tokens_per_s"].items():
            print(f"{backend}: {summary['mean']:.1f} ± {summary['std'] or 0:.1f} tokens/s (n = {summary['n']})")
        ratio = ab["native_over_hf"] or {}
        print(f"native / hf at k=4, batch 1: {ratio.get('value')} [95%: {ratio.get('low')}, {ratio.get('high')}]; "
              f"acceptance lengths {ab['acceptance_lengths']}")
        print(f"wrote {args.out}")
        return
    rows: list[dict] = []
    ratio = None
    with tempfile.TemporaryDirectory() as tmp:
        for backend, k, batch in POINTS:
            row = run_point(backend, k, batch, args, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
            ratio = native_over_hf(rows)
            Path(args.out).write_text(json.dumps(
                {"machine": machine(args.engine), "settings": vars(args), "points": rows,
                 "native_over_hf_k4_batch1": ratio}, indent=1))
    print(render([(Path(args.out).name, json.loads(Path(args.out).read_text()))]))
    print(f"native / hf tokens/s at k=4, batch 1: {ratio}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
