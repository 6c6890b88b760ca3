"""A local sweep that runs its jobs on device slots: as many jobs at once as there are slots, each job's process
shown only its slot's GPUs (which slots, and which job gets which: :mod:`specexp.device_slots`).

Hydra's basic launcher hands the jobs over one at a time (:meth:`SlotRunner.launch`): a job starts at once when
a slot is free, else the launch waits until a running job ends and frees one. Every job is still a fresh
process of its own (:func:`specexp.job_process.start_job_process`), with ``CUDA_VISIBLE_DEVICES`` set to its
slot's GPUs, writing the same record into ``SWEEP_DIR/<job>/`` in the sweep's W&B group. When more than one
job runs at a time, each job's console output goes to its ``console.log`` instead of the terminal, and the
sweep prints one line as each job starts and ends. After the launch, :meth:`SlotRunner.drain` waits for the
jobs still running.

A job that fails, dies or is stopped on its own frees its slot and the sweep goes on (the parent writes the
record of a job that could not, :func:`specexp.job_process.ensure_record`). An interruption of the sweep
(Ctrl-C, SIGTERM) stops every running job at once (:meth:`SlotRunner.stop`), each recorded ``interrupted``;
finished jobs keep their records. ``sweep.json`` (:mod:`specexp.sweep_timeline`) says where and when each job
ran; each job reads it to record which others overlapped it (:mod:`specexp.measure.overlap`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from specexp import interrupts
from specexp.device_slots import SlotPlan, SlotPool, env_for_slot
from specexp.job_process import ensure_record, start_job_process, stop_jobs
from specexp.sweep_timeline import SweepTimeline

POLL_S = 0.2  # how often running jobs are checked for an end: a slot is free again within this
CONSOLE_FILE = "console.log"


@dataclass
class RunningJob:
    """A job's process on its slot. ``output``: its console.log (None: it writes to the terminal)."""

    cfg: dict
    ctx: object
    proc: object
    slot: int
    start_s: float
    output: object = None


class SlotRunner:
    """Runs a sweep's jobs on the slots of ``plan`` (see the module docstring). ``keep``: job numbers a resume
    does not run (their entries of an earlier ``sweep.json`` stay); ``order_note``: why each job's repeats run
    back to back (kept in its record)."""

    def __init__(self, plan: SlotPlan, sweep_dir: Path, host: str, order_note: str | None = None, keep=()) -> None:
        self.plan, self.host, self.order_note = plan, host, order_note
        self.pool = SlotPool(len(plan.slots))
        self.timeline = SweepTimeline(sweep_dir, plan, host, keep)
        self.waiting: dict[int, tuple[dict, object]] = {}
        self.running: dict[int, RunningJob] = {}
        self.statuses: dict[int, str] = {}

    def announce(self) -> str:
        """The sweep's first line about its slots."""
        slots = ", ".join(self.plan.label(s) for s in range(len(self.plan.slots)))
        line = (f"sweep: {len(self.plan.slots)} device slot{'s' if self.plan.parallel else ''} ({slots}):"
                f" up to {len(self.plan.slots)} job{'s' if self.plan.parallel else ''} at once")
        if self.plan.idle:
            line += f"; GPU {','.join(map(str, self.plan.idle))} idle (slots of {self.plan.gpus_per_job})"
        if self.plan.fake:
            line += " (fake GPUs: SPECEXP_FAKE_GPUS)"
        return line

    def label(self, job: int) -> str | None:
        """``GPU 1`` / ``GPUs 2,3``: where ``job`` ran (None: it did not run here)."""
        return self.timeline.label(job)

    def launch(self, cfg: dict, ctx) -> str:
        """Start job ``ctx.job_num`` on a free slot, waiting for one to free if none is; returns ``pending``
        (it runs beside the others; its status is known at :meth:`drain`)."""
        self.waiting[ctx.job_num] = (cfg, ctx)
        self._start(self.pool.submit(ctx.job_num))
        while ctx.job_num in self.waiting:
            self._wait_for_an_end()
        return "pending"

    def drain(self) -> dict[int, str]:
        """Wait until every running job has ended; returns ``{job: status}`` of the jobs run here."""
        while self.running:
            self._wait_for_an_end()
        self.timeline.finish(time.time())
        return dict(self.statuses)

    def stop(self, signum: int) -> None:
        """Stop every running job together (forward ``signum``, then kill) and make sure each has a record."""
        jobs = list(self.running.items())
        stop_jobs([job.proc for _, job in jobs], signum)
        for num, job in jobs:
            self._close(job)
            self.statuses[num] = ensure_record(job.cfg, job.ctx, job.proc.returncode, interrupted_by=signum)
            self.timeline.ended(num, self.statuses[num], time.time())
            del self.running[num]
        self.waiting.clear()
        self.timeline.finish(time.time())

    def _start(self, assignments: list[tuple[int, int]]) -> None:
        for num, slot in assignments:
            cfg, ctx = self.waiting.pop(num)
            ctx.placement = {**self.plan.placement(slot), "host": self.host, "sweep_file": str(self.timeline.path)}
            output = None
            if self.plan.parallel:
                Path(ctx.run_dir).mkdir(parents=True, exist_ok=True)
                output = open(Path(ctx.run_dir) / CONSOLE_FILE, "a")  # noqa: SIM115 - closed when the job ends
            payload = {"config": cfg, "context": ctx.to_dict(), "order_note": self.order_note}
            with interrupts.deferred():  # a job started is always known to stop()
                try:
                    proc = start_job_process(payload, env=env_for_slot(self.plan, slot, os.environ), output=output)
                except BaseException:
                    if output is not None:
                        output.close()
                    raise
                start_s = time.time()
                self.running[num] = RunningJob(cfg, ctx, proc, slot, start_s, output)
                self.timeline.started(num, ctx.placement, proc.pid, start_s)
            if self.plan.parallel:
                print(f"sweep: job {num} started on {self.plan.label(slot)} ({len(self.running)} running,"
                      f" {len(self.pool.waiting)} waiting); its output: {Path(ctx.run_dir) / CONSOLE_FILE}",
                      flush=True)

    def _wait_for_an_end(self) -> None:
        """Block until one running job has ended, then record it and start what its slot frees."""
        while True:
            for num, job in list(self.running.items()):
                if job.proc.poll() is not None:
                    self._ended(num, job)
                    return
            time.sleep(POLL_S)

    def _ended(self, num: int, job: RunningJob) -> None:
        end_s = time.time()
        with interrupts.deferred():
            self._close(job)
            status = ensure_record(job.cfg, job.ctx, job.proc.returncode)
            self.statuses[num] = status
            self.timeline.ended(num, status, end_s)
            del self.running[num]
        if self.plan.parallel:
            print(f"sweep: job {num} {status} on {self.plan.label(job.slot)} after {end_s - job.start_s:.1f} s",
                  flush=True)
        self._start(self.pool.finish(num))

    @staticmethod
    def _close(job: RunningJob) -> None:
        if job.output is not None:
            with contextlib.suppress(OSError):
                job.output.close()
            job.output = None
