"""End to end on a real sweep made by the CLI (the ``sweep_dir`` fixture): the metric identities hold on
what the engine recorded, every notebook runs headlessly and draws its figures, and
``python -m specexp report`` writes the figures and the summary table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from specexp.analysis import load_runs, per_position, speedup
from specexp.analysis.plots import FIGURES

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED_FIGURES = {
    "01_acceptance.ipynb": {"acceptance_vs_k", "per_position", "per_request_acceptance", "acceptance_by_task"},
    "02_latency.ipynb": {"latency_percentiles", "throughput_speedup", "dynamic_depth", "step_time_breakdown"},
    "03_graph_memory.ipynb": {"graph_memory"},
    "04_load.ipynb": {"throughput_vs_load", "best_k_vs_batch", "verify_share_vs_batch", "pareto", "oracle_vs_static"},
}


def test_identities_hold_on_a_real_sweep(sweep_dir):
    df = load_runs(sweep_dir)
    assert sorted(df["k"]) == [0, 1, 2] and set(df["status"]) == {"ok"}
    assert df["sweep_group"].nunique() == 1
    table = per_position(df)
    for _, run in df[df["k"] > 0].iterrows():
        rows = table[table["run_dir"] == run["run_dir"]]
        assert rows["unconditional"].sum() == pytest.approx(run["acceptance_length"] - 1)
    assert speedup(df).set_index("k").loc[0, "speedup"] == 1.0
    assert df["graph_capture_bytes"].isna().all()  # CPU: null, never 0
    assert df["steps.decode_verify_ms"].notna().all()


def test_notebooks_are_stored_without_outputs():
    assert {p.name for p in NOTEBOOKS} == set(EXPECTED_FIGURES)
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"


def _execute(path: Path, runs: Path, monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("SPECEXP_RUNS_DIR", str(runs))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def _figures(nb) -> dict[str, int]:
    """figure tag -> number of PNG images its cell produced."""
    found = {}
    for cell in nb.cells:
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag.startswith("figure:"):
                found[tag.removeprefix("figure:")] = sum("image/png" in o.get("data", {}) for o in cell.outputs)
    return found


def _stdout(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_headlessly_and_draws_its_figures(path, sweep_dir, monkeypatch):
    nb = _execute(path, sweep_dir.parent, monkeypatch)
    figures = _figures(nb)
    assert set(figures) == EXPECTED_FIGURES[path.name]
    assert all(n == 1 for n in figures.values()), figures
    assert "3 runs (3 ok)" in _stdout(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_says_plainly_when_there_are_no_runs(path, tmp_path, monkeypatch):
    nb = _execute(path, tmp_path / "empty", monkeypatch)
    assert "No runs found in" in _stdout(nb)


def test_report_command_writes_figures_and_summary_table(sweep_dir, tmp_path):
    out = tmp_path / "report"
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "specexp", "report", str(sweep_dir), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert {p.stem for p in out.glob("*.png")} == set(FIGURES)
    text = (out / "report.md").read_text()
    assert "| group | k | acceptance length [95%] |" in text
    assert "| tiny_random · random · native | tiny_random | random | native | cpu |" in text  # the group's header
    runs_section = text.split("## Runs")[1].split("## Theory fit")[0]
    rows = [line for line in runs_section.splitlines() if line.startswith("| tiny_random · random · native")]
    assert [row.split("|")[2].strip() for row in rows] == ["0", "1", "2"]
    assert list(pd.read_csv(out / "summary.csv")["k"]) == [0, 1, 2]


def test_specexp_report_writes_into_the_sweep_directory(sweep_dir):
    done = subprocess.run([sys.executable, "-m", "specexp", "report", str(sweep_dir)], capture_output=True,
                          text=True, env={**os.environ, "MPLBACKEND": "Agg"}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert (sweep_dir / "report.md").is_file()
    assert {p.stem for p in sweep_dir.glob("*.png")} == set(FIGURES)


def test_report_of_a_directory_without_runs_fails_with_a_clear_message(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specexp", "report", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"specexp: error: no runs (result.json files) under {tmp_path}"]
