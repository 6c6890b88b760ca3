"""The CLI end to end (subprocesses): one run, and a sweep whose jobs each run in their own process."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from cli_runs import mismatched_checkpoint

# Each test runs the CLI on real models in subprocesses (25-90 s each on a 2-core CPU): `-m "not slow"` skips them.
pytestmark = pytest.mark.slow


@pytest.fixture
def cli(tmp_path, monkeypatch):
    env = {**os.environ, "SPECEXP_RUNS_DIR": str(tmp_path / "runs"), "NETRC": str(tmp_path / "no-netrc")}
    env.pop("WANDB_API_KEY", None)

    def run(*args, timeout=600):
        return subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True, env=env, check=False,
                              timeout=timeout)

    return run


def tiny_pair(target, draft):
    return ["pair=local", f"pair.target.path={target}", f"pair.draft.path={draft}", "workload=random",
            "workload.num_prompts=2",
            "workload.input_len=6", "workload.output_len=8"]


def test_one_run_writes_its_records_and_an_offline_wandb_run(cli, tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    run_dir = tmp_path / "one"
    proc = cli("run", "+exp=quickstart", "backend=hf", *tiny_pair(tiny_llama_dir, tiny_llama_draft_dir),
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr
    assert "acceptance_length" in proc.stdout
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "ok" and record["wandb"]["mode"] == "offline"
    assert record["metrics"]["num_output_tokens"] == 16
    assert len((run_dir / "outputs.jsonl").read_text().splitlines()) == 2
    assert len((run_dir / "answers.jsonl").read_text().splitlines()) == 2
    assert len(pd.read_parquet(run_dir / "steps.parquet")) == record["metrics"]["num_steps"]
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))


def test_sweep_jobs_run_in_separate_processes_in_one_group_and_survive_a_failure(
        cli, tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    sweep_dir = tmp_path / "sweep"
    broken = mismatched_checkpoint(tiny_llama_draft_dir, tmp_path / "mismatched-draft")
    proc = cli("run", "-m", "+exp=depth_sweep", "backend=hf", *tiny_pair(tiny_llama_dir, tiny_llama_draft_dir),
               "speculator.num_speculative_tokens=2", f"pair.draft.path={broken},{tiny_llama_draft_dir}",
               f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 1, proc.stderr  # one job failed, the sweep went on
    assert "sweep: 2 jobs, 1 ok, 1 not ok" in proc.stdout
    records = [json.loads((sweep_dir / str(n) / "result.json").read_text()) for n in range(2)]
    assert [r["status"] for r in records] == ["failed", "ok"]  # the mismatched draft fails once it loads
    assert records[0]["error"] and "Traceback" in (sweep_dir / "0" / "error.log").read_text()
    assert [r["config"]["pair"]["draft"]["path"] for r in records] == [str(broken), str(tiny_llama_draft_dir)]
    pids = {r["env"]["pid"] for r in records}
    assert len(pids) == 2, "every job runs in a process of its own"
    assert {r["wandb"]["group"] for r in records} == {sweep_dir.name}
    assert {r["wandb"]["job_type"] for r in records} == {"depth_sweep"}
    assert list((sweep_dir / "1" / "wandb").glob("offline-run-*"))


def test_ctrl_c_records_an_interrupted_run(tmp_path, tiny_llama_dir, tiny_llama_draft_dir):
    run_dir = tmp_path / "interrupted"
    args = ["run", "backend=hf", *tiny_pair(tiny_llama_dir, tiny_llama_draft_dir), "workload.num_prompts=50",
            "workload.output_len=1000", "tracking=disabled", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "specexp", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "SPECEXP_RUNS_DIR": str(tmp_path / "runs")})
    log = run_dir / "specexp.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and "starting backend hf" in log.read_text():
            break
        time.sleep(0.2)
    time.sleep(1.0)  # loading the models or generating now
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "interrupted" and record["error"] == "interrupted by SIGINT"


def test_an_experiment_that_declares_a_sweep_runs_as_one_without_m(cli, tmp_path, tiny_llama_dir,
                                                                   tiny_llama_draft_dir):
    """`run +exp=backend_compare` (no `-m`, no backend list) sweeps its backends; a swept key set on the
    command line still wins."""
    sweep_dir = tmp_path / "compare"
    proc = cli("run", "+exp=backend_compare", "engine=cpu", "backend=native,hf", "tracking=disabled",
               *tiny_pair(tiny_llama_dir, tiny_llama_draft_dir), f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 0, proc.stderr
    assert "declares a sweep" in proc.stderr and "sweep: 2 jobs, 2 ok" in proc.stdout
    backends = {json.loads(p.read_text())["config"]["backend"]["name"] for p in sweep_dir.glob("*/result.json")}
    assert backends == {"native", "hf"}
