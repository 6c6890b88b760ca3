"""Fixtures for the analysis tests.

- ``write_run``: writes a run record (result.json, and optionally steps.parquet) into a temporary runs
  directory; records come from :mod:`analysis_records`.
- ``sweep_dir`` (built once per test run): a real depth sweep made by the CLI — ``python -m specexp run -m
  +exp=depth_sweep`` with the tiny random pair on the random workload (pinned: the experiment's defaults may
  name a trained pair), k in {0, 1, 2}, 2 prompts of 8 tokens, 6 new tokens, native backend, W&B disabled —
  in a temporary ``SPECEXP_RUNS_DIR``. Takes a few seconds on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SWEEP_KS = (0, 1, 2)


@pytest.fixture
def write_run(tmp_path):
    """``write_run(subdir, record, steps=None) -> run_dir`` under a temporary runs directory."""

    def write(subdir: str, record: dict, steps: pd.DataFrame | None = None) -> Path:
        run_dir = tmp_path / "runs" / subdir
        run_dir.mkdir(parents=True)
        record = {**record, "run_dir": str(run_dir)}
        (run_dir / "result.json").write_text(json.dumps(record))
        if steps is not None:
            steps.to_parquet(run_dir / "steps.parquet", index=False)
        return run_dir

    return write


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("analysis-runs")
    command = [
        sys.executable, "-m", "specexp", "run", "-m", "+exp=depth_sweep", "pair=tiny_random", "workload=random",
        f"speculator.num_speculative_tokens={','.join(map(str, SWEEP_KS))}", "backend=native", "tracking=disabled",
        "workload.num_prompts=2", "workload.input_len=8", "workload.output_len=6", "sampling.max_new_tokens=6",
        "isolate_sweep_jobs=false",
    ]
    env = {**os.environ, "SPECEXP_RUNS_DIR": str(runs)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sweep,) = [p for p in runs.iterdir() if p.is_dir()]
    return sweep
