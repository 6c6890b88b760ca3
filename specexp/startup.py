"""Where a run's start-up time goes, as ``metrics.startup_s`` in result.json (seconds, host wall clock).

- ``import``: from the process's start to the backend's start (interpreter, imports, config checks, prompt
  tokenization); None where the process's start time cannot be read (non-Linux).
- ``model_load``: building both models and loading their weights.
- ``engine_build``: the engine's construction: buffers, compiled ops, CUDA-graph capture (``graph_capture``
  of it, where graphs are captured; ``compile`` of that, each graph's first run before its capture, where kernels
  compile or load from Triton's and inductor's on-disk caches and are autotuned, or for a CPU its compile).
- ``warmup``: the warm-up request served before the measured run.
- ``total``: the sum of the parts that are known.
"""

from __future__ import annotations

import os
import time


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's start time against /proc/uptime); None
    where it cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    start_s = int(fields[19]) / ticks  # field 22 of stat, the 20th after the command name
    return max(uptime_s - start_s, 0.0)


class PhaseClock:
    """Times consecutive phases: ``lap(name)`` records the seconds since the previous lap (or creation)."""

    def __init__(self) -> None:
        self.phases_s: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> float:
        """Record phase ``name`` as ending now; returns its seconds."""
        now = time.perf_counter()
        self.phases_s[name] = now - self._last
        self._last = now
        return self.phases_s[name]


PARTS = ("graph_capture", "compile")  # seconds within engine_build, not added to the total


def startup_record(phases_s: dict[str, float], import_s: float | None, graph_capture_s: float | None = None,
                   compile_s: float | None = None) -> dict[str, float | None]:
    """``metrics.startup_s``: the backend's ``phases_s`` (model_load, engine_build, warmup) with ``import``
    before them, ``graph_capture`` (part of engine_build), ``compile`` (part of graph_capture) and ``total`` (the
    known phases summed)."""
    record: dict[str, float | None] = {"import": import_s, **phases_s}
    if graph_capture_s is not None:
        record["graph_capture"] = graph_capture_s
        if compile_s is not None:
            record["compile"] = compile_s
    record["total"] = sum(v for key, v in record.items() if v is not None and key not in PARTS)
    return record


def format_startup(startup_s: dict) -> str:
    """One line: ``import 2.1 s · model_load 0.3 s · engine_build 9.1 s · warmup 0.5 s = 12.0 s (graph capture
    8.9 s, of it compiling 6.0 s)``."""
    parts = [f"{key} {value:.1f} s" for key, value in startup_s.items()
             if key not in ("total", *PARTS) and value is not None]
    capture, compiling = startup_s.get("graph_capture"), startup_s.get("compile")
    tail = ""
    if capture:
        of_it = f", of it compiling {compiling:.1f} s" if compiling is not None else ""
        tail = f" (graph capture {capture:.1f} s{of_it})"
    return " · ".join(parts) + f" = {startup_s.get('total', 0.0):.1f} s" + tail
