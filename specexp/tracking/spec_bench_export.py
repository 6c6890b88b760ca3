"""``python -m specexp export-specbench SWEEP_DIR OUT_DIR``: a sweep's answers in Spec-Bench's layout.

Spec-Bench's speed script reads ``model_answer_temp<T>_run_{1,2,3}/<model_id>.jsonl`` — three repeats of every
method, each file one answer line per question (:mod:`specexp.tracking.spec_bench`). This command finds every
finished run under SWEEP_DIR, names it by :func:`specexp.tracking.spec_bench.model_id` (target, vanilla or
``sps-<draft>-k<k>``, backend, dtype, temperature), and writes the runs of one model id with different
``engine.seed`` as its run_1, run_2 and run_3, in seed order. So a sweep over ``engine.seed=0,1,2`` and the
depths gives Spec-Bench three runs of each depth, the ``vanilla`` (k = 0) files being its baseline.

A model id with fewer than three seeds gets only those runs (one notice line), one with more gets its first
three; two runs that would write the same file (same model id and seed, e.g. two workloads) stop the export
with one line naming both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specexp.errors import ConfigError
from specexp.tracking import records
from specexp.tracking.spec_bench import model_id
from specexp.tracking.wandb_run import flatten

RUNS_PER_MODEL = 3
IGNORED_CONFIG_GROUPS = ("tracking", "name", "hydra")


def answer_dir_name(temperature: float, run: int) -> str:
    """``model_answer_temp0_run_1`` for temperature 0.0 and run 1 (Spec-Bench's directory names)."""
    return f"model_answer_temp{float(temperature):g}_run_{run}"


def _differences(a: dict, b: dict) -> str:
    fa, fb = ({k: v for k, v in flatten(c).items() if k.split(".", 1)[0] not in IGNORED_CONFIG_GROUPS}
              for c in (a, b))
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    return ", ".join(f"{k} ({fa.get(k)!r} vs {fb.get(k)!r})" for k in keys[:3]) or "nothing in their configs"


def find_runs(sweep_dir: Path) -> dict[str, dict[int, Path]]:
    """``{model_id: {engine.seed: run_dir}}`` of the finished runs under ``sweep_dir`` that wrote answers."""
    if not sweep_dir.is_dir():
        raise ConfigError(f"{sweep_dir} is not a directory: pass a sweep directory (e.g. experiments/runs/<name>)")
    runs: dict[str, dict[int, tuple[Path, dict]]] = {}
    skipped = []
    for result_path in sorted(sweep_dir.rglob(records.RESULT_FILE)):
        run_dir = result_path.parent
        try:
            record = json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError):
            skipped.append(f"{run_dir} (unreadable result.json)")
            continue
        if record.get("status") != "ok" or not (run_dir / records.ANSWERS_FILE).is_file():
            skipped.append(f"{run_dir} ({record.get('status')})")
            continue
        config = record["config"]
        name, seed = model_id(config), int(config["engine"]["seed"])
        seen = runs.setdefault(name, {})
        if seed in seen:
            other_dir, other = seen[seed]
            raise ConfigError(f"{other_dir} and {run_dir} both give {name} with engine.seed={seed}; they differ in"
                              f" {_differences(other['config'], config)}: export them from separate directories")
        seen[seed] = (run_dir, record)
    if skipped:
        print(f"specexp: notice: {len(skipped)} runs without answers left out: {', '.join(skipped[:3])}"
              f"{', ...' if len(skipped) > 3 else ''}", file=sys.stderr)
    if not runs:
        raise ConfigError(f"no finished runs with {records.ANSWERS_FILE} under {sweep_dir}")
    return {name: {seed: run for seed, (run, _) in sorted(seeds.items())} for name, seeds in runs.items()}


def export(sweep_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the Spec-Bench layout of the runs under ``sweep_dir`` into ``out_dir``; returns the files."""
    sweep_dir, out_dir = Path(sweep_dir), Path(out_dir)
    written, short = [], []
    for name, seeds in find_runs(sweep_dir).items():
        if len(seeds) != RUNS_PER_MODEL:
            short.append(f"{name}: {len(seeds)} (engine.seed {', '.join(map(str, seeds))})")
        for run, (seed, run_dir) in enumerate(list(seeds.items())[:RUNS_PER_MODEL], start=1):
            temperature = records.read_result(run_dir)["config"]["sampling"]["temperature"]
            target = out_dir / answer_dir_name(temperature, run) / f"{name}.jsonl"
            target.parent.mkdir(parents=True, exist_ok=True)
            lines = [json.loads(line) for line in (run_dir / records.ANSWERS_FILE).read_text().splitlines() if line]
            records.write_jsonl(target, [{**line, "model_id": name} for line in lines])
            written.append(target)
    if short:
        print(f"specexp: notice: Spec-Bench reads {RUNS_PER_MODEL} runs per model; these have another number"
              f" (sweep engine.seed=0,1,2 for three): {'; '.join(short)}", file=sys.stderr)
    return written


def main(argv: list[str]) -> int:
    """Entry point of ``python -m specexp export-specbench SWEEP_DIR OUT_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m specexp export-specbench", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a sweep's output directory (or any directory of runs)")
    parser.add_argument("out_dir", help="where to write model_answer_temp<T>_run_<i>/<model_id>.jsonl")
    args = parser.parse_args(argv)
    written = export(args.sweep_dir, args.out_dir)
    models = sorted({p.stem for p in written})
    print(f"export-specbench: {len(written)} answer files of {len(models)} models in {args.out_dir}")
    for name in models:
        print(f"  {name}")
    return 0
