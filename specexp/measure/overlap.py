"""Which other jobs of a sweep ran on this host at the same time as a job, and for how long (pure).

A sweep that runs jobs in parallel (:mod:`specexp.sweep_slots`) keeps every job's span on the host, from its
process's start to its end (``None`` while it runs), in the sweep's ``sweep.json``. A job, when its
measurement is over, compares the spans of the others with its own (:func:`concurrent_jobs`):
``overlap_s`` with its run so far (process start to now) and ``measured_overlap_s`` with the window its
repeats were measured in. A job that shared the host while this one measured disturbs its timings (the GPUs
differ, but the CPUs, memory bandwidth, PCIe and power budget are shared): the noise guard marks them
(:mod:`specexp.measure.guards`).

Times are seconds since the epoch (``time.time()``) on this host.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence


def overlap_s(a_start: float, a_end: float, b_start: float, b_end: float) -> float:
    """Seconds the intervals ``[a_start, a_end]`` and ``[b_start, b_end]`` share (0 when apart)."""
    return max(0.0, min(a_end, b_end) - max(a_start, b_start))


def measured_window(repeats: Sequence[dict]) -> tuple[float, float] | None:
    """``(start, end)`` of a measurement's repeats (result.json's ``repeats``: ``started_at`` ISO local time,
    ``wall_s``): the first repeat's start to the last one's end; ``None`` without repeats."""
    if not repeats:
        return None
    start = dt.datetime.fromisoformat(repeats[0]["started_at"]).timestamp()
    last = repeats[-1]
    end = dt.datetime.fromisoformat(last["started_at"]).timestamp() + float(last["wall_s"])
    return start, end


def concurrent_jobs(own_job: int, spans: Sequence[dict], now_s: float,
                    measured: tuple[float, float] | None = None) -> list[dict]:
    """The jobs of ``spans`` (each ``{"job", "start_s", "end_s" (None: still running), "devices"}``) other than
    ``own_job`` that overlapped it: ``[{"job", "devices", "overlap_s", "measured_overlap_s"}]`` in job order.
    ``overlap_s``: with ``own_job``'s span up to ``now_s``; ``measured_overlap_s``: with ``measured`` (None
    without one). A job whose span does not meet ``own_job``'s is left out; so is everything when
    ``own_job`` has no span."""
    own = next((s for s in spans if s["job"] == own_job), None)
    if own is None:
        return []
    own_end = own["end_s"] if own.get("end_s") is not None else now_s
    out = []
    for span in sorted(spans, key=lambda s: s["job"]):
        if span["job"] == own_job:
            continue
        end = span["end_s"] if span.get("end_s") is not None else now_s
        shared = overlap_s(own["start_s"], own_end, span["start_s"], end)
        if shared <= 0:
            continue
        during = overlap_s(measured[0], measured[1], span["start_s"], end) if measured else None
        out.append({"job": span["job"], "devices": span.get("devices"), "overlap_s": round(shared, 3),
                    "measured_overlap_s": round(during, 3) if during is not None else None})
    return out


def disturbing(concurrent: Sequence[dict]) -> list[dict]:
    """The entries of :func:`concurrent_jobs` that ran while the job measured (any run time when the
    measured window is unknown)."""
    return [c for c in concurrent
            if (c["measured_overlap_s"] if c.get("measured_overlap_s") is not None else c["overlap_s"]) > 0]
