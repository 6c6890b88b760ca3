"""A sweep that measures its jobs' repeats in rounds (the order and when it applies: :mod:`specexp.measure.rounds`).

The sweep's main process starts each job's process as Hydra launches it (:meth:`RoundsCoordinator.start`): the
job loads its models, builds its engine, serves its warm-up requests and then reports ``repeat 0`` on a pipe
and waits; only then does the next job start. When every job is waiting, :meth:`RoundsCoordinator.run` sends
``go <slot>`` to one job at a time in :func:`specexp.measure.rounds.interleaved_order` and waits for the job's
next report (``repeat <r+1>``, or ``finish`` after its last repeat) before the next one goes; ``slot`` is the
repeat's place in the sweep's order, kept in the job's record. Last, each job in turn is told to finish
(write its record, log W&B, print its summary) and exits.

Jobs that share one engine (:mod:`specexp.sweep_groups`) take part as members of one process
(:meth:`RoundsCoordinator.start_group`, :mod:`specexp.group_rounds`): the same reports and ``go``, each line naming
the member, so their repeats interleave with each other's and with the lone jobs'.

A job that fails or dies leaves the rounds (its record says why, written by the parent if it could not); the
others go on. An interruption of the sweep stops every waiting job (:meth:`RoundsCoordinator.stop`), each
recorded ``interrupted``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass

from specexp.group_rounds import ENDED, GO
from specexp.job_process import ensure_record, start_job_process, stop_jobs
from specexp.measure.rounds import interleaved_order

REPEAT, FINISH = "repeat", "finish"


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
class JobProcess:
    """A process of the sweep's rounds and its pipe pair: one job's, or a group's (jobs sharing one engine,
    :mod:`specexp.group_rounds`, whose lines name the job)."""

    proc: subprocess.Popen
    to_job: object
    from_job: object
    returncode: int | None = None
    gone: bool = False  # its end of the pipe closed: it exited, or is exiting

    def send(self, message: str) -> bool:
        try:
            self.to_job.write(message + "\n")
            self.to_job.flush()
        except (OSError, ValueError):  # a broken pipe, or one closed when the process was found gone
            return False
        return True

    def read(self) -> str | None:
        """The process's next line; None when it closed its end (it exited)."""
        try:
            line = self.from_job.readline()
        except (OSError, ValueError):  # ValueError: closed when another member found the process gone
            line = ""
        if not line:
            self.gone = True
        return line.strip() or None

    def wait(self) -> int | None:
        """Close the pipes and wait for the process to exit; its return code."""
        for stream in (self.to_job, self.from_job):
            with contextlib.suppress(OSError):
                stream.close()
        if self.returncode is None:
            self.returncode = self.proc.wait()
        return self.returncode


@dataclass
class ResidentJob:
    """A job waiting between repeats in its process (``index``: its place in a group's process, else None).
    ``pending``: what it last reported (``None``: it ended)."""

    cfg: dict
    ctx: object
    process: JobProcess
    index: int | None = None
    pending: str | None = None
    status: str | None = None

    @property
    def repeats(self) -> int:
        return int((self.cfg.get("measure") or {}).get("repeats") or 1)


def _processes(jobs: list[ResidentJob]) -> list[JobProcess]:
    """The distinct processes of `jobs` (a group's members share one), in first-seen order."""
    return list({id(job.process): job.process for job in jobs}.values())


