"""What Slurm says about a job: the facts a job finds in its environment, and a finished job's state.

A job's own process reads ``SLURM_*`` variables (:func:`job_facts`: job id, array task, node, partition,
account, GPUs). The sweep's main process asks Slurm for the state of a job it submitted (:func:`job_states`):
``sacct`` where the cluster keeps accounting, else ``squeue --states=all``, which knows a job until
``MinJobAge`` seconds after it ended. A state Slurm gives for a job it stopped (``CANCELLED``, ``TIMEOUT``,
``PREEMPTED``, ...) makes a job without an ``ok`` record ``interrupted`` (:data:`INTERRUPTED_STATES`).
"""

from __future__ import annotations

import os
import subprocess

# Slurm job states (squeue/sacct, without a "by UID" suffix) of a job Slurm has finished with.
INTERRUPTED_STATES = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "NODE_FAIL", "BOOT_FAIL")
FAILED_STATES = ("FAILED", "OUT_OF_MEMORY", "SPECIAL_EXIT")
FINAL_STATES = ("COMPLETED", *INTERRUPTED_STATES, *FAILED_STATES)
QUERY_TIMEOUT_S = 30.0

_FACTS = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "node": "SLURMD_NODENAME",
    "partition": "SLURM_JOB_PARTITION",
    "account": "SLURM_JOB_ACCOUNT",
    "qos": "SLURM_JOB_QOS",
    "gpus": "SLURM_JOB_GPUS",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
}


def job_facts(environ=None) -> dict | None:
    """The Slurm job this process runs in (``{job_id, array_job_id, array_task_id, node, partition, account,
    qos, gpus, cpus_on_node}``, a value None where Slurm did not set it), None outside a Slurm job."""
    environ = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in environ:
        return None
    return {key: environ.get(var) for key, var in _FACTS.items()}


def _base_state(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``."""
    return state.split()[0].rstrip("+") if state.strip() else ""


def _parse_table(text: str) -> dict[str, str]:
    """``{job id: state}`` from ``JOBID|STATE`` lines; job steps (``123.batch``) are left out."""
    states = {}
    for line in text.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id and "." not in job_id and state:
            states[job_id] = _base_state(state)
    return states


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def job_states(job_ids: list[str]) -> dict[str, str]:
    """Slurm's state of each of ``job_ids`` (``123`` or an array task ``123_4``) that Slurm still knows:
    ``PENDING``, ``RUNNING``, ``COMPLETED``, ``CANCELLED``, ``TIMEOUT``, ... ; an id it does not know is
    left out. Asks ``sacct`` first and ``squeue`` where the cluster has no accounting."""
    if not job_ids:
        return {}
    wanted = ",".join(sorted(set(job_ids)))
    for argv in (["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", wanted],
                 ["squeue", "-h", "--states=all", "-o", "%i|%T", "-j", wanted]):
        text = _run(argv)
        if text is not None:
            found = _parse_table(text)
            if found or argv[0] == "squeue":
                return {job_id: found[job_id] for job_id in job_ids if job_id in found}
    return {}


def status_for(state: str | None) -> str:
    """The record status of a job that left no record, from Slurm's final ``state``: ``interrupted`` when
    Slurm stopped it (cancelled, time limit, preemption, node failure), else ``failed``."""
    return "interrupted" if state in INTERRUPTED_STATES else "failed"
