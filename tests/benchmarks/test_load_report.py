"""The serving-load report (benchmarks/load_report.py, benchmarks/load_figures.py) on a real, small load sweep
measured with repeats: every speed figure it prints carries its spread and n, every speedup its interval,
the measurement section reports the load averages the records hold, and the figures draw error bars."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from matplotlib.container import ErrorbarContainer

from specexp.analysis import load_runs
from specexp.analysis.load_plots import FIGURES
from specexp.analysis.load_tables import TIMING_COLUMNS, best_k_table, load_table, oracle_table

ROOT = Path(__file__).resolve().parents[2]
REPEATS = 2


@pytest.fixture(scope="module")
def load_sweep(tmp_path_factory) -> Path:
    """``+exp=load_sweep`` at 1 and 4 requests in flight x k = 0, 2 on 6 prompts of 6 new tokens, two repeats
    a job, interleaved across the jobs (one process each), W&B off."""
    runs = tmp_path_factory.mktemp("load-runs")
    command = [sys.executable, "-m", "specexp", "run", "-m", "+exp=load_sweep", "workload.num_prompts=6",
               "sampling.max_new_tokens=6", "workload.max_concurrency=1,4", "speculator.num_speculative_tokens=0,2",
               f"measure.repeats={REPEATS}", "tracking=disabled"]
    done = subprocess.run(command, env={**os.environ, "SPECEXP_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sweep,) = [p for p in runs.iterdir() if p.is_dir()]
    return sweep


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/load_report.py", *args], capture_output=True, text=True,
                          check=False, cwd=ROOT, env={**os.environ, "MPLBACKEND": "Agg"})


def _records(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/result.json"))]


def test_every_timing_figure_of_the_load_table_has_its_interval_over_the_repeats(load_sweep):
    table = load_table(load_runs(load_sweep))
    assert len(table) == 4
    for figure in ("output_tokens_per_s", "tpot_ms.p50", "tokens_per_s_per_user.p50", "verify_share.mean"):
        assert figure in TIMING_COLUMNS
        assert (table[f"{figure}_n"] == REPEATS).all()
        assert ((table[f"{figure}_low"] <= table[figure]) & (table[figure] <= table[f"{figure}_high"])).all()
        assert (table[f"{figure}_std"] >= 0).all()
    for _, row in table.iterrows():  # the mean is the mean of the repeats the record kept
        assert row["output_tokens_per_s"] == pytest.approx(sum(row["repeats.output_tokens_per_s"]) / REPEATS)


def test_speedups_get_intervals_from_the_repeats_of_both_points(load_sweep):
    runs = load_runs(load_sweep)
    best = best_k_table(runs)
    assert list(best["load"]) == [1, 4]
    for _, row in best.iterrows():
        assert (row["repeats"], row["baseline_repeats"]) == (REPEATS, REPEATS)
        if row["best_k"] == 0:
            assert row["speedup"] == 1.0 and math.isnan(row["speedup_low"])
            assert "k=0" in row["claim"] and "next best k=2" in row["claim"]
        else:
            assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
    oracle = oracle_table(runs)
    for _, row in oracle.iterrows():
        assert row["oracle_speedup_n"] == REPEATS and row["model_best_static_speedup_n"] == REPEATS
        assert row["oracle_speedup_low"] <= row["oracle_speedup"] <= row["oracle_speedup_high"]
        # the per-step oracle bounds the best static depth in every repeat, so in the mean too
        assert row["oracle_speedup"] >= row["model_best_static_speedup"] * (1 - 1e-9)


def test_the_printed_report_gives_every_speed_figure_with_its_spread_and_n(load_sweep, tmp_path):
    done = _report(str(load_sweep), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text == (tmp_path / "load_report.md").read_text()
    table = load_table(load_runs(load_sweep))
    for title in ("Output tokens/s", "TPOT p50 (ms)", "TPOT p99 (ms)", "Tokens/s per user", "Verify share"):
        (line,) = [line for line in text.splitlines() if line.startswith(title)]
        assert f"n = {REPEATS} repeats in every cell" in line
    for _, row in table.iterrows():
        cell = (f"{row['output_tokens_per_s']:.0f} ± {row['output_tokens_per_s_std']:.0f} "
                f"[{row['output_tokens_per_s_low']:.0f}, {row['output_tokens_per_s_high']:.0f}]")
        assert cell in text
        assert f"{row['tpot_ms.p50']:.1f} ± {row['tpot_ms.p50_std']:.1f}" in text
    for _, row in best_k_table(load_runs(load_sweep)).iterrows():
        assert f"| {REPEATS}/{REPEATS} |" in text
    saved = json.loads((tmp_path / "load_report.json").read_text())
    assert {"measurement", "load", "best_k", "oracle"} <= set(saved) and len(saved["load"]) == 4
    assert all(r["output_tokens_per_s_n"] == REPEATS for r in saved["load"])


def test_the_measurement_section_reports_the_load_averages_the_records_hold(load_sweep):
    text = _report(str(load_sweep)).stdout
    loads = [r["measure"]["machine"]["before"]["load_avg"][0] for r in _records(load_sweep)]
    loads += [rep["machine"]["after"]["load_avg"][0] for r in _records(load_sweep) for rep in r["repeats"]]
    assert f"over {len(loads)} readings" in text
    assert f"max {max(loads):.2f}" in text and f"min {min(loads):.2f}" in text
    busy = sum("machine_busy" in r["metrics"]["noise"]["flags"] for r in _records(load_sweep))
    assert f"{busy} of 4 runs saw the machine busy" in text
    assert f"{REPEATS} measured repeat(s) each (interleaved)" in text
    if busy:  # a flagged run's cells carry the mark
        assert "†" in text


@pytest.mark.parametrize("figure", ["throughput_vs_load", "verify_share_vs_batch", "pareto", "oracle_vs_static"])
def test_the_load_figures_draw_error_bars(load_sweep, figure):
    fig = FIGURES[figure](load_runs(load_sweep))
    containers = [c for ax in fig.axes for c in ax.containers]
    if figure == "oracle_vs_static":
        assert any(c.errorbar is not None for c in containers if hasattr(c, "errorbar"))
    else:
        bars = [c for c in containers if isinstance(c, ErrorbarContainer)]
        assert bars and all(c.has_yerr for c in bars)
        if figure == "pareto":
            assert all(c.has_xerr for c in bars)
    assert "95%" in fig.get_suptitle()


def test_a_directory_without_runs_is_one_clear_line_and_exit_2(tmp_path):
    done = _report(str(tmp_path / "nothing"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "nothing" in done.stderr
