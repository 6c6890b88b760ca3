"""A cluster launcher that cannot work is refused in one line before anything runs; Slurm's answers are read
as Slurm writes them."""

from __future__ import annotations

import pytest
from cluster_cli import cli_env, run_cli

from specexp import launch
from specexp.cluster import slurm
from specexp.errors import ConfigError

TINY = ["+exp=quickstart", "workload.num_prompts=1", "tracking=disabled"]


@pytest.mark.parametrize(("args", "fragment"), [
    (["hydra/launcher=slurm"], "hydra/launcher=slurm launches the jobs of a sweep: add -m"),
    (["-m", "hydra/launcher=submitit_slurm"], "use hydra/launcher=slurm"),
    (["-m", "hydra/launcher=submitit_local"], "use hydra/launcher=local"),
    (["-m", "hydra/launcher=slurmm"], "unknown launcher 'slurmm': choose slurm"),
    (["-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_tsk=2"], "hydra.launcher.cpus_per_tsk"),
])
def test_a_launcher_that_cannot_run_the_sweep_is_refused(cluster_extra, args, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        launch.plan_run(["run", *TINY, *args])


def test_slurm_without_sbatch_is_refused_and_local_is_offered(cluster_extra, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="needs Slurm's sbatch on PATH.*hydra/launcher=local"):
        launch.plan_run(["run", "-m", *TINY, "hydra/launcher=slurm"])


def test_the_cli_refuses_in_one_line_and_creates_nothing(cluster_extra, tmp_path):
    runs = tmp_path / "runs"
    proc = run_cli(["run", *TINY, "hydra/launcher=local"], cli_env(runs))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [("specexp: error: hydra/launcher=local launches the jobs of a sweep:"
                                                 " add -m (a single run runs here)")]
    assert not runs.exists()


def test_sacct_and_squeue_lines_give_each_jobs_state_without_its_steps():
    sacct = "41_0|COMPLETED\n41_0.batch|COMPLETED\n41_1|CANCELLED by 0\n41_1.0|CANCELLED\n42|TIMEOUT\n"
    assert slurm._parse_table(sacct) == {"41_0": "COMPLETED", "41_1": "CANCELLED", "42": "TIMEOUT"}
    assert slurm._parse_table("43_2|RUNNING\n43_[3-5%2]|PENDING\n") == {"43_2": "RUNNING", "43_[3-5%2]": "PENDING"}


@pytest.mark.parametrize(("state", "status"), [
    *((s, "interrupted") for s in ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL")),
    *((s, "failed") for s in ("FAILED", "OUT_OF_MEMORY", "COMPLETED", None)),
])
def test_a_job_slurm_stopped_is_interrupted_any_other_without_a_record_failed(state, status):
    assert slurm.status_for(state) == status


def test_a_job_knows_its_slurm_job_from_its_environment():
    environ = {"SLURM_JOB_ID": "57", "SLURM_ARRAY_JOB_ID": "55", "SLURM_ARRAY_TASK_ID": "2", "SLURMD_NODENAME": "gpu7"}
    facts = slurm.job_facts(environ)
    assert (facts["job_id"], facts["array_job_id"], facts["array_task_id"], facts["node"]) == ("57", "55", "2", "gpu7")
    assert facts["partition"] is None
    assert slurm.job_facts({"PATH": "/bin"}) is None
