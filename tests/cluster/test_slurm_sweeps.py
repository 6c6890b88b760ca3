"""A depth sweep on a real Slurm (``hydra/launcher=slurm``) and through the same launcher code on this machine
(``hydra/launcher=local``) leaves the records a local sweep leaves; a job ``scancel`` stops is recorded
``interrupted`` with Slurm's state, and a resume runs only that job.

One one-node Slurm serves the session (conftest); the sweeps are the trained tiny_lfm2 pair on one prompt,
16 new tokens, k = 0 and 2, torch on one thread. The two sweeps run here (the reference, with Hydra's basic
launcher, and the local launcher's) start together with the module and run beside the Slurm sweeps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cluster_cli import StartedCli, cli_env, missing_extra, run_cli

pytestmark = pytest.mark.slurm

DEPTHS = [0, 2]  # the draft off and on: two jobs
SWEEP = ["run", "-m", "+exp=depth_sweep", "workload.num_prompts=1", "sampling.max_new_tokens=16",
         "tracking=disabled"]
# One GPU per job as the shipped config asks (the test node declares four); one CPU and 2 GB so jobs run side by side.
ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2"]
ACCEPTANCE_KEYS = ("acceptance_length", "draft_acceptance_rate", "per_position_acceptance", "conditional_acceptance",
                   "acceptance_histogram", "num_drafts", "num_draft_tokens", "num_accepted_tokens")
SUBMITIT_LOGS = {"submitit.out", "submitit.err"}


def depths(values) -> str:
    return f"speculator.num_speculative_tokens={','.join(str(k) for k in values)}"


def record(sweep_dir: Path, num: int) -> dict:
    return json.loads((sweep_dir / str(num) / "result.json").read_text())


def acceptance(rec: dict) -> dict:
    missing = [k for k in ACCEPTANCE_KEYS if k not in rec["metrics"]]
    assert not missing, f"the record has no {missing}"
    return {k: rec["metrics"][k] for k in ACCEPTANCE_KEYS}


def output_tokens(sweep_dir: Path, num: int) -> list:
    lines = (sweep_dir / str(num) / "outputs.jsonl").read_text().splitlines()
    return [json.loads(line)["output_token_ids"] for line in lines]


def job_files(sweep_dir: Path, num: int) -> set[str]:
    return {p.name for p in (sweep_dir / str(num)).iterdir()} - SUBMITIT_LOGS


def running_while(proc: StartedCli, cluster, poll_s: float = 0.2) -> set[str]:
    """Wait for ``proc`` to end; returns the Slurm job ids squeue showed RUNNING meanwhile."""
    seen = set()
    while proc.poll() is None:
        seen |= {line.split()[0] for line in cluster.squeue() if line.endswith(" RUNNING")}
        time.sleep(poll_s)
    return seen


def slurm_id(rec: dict) -> str:
    facts = rec["env"]["slurm"]
    return f"{facts['array_job_id']}_{facts['array_task_id']}" if facts["array_job_id"] else facts["job_id"]


@pytest.fixture(scope="module")
def local_sweeps(tmp_path_factory):
    """The same sweep started here, twice at once: ``basic`` (Hydra's basic launcher: each job a fresh process,
    the reference) and, where the cluster extra is installed, ``local`` (hydra/launcher=local)."""
    runs = tmp_path_factory.mktemp("local-runs")
    launchers = {"basic": []} if missing_extra() else {"basic": [], "local": ["hydra/launcher=local"]}
    started = {}
    for name, extra in launchers.items():
        sweep_dir = runs / name
        started[name] = (sweep_dir, StartedCli([*SWEEP, depths(DEPTHS), *extra, f"hydra.sweep.dir={sweep_dir}"],
                                               cli_env(runs), runs / f"{name}-log"))
    yield started
    for _, proc in started.values():
        if proc.poll() is None:
            proc.wait(timeout=300)


@pytest.fixture(scope="module")
def local_sweep(local_sweeps):
    """The reference sweep's directory, once it has finished ok."""
    sweep_dir, proc = local_sweeps["basic"]
    done = proc.wait()
    assert done.returncode == 0, done.stderr
    return sweep_dir


@pytest.fixture(scope="module")
def slurm_sweep(tmp_path_factory, slurm_cluster, local_sweeps):
    """The sweep on Slurm; returns (sweep_dir, finished process, job ids squeue showed running)."""
    runs = tmp_path_factory.mktemp("slurm-runs")
    sweep_dir = runs / "slurm"
    proc = StartedCli([*SWEEP, depths(DEPTHS), *ON_SLURM, f"hydra.sweep.dir={sweep_dir}"],
                      cli_env(runs, slurm_cluster.env), runs / "log")
    seen = running_while(proc, slurm_cluster)
    return sweep_dir, proc.wait(timeout=60), seen


