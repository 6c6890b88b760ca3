"""The sweep's main process on a cluster: submit the jobs, wait for them, make sure each is recorded.

:func:`launch` is what the launchers' ``launch`` does (``hydra_plugins/specexp_cluster``). Jobs a resume keeps
(``SWEEP.keep``: their record is ``ok``) are not submitted; the others are, each running
:func:`specexp.cluster.job.run_job_here` in a process of its own: on Slurm as one job array of at most
``array_parallelism`` tasks at once, locally one job at a time (timings stay clean, as in a local sweep).

While it waits, the main process polls for each job's result (submitit's result file) and asks Slurm every
:data:`STATE_POLL_S` seconds which jobs it has finished with, so a job that died without a result (killed,
node lost) ends the wait too. Interrupted itself (Ctrl-C, SIGTERM), it cancels the jobs still queued or
running, waits up to :data:`CANCEL_GRACE_S` for them to record themselves, and re-raises. Then, per job:
submitit's logs are copied into the job's directory (``submitit.out``, ``submitit.err``); a job directory
left without a result.json gets one (``interrupted`` when Slurm stopped the job, else ``failed``); a record
that is not ``ok`` gets ``slurm_state`` (Slurm's final state of the job) and, in its error, the job id and state.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specexp import experiment, interrupts
from specexp.cluster import slurm
from specexp.tracking import records

log = logging.getLogger("specexp")
RESULT_POLL_S = 1.0
STATE_POLL_S = 5.0
CANCEL_GRACE_S = 60.0
FINAL_STATE_WAIT_S = 60.0
LOG_FILES = {"stdout": "submitit.out", "stderr": "submitit.err"}


@dataclass
class SubmittedJob:
    """One sweep job handed to submitit: its number, overrides, directory and submitit's job handle."""

    num: int
    overrides: list[str]
    job_dir: Path
    handle: object = None

    @property
    def cluster_id(self) -> str | None:
        return None if self.handle is None else str(self.handle.job_id)


def make_executor(kind: str, params: dict):
    """A submitit executor (``kind``: ``slurm`` or ``local``) from the launcher's config ``params`` (the
    ``hydra.launcher`` keys: ``submitit_folder``, ``timeout_min``, ``cpus_per_task``, ``partition``, ...)."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    init = {"folder": params["submitit_folder"]}
    if "max_num_timeout" in params:
        init[f"{kind}_max_num_timeout"] = params["max_num_timeout"]
    executor = submitit.AutoExecutor(cluster=kind, **init)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{key if key in shared else f"{kind}_{key}": value for key, value in params.items()
                                  if key not in ("submitit_folder", "max_num_timeout")})
    return executor


def _finished(job: SubmittedJob, kind: str, slurm_states: dict[str, str]) -> bool:
    if job.handle is None or job.handle.paths.result_pickle.exists():
        return True
    if kind == "local":
        return job.handle.done()  # its process has exited
    return slurm_states.get(job.cluster_id) in slurm.FINAL_STATES


def _wait(jobs: list[SubmittedJob], kind: str, deadline: float | None = None) -> list[SubmittedJob]:
    """Until every job has a result or Slurm has finished with it, or until ``deadline`` (monotonic
    seconds); returns the jobs still unfinished."""
    states: dict[str, str] = {}
    next_state_poll = time.monotonic() + STATE_POLL_S
    while True:
        unfinished = [job for job in jobs if not _finished(job, kind, states)]
        if not unfinished or (deadline is not None and time.monotonic() >= deadline):
            return unfinished
        time.sleep(RESULT_POLL_S)
        if kind == "slurm" and time.monotonic() >= next_state_poll:
            states = slurm.job_states([job.cluster_id for job in unfinished])
            next_state_poll = time.monotonic() + STATE_POLL_S


def final_states(jobs: list[SubmittedJob], timeout_s: float = FINAL_STATE_WAIT_S) -> dict[str, str]:
    """Slurm's state of each of ``jobs``, waiting up to ``timeout_s`` while any is still ending
    (``COMPLETING``, or ``RUNNING`` just after its result was written)."""
    ids = [job.cluster_id for job in jobs if job.cluster_id]
    deadline = time.monotonic() + timeout_s
    while True:
        states = slurm.job_states(ids)
        if all(states.get(i, "COMPLETED") in slurm.FINAL_STATES for i in ids) or time.monotonic() >= deadline:
            return states
        time.sleep(RESULT_POLL_S)


def _refusal(e: Exception) -> str:
    """The line that says why a submission was refused (sbatch's last error line, or the exception's)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [type(e).__name__])[-1]


def _submit_slurm(executor, job_fn, jobs: list[SubmittedJob], args) -> None:
    """Submit ``jobs`` as one job array; a refused submission (a bad partition, account, QOS, ...) is one
    error line and leaves the jobs not run."""
    try:
        handles = executor.map_array(job_fn, *zip(*args))
    except Exception as e:  # noqa: BLE001 - sbatch's refusal, whatever submitit wraps it in
        print(f"specexp: error: Slurm refused the sweep's jobs ({_refusal(e)}): check hydra.launcher.partition,"
              " .account, .qos and the resources asked for (docs/cluster.md)", file=sys.stderr, flush=True)
        return
    for job, handle in zip(jobs, handles):
        job.handle = handle
    array_id = str(handles[0].job_id).split("_")[0]
    log.info("submitted %d job(s) to Slurm: %s (squeue -j %s; submitit's files: %s)", len(jobs), array_id,
             array_id, handles[0].paths.folder.parent)


