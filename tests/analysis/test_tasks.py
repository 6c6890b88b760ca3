"""Per-task results (Spec-Bench's leaderboard layout): acceptance length and speedup per task x k, in
``specexp report`` and from ``specexp.analysis.tasks``."""

import math
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from analysis_records import synthetic_record
from nbclient import NotebookClient

from specexp.analysis import load_runs, tasks
from specexp.workloads.benchmarks import data_dir

ROOT = Path(__file__).resolve().parents[2]


def with_tasks(record: dict, groups: dict) -> dict:
    """``record`` with ``metrics.by_task`` = ``{task: (acceptance_length, output_tokens_per_s)}``."""
    by_task = {task: {"num_requests": 2, "acceptance_length": al, "output_tokens_per_s": speed,
                      "spec_bench_mean_accepted_tokens": (al + 1) / 2, "ttft_ms": {"p50": 1.0}}
               for task, (al, speed) in groups.items()}
    return {**record, "metrics": {**record["metrics"], "by_task": by_task, "by_category": by_task}}


def test_speedup_divides_by_the_same_tasks_k0_throughput_in_the_same_group(write_run, tmp_path):
    write_run("s/0", with_tasks(synthetic_record(0), {"qa": (1.0, 100.0), "rag": (1.0, 50.0)}))
    write_run("s/1", with_tasks(synthetic_record(2), {"qa": (2.5, 150.0), "rag": (2.0, 100.0)}))
    write_run("t/0", with_tasks(synthetic_record(0, workload="other", group="sweep_b"), {"qa": (1.0, 10.0)}))
    write_run("t/1", with_tasks(synthetic_record(2, workload="other", group="sweep_b"), {"qa": (3.0, 40.0)}))
    write_run("s/2", synthetic_record(1, status="failed"))
    runs = load_runs(tmp_path / "runs")
    table = tasks.per_task(runs)
    got = {(r["sweep_group"], r["task"], r["k"]): r["speedup"] for _, r in table.iterrows()}
    assert got == pytest.approx({("sweep_a", "qa", 0): 1.0, ("sweep_a", "rag", 0): 1.0, ("sweep_a", "qa", 2): 1.5,
                                 ("sweep_a", "rag", 2): 2.0, ("sweep_b", "qa", 0): 1.0, ("sweep_b", "qa", 2): 4.0})
    wide = tasks.task_pivot(runs, "acceptance_length")
    assert list(wide.columns) == ["k=0", "k=2"] and len(wide) == 3
    assert wide.xs("rag", level="task")["k=2"].item() == 2.0


def with_task_repeats(record: dict, speeds: dict[str, list[float]], acceptance_length: float = 2.0) -> dict:
    """``record`` with per-task tokens/s measured once per repeat: ``speeds = {task: [repeat 0, 1, ...]}``
    (``metrics.by_task`` holds the first repeat's, as a run writes it; ``repeats[r].figures.by_task`` each)."""
    record = with_tasks(record, {task: (acceptance_length, values[0]) for task, values in speeds.items()})
    num_repeats = len(next(iter(speeds.values())))
    repeats = [{"repeat": r, "figures": {"output_tokens_per_s": sum(v[r] for v in speeds.values()),
                                         "by_task": {task: {"output_tokens_per_s": v[r]} for task, v in speeds.items()}}}
               for r in range(num_repeats)]
    return {**record, "repeats": repeats, "metrics": {**record["metrics"], "num_repeats": num_repeats}}


def task_row(runs: pd.DataFrame, task: str, k: int, group: str = "sweep_a") -> pd.Series:
    table = tasks.per_task(runs)
    (row,) = [r for _, r in table.iterrows() if r["task"] == task and r["k"] == k and r["sweep_group"] == group]
    return row


