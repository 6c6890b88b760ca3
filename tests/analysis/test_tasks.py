"""Per-task results (Spec-Bench's leaderboard layout): acceptance length and speedup per task x k, in
``specexp report`` and from ``specexp.analysis.tasks``."""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
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


def test_runs_without_groups_give_no_section(write_run, tmp_path):
    write_run("s/0", synthetic_record(0))
    write_run("s/1", synthetic_record(2))
    runs = load_runs(tmp_path / "runs")
    assert tasks.per_task(runs).empty and tasks.report_section(runs) == []
    assert tasks.acceptance_by_task(runs) is not None  # a figure saying so, never an error


@pytest.fixture(scope="module")
def spec_bench_sweep(tmp_path_factory):
    """``run -m +exp=depth_sweep pair=tiny_lfm2 workload=specbench workload.path=<the real file>`` at k = 0, 2, on
    three short-prompt categories of three tasks (a two-turn MT-Bench one among them), to stay fast on CPU."""
    path = data_dir() / "specbench" / "question.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found (benchmark files live in ../shared/data or $SPECEXP_DATA_DIR)")
    runs = tmp_path_factory.mktemp("task-runs")
    command = [sys.executable, "-m", "specexp", "run", "-m", "+exp=depth_sweep", "pair=tiny_lfm2", "workload=specbench",
               f"workload.path={path}", "workload.categories=[writing,qa,translation]", "workload.num_prompts=4",
               "speculator.num_speculative_tokens=0,2", "sampling.max_new_tokens=10", "tracking=disabled",
               "isolate_sweep_jobs=false"]
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
