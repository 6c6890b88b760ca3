"""One sweep job in its own cluster process (a Slurm job on a compute node, or a submitit job process here).

submitit starts the process, unpickles the launcher and calls it with the job's overrides and number;
:func:`run_job_here` composes the job's config as Hydra's sweep would, then runs Hydra's ``run_job`` with
specexp's task into ``SWEEP_DIR/<job number>``, where the task calls :func:`specexp.experiment.execute` in
this process (it is the job's own: ``SWEEP.own_process``). The record is a local sweep job's, plus the Slurm
job's facts in ``env.slurm``.

Signals: SIGINT and SIGTERM wait while torch is imported (an import a signal cuts short can crash the
interpreter). submitit ignores SIGTERM in a job (it waits for the signal it asks Slurm to send before a time limit,
``SIGUSR2``, to requeue checkpointable jobs). Here SIGINT and SIGTERM stop the job instead, as in a local run
(:mod:`specexp.interrupts`): Slurm sends SIGTERM when a job is cancelled (``scancel``), reaches its time limit
or is preempted, and waits ``KillWait`` seconds (30 by default) before SIGKILL; the job records itself
``interrupted`` within seconds. ``SIGUSR2`` is ignored: nothing is requeued, a resume runs the job again.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from specexp import experiment, interrupts


def job_config(launcher, sweep_overrides: list[str], job_num: int):
    """The composed config (Hydra's, with its ``hydra`` node) of job ``job_num`` of ``launcher``'s sweep."""
    from omegaconf import open_dict

    config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(sweep_overrides))
    with open_dict(config.hydra.job):
        config.hydra.job.num = job_num
    return config


def plain_config(config) -> dict:
    """A composed job config as the plain dict :func:`specexp.experiment.execute` takes (no ``hydra`` node)."""
    from omegaconf import OmegaConf

    job = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    return OmegaConf.to_container(job, resolve=True)


def job_context(config, sweep_dir: Path, job_num: int) -> experiment.RunContext:
    """The :class:`specexp.experiment.RunContext` of job ``job_num``: its directory ``SWEEP_DIR/<num>``."""
    return experiment.RunContext(run_dir=Path(sweep_dir) / str(job_num), experiment=str(config.get("name", "run")),
                                 sweep_dir=Path(sweep_dir), job_num=job_num)


def _record_interruption(config, job_num: int, signum: int) -> None:
    """A job stopped before it could record itself (while it was starting): write its ``interrupted`` record
    if Hydra had made its directory."""
    from specexp.job_process import ensure_record

    ctx = job_context(config, Path(str(config.hydra.sweep.dir)).absolute(), job_num)
    if ctx.run_dir.is_dir():
        ensure_record(plain_config(config), ctx, None, interrupted_by=signum)


def run_job_here(launcher, sweep_overrides: list[str], job_num: int, singleton_state: dict):
    """Run job ``job_num`` of ``launcher``'s sweep in this process (see the module docstring); returns
    Hydra's ``JobReturn``, whose value is the job's status (``ok``, ``failed``, ``interrupted``)."""
    import submitit
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
    from omegaconf import open_dict

    interrupts.install()
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    config = None
    try:
        with interrupts.signals_blocked():  # a signal arriving now waits until torch is imported
            import torch  # noqa: F401 - an import cut short by a signal can crash the interpreter at exit
        Singleton.set_state(singleton_state)
        setup_globals()
        config = job_config(launcher, sweep_overrides, job_num)
        with open_dict(config.hydra.job):
            config.hydra.job.id = submitit.JobEnvironment().job_id
        experiment.SWEEP.reset(own_process=True)
        return run_job(hydra_context=launcher.hydra_context, task_function=launcher.task_function, config=config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except interrupts.RunInterrupted as e:
        if config is not None:
            with interrupts.deferred():
                _record_interruption(config, job_num, e.signum)
        print(f"specexp: job {job_num} interrupted by {experiment.signal_name(e.signum)}", file=sys.stderr,
              flush=True)
        return JobReturn(overrides=list(sweep_overrides), status=JobStatus.COMPLETED, _return_value="interrupted")