def test_a_tasks_speedup_gets_an_interval_from_the_repeats_of_both_points(write_run, tmp_path):
    write_run("s/0", with_task_repeats(synthetic_record(0), {"qa": [100.0, 104.0, 96.0], "rag": [50.0, 51.0, 49.0]}))
    write_run("s/1", with_task_repeats(synthetic_record(2), {"qa": [150.0, 160.0, 140.0], "rag": [80.0, 60.0, 100.0]}))
    runs = load_runs(tmp_path / "runs")
    qa, rag = task_row(runs, "qa", 2), task_row(runs, "rag", 2)
    for row, (speeds, base) in ((qa, ([150, 160, 140], [100, 104, 96])), (rag, ([80, 60, 100], [50, 51, 49]))):
        assert row["output_tokens_per_s"] == pytest.approx(np.mean(speeds))  # the mean over the repeats
        assert row["speedup"] == pytest.approx(np.mean(speeds) / np.mean(base))
        assert row["speedup_low"] < row["speedup"] < row["speedup_high"]
        assert (row["speedup_repeats"], row["baseline_repeats"]) == (3, 3)
    # rag's k=2 repeats spread 4x more than qa's (relative): its interval is wider, relative to its speedup
    assert rag["speedup_high"] / rag["speedup_low"] > qa["speedup_high"] / qa["speedup_low"]
    base = task_row(runs, "qa", 0)
    assert base["speedup"] == 1.0 and math.isnan(base["speedup_low"]) and math.isnan(base["speedup_high"])
    again = tasks.per_task(load_runs(tmp_path / "runs"))  # analytic: the same records give the same bounds
    assert again["speedup_low"].tolist() == pytest.approx(tasks.per_task(runs)["speedup_low"].tolist(), nan_ok=True)


def test_noisier_repeats_widen_a_tasks_speedup_interval(write_run, tmp_path):
    rng = np.random.default_rng(7)
    quiet, noisy = (list(100 * (1 + spread * rng.standard_normal(4))) for spread in (0.02, 0.2))
    write_run("s/0", with_task_repeats(synthetic_record(0), {"qa": [100.0, 101.0, 99.0, 100.0]}))
    write_run("s/1", with_task_repeats(synthetic_record(2), {"qa": quiet}))
    write_run("t/0", with_task_repeats(synthetic_record(0, group="sweep_b"), {"qa": [100.0, 101.0, 99.0, 100.0]}))
    write_run("t/1", with_task_repeats(synthetic_record(2, group="sweep_b"), {"qa": noisy}))
    runs = load_runs(tmp_path / "runs")
    width = {g: task_row(runs, "qa", 2, g)["speedup_high"] - task_row(runs, "qa", 2, g)["speedup_low"]
             for g in ("sweep_a", "sweep_b")}
    assert width["sweep_b"] > 3 * width["sweep_a"] > 0


def test_a_tasks_speedup_interval_covers_the_true_ratio_at_about_its_stated_rate(tmp_path):
    """100 seeded sweeps of 3 repeats a point, tokens/s normal around a known mean (k=0: 100, k=2: 150 for qa,
    so the true speedup is 1.5): the 95% intervals cover 1.5 in at least 90 of them."""
    from specexp.analysis.load import record_row, runs_frame

    rng = np.random.default_rng(2026)
    rows = []
    for draw in range(100):
        for k, mean in ((0, 100.0), (2, 150.0)):
            speeds = list(mean * (1 + 0.1 * rng.standard_normal(3)))
            record = with_task_repeats(synthetic_record(k, group=f"sweep_{draw}"), {"qa": speeds})
            rows.append(record_row(record, tmp_path / f"{draw}" / f"{k}"))
    table = tasks.per_task(runs_frame(rows))
    spec = table[table["k"] == 2]
    assert len(spec) == 100 and spec["speedup_low"].notna().all()
    covered = int(((spec["speedup_low"] <= 1.5) & (1.5 <= spec["speedup_high"])).sum())
    assert 90 <= covered <= 100


def test_one_repeat_gives_a_tasks_speedup_without_interval_and_says_so(write_run, tmp_path):
    write_run("s/0", with_tasks(synthetic_record(0), {"qa": (1.0, 100.0)}))
    write_run("s/1", with_task_repeats(synthetic_record(2), {"qa": [150.0, 140.0]}))
    runs = load_runs(tmp_path / "runs")
    row = task_row(runs, "qa", 2)
    assert row["speedup"] == pytest.approx(1.45) and math.isnan(row["speedup_low"])
    assert (row["speedup_repeats"], row["baseline_repeats"]) == (2, 1)
    section = "\n".join(tasks.report_section(runs))
    assert "n = 2 repeats at each k and 1 at k=0" in section and "| qa | 1.00 | 1.45 |" in section
    write_run("t/0", with_task_repeats(synthetic_record(0, workload="other", group="sweep_b"), {"qa": [10.0, 11.0, 9.0]}))
    write_run("t/1", with_task_repeats(synthetic_record(2, workload="other", group="sweep_b"), {"qa": [20.0, 21.0, 19.0]}))
    section = "\n".join(tasks.report_section(load_runs(tmp_path / "runs")))  # counts differ: each cell says its own
    assert "n = repeats at k / at k=0 in each cell" in section and "1.45 n=2/1 |" in section
    assert "2.00 [" in section and "] n=3/3 |" in section