def _run_local_one_at_a_time(executor, job_fn, jobs: list[SubmittedJob], args) -> None:
    for job, job_args in zip(jobs, args):
        job.handle = executor.submit(job_fn, *job_args)
        log.info("job %d: submitit job %s", job.num, job.cluster_id)
        _wait([job], "local")


def _cancel(jobs: list[SubmittedJob], kind: str) -> None:
    """Cancel the jobs still running or queued (Slurm: ``scancel``, which sends SIGTERM to a running job;
    locally SIGTERM to the job's controller, which forwards it) and give them :data:`CANCEL_GRACE_S` to
    record themselves."""
    import os
    import signal

    unfinished = [job for job in jobs if not _finished(job, kind, {})]
    for job in unfinished:
        with contextlib.suppress(Exception):
            if kind == "local":
                os.kill(int(job.cluster_id), signal.SIGTERM)  # a local job's id is its controller's pid
            else:
                job.handle.cancel(check=False)
    _wait(unfinished, kind, deadline=time.monotonic() + CANCEL_GRACE_S)


def _copy_logs(job: SubmittedJob) -> None:
    if job.handle is None or not job.job_dir.is_dir():
        return
    for attr, name in LOG_FILES.items():
        source = getattr(job.handle.paths, attr)
        with contextlib.suppress(OSError):
            if source.is_file():
                shutil.copyfile(source, job.job_dir / name)


def _note_slurm_state(job: SubmittedJob, record: dict, state: str | None) -> None:
    """Add Slurm's final state to a record that is not ``ok`` (rewritten in place)."""
    record["slurm_state"] = state
    where = f"Slurm job {job.cluster_id}: {state or 'state unknown'}"
    if where not in (record.get("error") or ""):
        record["error"] = f"{record.get('error') or record['status']} ({where})"
    records.write_result(job.job_dir, record)


def _read(job: SubmittedJob) -> dict | None:
    try:
        return records.read_result(job.job_dir)
    except (OSError, ValueError):
        return None


def _gather(launcher, job: SubmittedJob, kind: str, state: str | None, interrupted_by: int | None) -> str:
    """The job's status from its result.json, written first where the job left none (``interrupted`` when
    Slurm, or the sweep's own interruption ``interrupted_by``, stopped it, else ``failed``)."""
    from specexp.cluster.job import job_config, job_context, plain_config

    _copy_logs(job)
    record = _read(job)
    if record is None and job.job_dir.is_dir():
        config = job_config(launcher, job.overrides, job.num)
        ctx = job_context(config, job.job_dir.parent, job.num)
        if interrupted_by is not None:
            status, why = "interrupted", f"interrupted by {experiment.signal_name(interrupted_by)}"
        else:
            status = slurm.status_for(state) if kind == "slurm" else "failed"
            why = f"the job's process ended before it wrote its record (see {job.job_dir / LOG_FILES['stderr']})"
        record = experiment.fallback_record(plain_config(config), ctx, status, why)
        if status == "interrupted" and interrupted_by is None:
            record["interrupted_by"] = f"Slurm ({state})"
            records.write_result(job.job_dir, record)
    if record is None:
        return "not run"
    if kind == "slurm" and record["status"] != "ok":
        _note_slurm_state(job, record, state)
    return record["status"]


def launch(launcher, kind: str, job_overrides, initial_job_idx: int) -> list:
    """Run a batch of sweep jobs on ``kind`` (``slurm`` or ``local``) for ``launcher`` (a specexp submitit
    launcher: ``params``, ``config``, ``hydra_context``); returns one Hydra ``JobReturn`` per job, whose value
    is the job's status. Every job is entered in :data:`specexp.experiment.SWEEP` for the sweep's summary."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus

    sweep_dir = Path(str(launcher.config.hydra.sweep.dir)).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    statuses: dict[int, str] = {}
    jobs = []
    for i, overrides in enumerate(job_overrides):
        num, job_dir = initial_job_idx + i, sweep_dir / str(initial_job_idx + i)
        if num in experiment.SWEEP.keep:
            log.info("job %d: kept, its record is ok (%s)", num, job_dir)
            statuses[num] = "ok"
            continue
        if experiment.SWEEP.resuming:
            records.archive_previous(job_dir)
        jobs.append(SubmittedJob(num, list(overrides), job_dir))
    interrupted = None
    if jobs:
        executor = make_executor(kind, launcher.params)
        args = [(job.overrides, "hydra.sweep.dir", job.num, f"job_id_for_{job.num}", Singleton.get_state())
                for job in jobs]
        try:
            if kind == "slurm":
                _submit_slurm(executor, launcher, jobs, args)
                _wait(jobs, kind)
            else:
                _run_local_one_at_a_time(executor, launcher, jobs, args)
        except interrupts.RunInterrupted as e:
            interrupted = e
            with interrupts.deferred():
                _cancel([job for job in jobs if job.handle is not None], kind)
        with interrupts.deferred():
            not_ok = [job for job in jobs if (_read(job) or {}).get("status") != "ok"]
            final = final_states(not_ok) if kind == "slurm" else {}
            signum = interrupted.signum if interrupted is not None else None
            for job in jobs:
                statuses[job.num] = _gather(launcher, job, kind, final.get(job.cluster_id), signum)
    for num in sorted(statuses):
        if statuses[num] != "not run":
            experiment.SWEEP.jobs.append((num, str(sweep_dir / str(num)), statuses[num]))
    if interrupted is not None:
        raise interrupted
    return [JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED,
                      _return_value=statuses[initial_job_idx + i]) for i, overrides in enumerate(job_overrides)]