class RoundsCoordinator:
    """Starts a sweep's jobs and paces their repeats in rounds (see the module docstring)."""

    def __init__(self, env: dict | None = None, placement: dict | None = None) -> None:
        self.jobs: list[ResidentJob] = []
        self.env, self.placement = env, placement  # a sweep on one device slot: every job's GPU

    def _start_process(self, payload: dict) -> JobProcess:
        to_job_r, to_job_w = os.pipe()
        from_job_r, from_job_w = os.pipe()
        try:
            proc = start_job_process({**payload, "pace_fds": [to_job_r, from_job_w]}, env=self.env,
                                     pass_fds=(to_job_r, from_job_w))
        finally:
            os.close(to_job_r)
            os.close(from_job_w)
        return JobProcess(proc, os.fdopen(to_job_w, "w"), os.fdopen(from_job_r, "r"))

    def start(self, cfg: dict, ctx) -> str:
        """Start the job's process and wait until it is ready to measure (``pending``) or has ended (its
        status as recorded)."""
        if self.placement is not None:
            ctx.placement = dict(self.placement)
        process = self._start_process({"config": cfg, "context": ctx.to_dict()})
        job = ResidentJob(cfg, ctx, process)
        self.jobs.append(job)
        self._read(job)
        if job.pending is None:
            return self._ended(job)
        return "pending"

    def start_group(self, jobs: list[tuple[dict, object]]) -> dict[int, str]:
        """Start one process for jobs ``(cfg, ctx)`` that share one engine (:mod:`specexp.group_rounds`); its
        jobs start in it one after another, each waiting to measure once it has warmed up. Returns
        ``{job_num: status}`` (``pending``, or as recorded for a job that ended)."""
        for _, ctx in jobs:
            if self.placement is not None:
                ctx.placement = dict(self.placement)
        process = self._start_process({"group": [{"config": cfg, "context": ctx.to_dict()} for cfg, ctx in jobs],
                                       "order_note": None})
        members = [ResidentJob(cfg, ctx, process, index=i) for i, (cfg, ctx) in enumerate(jobs)]
        self.jobs.extend(members)
        statuses = {}
        for job in members:
            self._read(job)
            statuses[job.ctx.job_num] = self._ended(job) if job.pending is None else "pending"
        return statuses

    def _members(self, process: JobProcess) -> list[ResidentJob]:
        return [job for job in self.jobs if job.process is process]

    def _read(self, job: ResidentJob) -> None:
        """The job's next report into ``pending`` (None: it ended). A group's line names its job: a line for
        another member (not expected: one job runs at a time) goes to that member."""
        while True:
            line = job.process.read()
            if line is None:  # the process exited: every member of it still running has ended
                for member in self._members(job.process):
                    member.pending = None
                return
            if job.index is None:
                job.pending = line
                return
            index, _, label = line.partition(" ")
            member = next((m for m in self._members(job.process) if m.index == int(index)), job)
            member.pending = None if label == ENDED else label
            if member is job:
                return

    def _send(self, job: ResidentJob, message: str) -> bool:
        if job.index is not None:
            message = f"{GO} {job.index}" + message[len(GO):]
        if not job.process.send(message):
            job.pending = None
            return False
        return True

    def _ended(self, job: ResidentJob) -> str:
        """Record the job's status (the parent writes the record of a job that left none). A group's member
        whose thread ended while its process goes on is judged by its record alone."""
        job.pending = None
        if job.index is None or job.process.gone or job.process.proc.poll() is not None:
            returncode = job.process.wait()
        else:
            returncode = 0
        job.status = ensure_record(job.cfg, job.ctx, returncode)
        return job.status

    def run(self) -> dict[int, str]:
        """Every round, then every job's finish; returns ``{job_num: status}``."""
        slot = 0
        self.jobs.sort(key=lambda job: job.ctx.job_num)  # a group's jobs were started after the lone ones
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
        for process in _processes(self.jobs):
            process.wait()
        return {job.ctx.job_num: job.status for job in self.jobs}

    def stop(self, signum: int) -> None:
        """Stop every job still running (forward ``signum``, then kill) and make sure each has a record."""
        running = [job for job in self.jobs if job.status is None]
        stop_jobs([p.proc for p in _processes(running)], signum)
        for job in running:
            job.status = ensure_record(job.cfg, job.ctx, job.process.proc.returncode, interrupted_by=signum)