def test_the_report_section_shows_each_tasks_speedup_with_its_interval_and_n(write_run, tmp_path):
    write_run("s/0", with_task_repeats(synthetic_record(0), {"qa": [100.0, 104.0, 96.0]}))
    write_run("s/1", with_task_repeats(synthetic_record(2), {"qa": [150.0, 160.0, 140.0]}))
    runs = load_runs(tmp_path / "runs")
    row = task_row(runs, "qa", 2)
    section = "\n".join(tasks.report_section(runs))
    assert f"{row['speedup']:.2f} [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]" in section
    assert "n = 3 repeats at each k and 3 at k=0" in section
    assert "acceptance" not in tasks.speedup_markdown(runs).lower()
    assert "Speedup" not in "\n".join(tasks.report_section(runs, acceptance_only=True))


def test_runs_without_groups_give_no_section(write_run, tmp_path):
    write_run("s/0", synthetic_record(0))
    write_run("s/1", synthetic_record(2))
    runs = load_runs(tmp_path / "runs")
    assert tasks.per_task(runs).empty and tasks.report_section(runs) == []
    assert tasks.acceptance_by_task(runs) is not None  # a figure saying so, never an error


@pytest.fixture(scope="module")
def spec_bench_sweep(tmp_path_factory):
    """``run -m +exp=depth_sweep pair=tiny_lfm2 workload=specbench workload.path=<the real file>`` at k = 0, 2, on
    three short-prompt categories of three tasks (a two-turn MT-Bench one among them), two repeats a point, to
    stay fast on CPU."""
    path = data_dir() / "specbench" / "question.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found (benchmark files live in ../shared/data or $SPECEXP_DATA_DIR)")
    runs = tmp_path_factory.mktemp("task-runs")
    command = [sys.executable, "-m", "specexp", "run", "-m", "+exp=depth_sweep", "pair=tiny_lfm2", "workload=specbench",
               f"workload.path={path}", "workload.categories=[writing,qa,translation]", "workload.num_prompts=4",
               "speculator.num_speculative_tokens=0,2", "sampling.max_new_tokens=10", "tracking=disabled",
               "isolate_sweep_jobs=false", "measure.repeats=2"]
    done = subprocess.run(command, env={**os.environ, "SPECEXP_RUNS_DIR": str(runs)}, capture_output=True,
                          text=True, timeout=600, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sweep,) = [p for p in runs.iterdir() if p.is_dir()]
    return sweep


def test_a_spec_bench_depth_sweep_reports_acceptance_and_speedup_per_task(spec_bench_sweep, tmp_path):
    done = subprocess.run([sys.executable, "-m", "specexp", "report", str(spec_bench_sweep), "--out", str(tmp_path)],
                          env={**os.environ, "MPLBACKEND": "Agg"}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "report.md").read_text()
    assert "## Per task" in report and (tmp_path / tasks.FIGURE_FILE).is_file()
    runs = load_runs(spec_bench_sweep)
    table = tasks.per_task(runs)
    assert set(table["k"]) == {0, 2} and set(table["task"]) == {"mt_bench", "translation", "qa"}
    for task in table["task"].unique():
        assert f"| {task} |" in report
    assert (table[table["k"] == 0]["speedup"] == 1.0).all() and table[table["k"] == 2]["speedup"].notna().all()
    spec = table[table["k"] == 2]  # each task's speedup has its interval from both points' 2 repeats
    assert (spec["speedup_repeats"] == 2).all() and (spec["baseline_repeats"] == 2).all()
    assert ((spec["speedup_low"] <= spec["speedup"]) & (spec["speedup"] <= spec["speedup_high"])).all()
    assert "n = 2 repeats at each k and 2 at k=0" in report
    for _, row in spec.iterrows():
        assert f"{row['speedup']:.2f} [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]" in report
    for _, run in runs.iterrows():  # the tasks' requests add up to the run's
        assert sum(g["num_requests"] for g in run["by_task"].values()) == run["num_requests"]
        assert sum(g["num_drafts"] for g in run["by_category"].values()) == run["num_drafts"]


def test_the_acceptance_notebook_shows_the_task_tables_of_a_spec_bench_sweep(spec_bench_sweep, monkeypatch):
    monkeypatch.setenv("SPECEXP_RUNS_DIR", str(spec_bench_sweep.parent))
    path = ROOT / "notebooks" / "01_acceptance.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    html = "".join(o.get("data", {}).get("text/html", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "k=2" in html and any(task in html for task in ("mt_bench", "qa", "rag", "translation"))
    assert isinstance(tasks.task_pivot(load_runs(spec_bench_sweep), "speedup"), pd.DataFrame)