def test_a_sweep_on_slurm_runs_each_job_as_a_slurm_job_and_records_what_a_local_sweep_records(
        slurm_sweep, local_sweep):
    sweep_dir, done, seen = slurm_sweep
    assert done.returncode == 0, done.stderr
    assert f"sweep: {len(DEPTHS)} jobs, {len(DEPTHS)} ok, 0 not ok" in done.stdout
    records = [record(sweep_dir, i) for i in range(len(DEPTHS))]
    assert [r["status"] for r in records] == ["ok"] * len(DEPTHS)
    assert {slurm_id(r) for r in records} == seen, "each job ran as a Slurm job that squeue showed running"
    assert len(seen) == len(DEPTHS)
    assert {r["wandb"]["group"] for r in records} == {sweep_dir.name}, "one W&B group: the sweep directory's name"
    for i, rec in enumerate(records):
        local = record(local_sweep, i)
        assert local["env"]["slurm"] is None
        assert rec["config"] == local["config"]
        assert acceptance(rec) == acceptance(local), f"job {i}: the acceptance figures of the local sweep"
        assert output_tokens(sweep_dir, i) == output_tokens(local_sweep, i)
        assert rec.keys() == local.keys() and job_files(sweep_dir, i) == job_files(local_sweep, i)
        assert SUBMITIT_LOGS <= {p.name for p in (sweep_dir / str(i)).iterdir()}, "submitit's logs beside the record"
        assert "Job completed successfully" in (sweep_dir / str(i) / "submitit.out").read_text()


def test_a_report_reads_the_sweep_the_cluster_ran(slurm_sweep, tmp_path):
    sweep_dir = slurm_sweep[0]
    proc = run_cli(["report", str(sweep_dir), "--out", str(tmp_path / "report")], cli_env(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert f"{len(DEPTHS)} runs ({len(DEPTHS)} ok) in 1 comparison groups" in report


@pytest.fixture(scope="module")
def cancelled_sweep(tmp_path_factory, slurm_cluster, local_sweeps):
    """A two-job sweep on Slurm whose job 1 is cancelled with scancel while it measures (its log says it serves).
    Many repeats keep each job measuring for seconds (acceptance comes from the first repeat, as without them)."""
    runs = tmp_path_factory.mktemp("cancel-runs")
    sweep_dir = runs / "cancelled"
    env = cli_env(runs, slurm_cluster.env)
    proc = StartedCli([*SWEEP, depths(DEPTHS[:2]), *ON_SLURM, "measure.repeats=30", f"hydra.sweep.dir={sweep_dir}"],
                      env, runs / "log")
    log = sweep_dir / "1" / "specexp.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and "serving" in log.read_text()) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    running = [line.split()[0] for line in slurm_cluster.squeue() if line.endswith(" RUNNING")]
    target = next((job for job in running if job.endswith("_1")), None)
    assert target is not None, f"job 1 is not running: {running}"
    slurm_cluster.scancel(target)
    return sweep_dir, proc.wait(timeout=180), env, target


def test_a_job_scancel_stops_is_recorded_interrupted_and_the_others_finish(cancelled_sweep):
    sweep_dir, done, _, target = cancelled_sweep
    assert done.returncode == 1, done.stderr
    assert "sweep: 2 jobs, 1 ok, 1 not ok" in done.stdout and "job 1: interrupted" in done.stdout
    assert record(sweep_dir, 0)["status"] == "ok"
    cancelled = record(sweep_dir, 1)
    assert cancelled["status"] == "interrupted"
    assert cancelled["slurm_state"] == "CANCELLED"
    assert cancelled["interrupted_by"] == "SIGTERM", "the job recorded the SIGTERM scancel sent it"
    assert f"Slurm job {target}: CANCELLED" in cancelled["error"]


def test_resuming_the_sweep_on_slurm_runs_only_the_cancelled_job(cancelled_sweep, local_sweep, slurm_cluster):
    sweep_dir, _, env, target = cancelled_sweep
    kept = (sweep_dir / "0" / "result.json").read_bytes()
    proc = StartedCli(["resume", str(sweep_dir)], env, sweep_dir.parent / "resume-log")
    first_array = target.rpartition("_")[0]  # squeue may list its finished job 0 a moment longer
    seen = {job for job in running_while(proc, slurm_cluster) if job.rpartition("_")[0] != first_array}
    done = proc.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sweep: 2 jobs, 2 ok (1 kept from before), 0 not ok" in done.stdout
    assert "submitted 1 job(s) to Slurm" in done.stdout + done.stderr
    assert (sweep_dir / "0" / "result.json").read_bytes() == kept, "the ok job is not run again"
    resumed = record(sweep_dir, 1)
    assert resumed["status"] == "ok" and seen == {slurm_id(resumed)}
    assert json.loads((sweep_dir / "1" / "result.previous.json").read_text())["status"] == "interrupted"
    assert acceptance(resumed) == acceptance(record(local_sweep, 1))
    assert resumed["wandb"]["group"] == record(sweep_dir, 0)["wandb"]["group"] == sweep_dir.name


def test_the_local_launcher_runs_the_same_sweep_with_the_same_records(cluster_extra, local_sweeps, local_sweep):
    sweep_dir, proc = local_sweeps["local"]
    done = proc.wait()
    assert done.returncode == 0, done.stderr
    assert f"sweep: {len(DEPTHS)} jobs, {len(DEPTHS)} ok, 0 not ok" in done.stdout
    pids = set()
    for i in range(len(DEPTHS)):
        rec, local = record(sweep_dir, i), record(local_sweep, i)
        assert rec["status"] == "ok" and rec["wandb"]["group"] == sweep_dir.name
        assert rec["config"] == local["config"] and acceptance(rec) == acceptance(local)
        assert rec.keys() == local.keys() and job_files(sweep_dir, i) == job_files(local_sweep, i)
        assert SUBMITIT_LOGS <= {p.name for p in (sweep_dir / str(i)).iterdir()}
        pids.add(rec["env"]["pid"])
    assert len(pids) == len(DEPTHS), "every job ran in a process of its own"
