"""A sweep that measures its jobs' repeats in rounds (the order and when it applies: :mod:`specexp.measure.rounds`).

The sweep's main process starts each job's process as Hydra launches it (:meth:`RoundsCoordinator.start`): the
job loads its models, builds its engine, serves its warm-up requests and then reports ``repeat 0`` on a pipe
and waits; only then does the next job start. When every job is waiting, :meth:`RoundsCoordinator.run` sends
``go <slot>`` to one job at a time in :func:`specexp.measure.rounds.interleaved_order` and waits for the job's
next report (``repeat <r+1>``, or ``finish`` after its last repeat) before the next one goes; ``slot`` is the
repeat's place in the sweep's order, kept in the job's record. Last, each job in turn is told to finish
(write its record, log W&B, print its summary) and exits.

A job that fails or dies leaves the rounds (its record says why, written by the parent if it could not); the
others go on. An interruption of the sweep stops every waiting job (:meth:`RoundsCoordinator.stop`), each
recorded ``interrupted``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass

from specexp.job_process import ensure_record, start_job_process, stop_jobs
from specexp.measure.rounds import interleaved_order

REPEAT, FINISH, GO = "repeat", "finish", "go"


class ChildPace:
    """The job's side of the pipe pair (:class:`specexp.measure.loop.Pace`): :meth:`wait` reports where the
    job is and blocks until the sweep says go."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = os.fdopen(read_fd, "r")
        self._out = os.fdopen(write_fd, "w")

    def wait(self, label: str) -> int | None:
        """Report ``label`` (``repeat <r>`` or ``finish``) and wait for ``go [slot]``; returns the slot."""
        self._out.write(label + "\n")
        self._out.flush()
        line = self._in.readline()
        if not line:
            raise RuntimeError("the sweep stopped pacing this job (its main process went away)")
        parts = line.split()
        return int(parts[1]) if len(parts) > 1 else None


@dataclass
class ResidentJob:
    """A job's process waiting between repeats. ``pending``: what it last reported (``None``: it exited)."""

    cfg: dict
    ctx: object
    proc: subprocess.Popen
    to_job: object
    from_job: object
    pending: str | None = None
    status: str | None = None

    @property
    def repeats(self) -> int:
        return int((self.cfg.get("measure") or {}).get("repeats") or 1)


class RoundsCoordinator:
    """Starts a sweep's jobs and paces their repeats in rounds (see the module docstring)."""

    def __init__(self, env: dict | None = None, placement: dict | None = None) -> None:
        self.jobs: list[ResidentJob] = []
        self.env, self.placement = env, placement  # a sweep on one device slot: every job's GPU

    def start(self, cfg: dict, ctx) -> str:
        """Start the job's process and wait until it is ready to measure (``pending``) or has ended (its
        status as recorded)."""
        to_job_r, to_job_w = os.pipe()
        from_job_r, from_job_w = os.pipe()
        if self.placement is not None:
            ctx.placement = dict(self.placement)
        payload = {"config": cfg, "context": ctx.to_dict(), "pace_fds": [to_job_r, from_job_w]}
        try:
            proc = start_job_process(payload, env=self.env, pass_fds=(to_job_r, from_job_w))
        finally:
            os.close(to_job_r)
            os.close(from_job_w)
        job = ResidentJob(cfg, ctx, proc, os.fdopen(to_job_w, "w"), os.fdopen(from_job_r, "r"))
        self.jobs.append(job)
        self._read(job)
        if job.pending is None:
            return self._ended(job)
        return "pending"

    def _read(self, job: ResidentJob) -> None:
        line = job.from_job.readline()
        job.pending = line.strip() or None

    def _send(self, job: ResidentJob, message: str) -> bool:
        try:
            job.to_job.write(message + "\n")
            job.to_job.flush()
        except (BrokenPipeError, OSError):
            job.pending = None
            return False
        return True

    def _ended(self, job: ResidentJob) -> str:
        job.pending = None
        returncode = job.proc.wait()
        for stream in (job.to_job, job.from_job):
            with contextlib.suppress(OSError):
                stream.close()
        job.status = ensure_record(job.cfg, job.ctx, returncode)
        return job.status

    def run(self) -> dict[int, str]:
        """Every round, then every job's finish; returns ``{job_num: status}``."""
        slot = 0
        for index, repeat in interleaved_order([job.repeats for job in self.jobs]):
            job = self.jobs[index]
            if job.pending != f"{REPEAT} {repeat}":
                continue  # it failed, or ended early
            print(f"sweep: job {job.ctx.job_num} repeat {repeat + 1}/{job.repeats} (slot {slot})", flush=True)
            if self._send(job, f"{GO} {slot}"):
                self._read(job)
            slot += 1
        for job in self.jobs:
            while job.pending is not None:  # "finish" (or a repeat the plan did not count: let it run)
                if not self._send(job, GO):
                    break
                self._read(job)
            if job.status is None:
                self._ended(job)
        return {job.ctx.job_num: job.status for job in self.jobs}

    def stop(self, signum: int) -> None:
        """Stop every job still running (forward ``signum``, then kill) and make sure each has a record."""
        running = [job for job in self.jobs if job.status is None]
        stop_jobs([job.proc for job in running], signum)
        for job in running:
            job.status = ensure_record(job.cfg, job.ctx, job.proc.returncode, interrupted_by=signum)
