"""``SWEEP_DIR/sweep.json``: where and when each job of a sweep run on device slots ran (:mod:`specexp.sweep_slots`).

The sweep's main process rewrites it (atomically) whenever a job starts or ends, so a job can read, when its
measurement is over, which other jobs ran beside it (:func:`read_spans`, :mod:`specexp.measure.overlap`); at
the end of the sweep each job's entry gets its status and the jobs that overlapped its whole run. Layout::

    {"host", "gpus_per_job", "parallel", "fake_devices", "idle_devices",
     "slots": [{"slot", "devices", "cuda_visible_devices"}],
     "jobs": [{"job", "slot", "devices", "cuda_visible_devices", "pid", "start_s", "started_at",
               "end_s", "ended_at", "duration_s", "status", "concurrent": [{"job", "devices", "overlap_s"}]}]}

``devices`` are numbered as ``sweep.devices`` numbers them; ``*_s`` are seconds since the epoch on ``host``,
``*_at`` the same as local ISO times. A resume keeps the entries of the jobs it does not run again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path

from specexp.device_slots import SlotPlan
from specexp.measure.overlap import concurrent_jobs, measured_window

SWEEP_FILE = "sweep.json"


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t).isoformat(timespec="milliseconds")


def read_spans(sweep_file: str | Path) -> list[dict]:
    """The job entries of a ``sweep.json`` (``[]`` when it cannot be read)."""
    try:
        return list(json.loads(Path(sweep_file).read_text()).get("jobs") or [])
    except (OSError, ValueError, AttributeError):
        return []


def jobs_beside(placement: dict | None, job_num: int | None, repeats: list[dict]) -> list[dict] | None:
    """In a job's own process, when its ``repeats`` are measured: the other jobs of its sweep that overlapped it
    so far (:func:`specexp.measure.overlap.concurrent_jobs`, from the ``sweep.json`` its ``placement`` names);
    None for a job outside a sweep on device slots."""
    if not placement or not placement.get("sweep_file") or job_num is None:
        return None
    return concurrent_jobs(job_num, read_spans(placement["sweep_file"]), time.time(), measured_window(repeats))


class SweepTimeline:
    """The main process's side of ``sweep.json`` (see the module docstring). ``keep``: job numbers a resume
    leaves as they are (their entries of an earlier ``sweep.json`` are kept)."""

    def __init__(self, sweep_dir: Path, plan: SlotPlan, host: str, keep=()) -> None:
        self.path = Path(sweep_dir) / SWEEP_FILE
        kept = {s["job"]: s for s in read_spans(self.path) if s.get("job") in set(keep)}
        self.jobs: dict[int, dict] = dict(kept)
        self.header = {
            "host": host, "gpus_per_job": plan.gpus_per_job, "parallel": plan.parallel,
            "fake_devices": plan.fake, "idle_devices": list(plan.idle),
            "slots": [{"slot": s, "devices": list(devices), "cuda_visible_devices": plan.cuda_visible(s)}
                      for s, devices in enumerate(plan.slots)],
        }

    def started(self, job: int, placement: dict, pid: int, start_s: float) -> None:
        self.jobs[job] = {"job": job, "slot": placement["slot"], "devices": placement["devices"],
                          "cuda_visible_devices": placement["cuda_visible_devices"], "pid": pid,
                          "start_s": start_s, "started_at": _iso(start_s), "end_s": None, "ended_at": None,
                          "duration_s": None, "status": None}
        self.write()

    def ended(self, job: int, status: str, end_s: float) -> None:
        entry = self.jobs[job]
        entry.update(end_s=end_s, ended_at=_iso(end_s), duration_s=round(end_s - entry["start_s"], 3), status=status)
        self.write()

    def finish(self, now_s: float) -> None:
        """Give every job the jobs that overlapped its whole run, and write the file a last time."""
        spans = list(self.jobs.values())
        for entry in spans:
            entry["concurrent"] = [{k: c[k] for k in ("job", "devices", "overlap_s")}
                                   for c in concurrent_jobs(entry["job"], spans, now_s)]
        self.write()

    def label(self, job: int) -> str | None:
        """``GPU 1`` / ``GPUs 2,3`` for a job that ran, else None."""
        entry = self.jobs.get(job)
        if entry is None:
            return None
        devices = entry["devices"]
        return f"GPU{'s' if len(devices) > 1 else ''} {','.join(map(str, devices))}"

    def write(self) -> None:
        """Replace ``sweep.json`` atomically (a job reading it never sees half a file)."""
        body = {**self.header, "jobs": [self.jobs[j] for j in sorted(self.jobs)]}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".sweep-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f, indent=1)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
