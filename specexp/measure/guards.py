"""Noise guards: decide, from recorded readings only, whether a measurement's timings can be trusted.

Each decision is a pure function of values a run records (:mod:`specexp.measure.machine` readings and
per-repeat figures), so it can be checked on recorded values and re-made later from result.json:

- **machine busy** (:func:`machine_busy`): a 1-minute load average read before the first repeat or after any
  repeat above ``load_per_core`` × the CPU count: more runnable threads than cores, so something else
  competed for them (the run's own threads count too, and never exceed the cores torch uses).
- **repeats disagree** (:func:`disagreeing_figures`): a guarded figure (:data:`GUARDED_FIGURES`) whose
  relative standard deviation over the repeats exceeds ``max_relative_std``.
- **GPU shared** (:func:`other_gpu_processes`): compute processes on the run's GPU other than this one, its
  own children (vLLM's tensor-parallel workers) and its sibling sweep jobs.
- **jobs overlapped** (:func:`specexp.measure.overlap.disturbing`): in a sweep that runs jobs in parallel, other
  jobs of the sweep ran on this host while this one measured (:mod:`specexp.measure.overlap`).

:func:`noise_report` joins them into the record's ``metrics.noise``: ``flags`` (codes), ``figures`` (the
figures they mark: ``timing`` = every latency and throughput figure of the run) and ``warnings`` (one line
each, as printed).
"""

from __future__ import annotations

from collections.abc import Sequence

from specexp.measure.intervals import relative_std
from specexp.measure.overlap import disturbing

BUSY, DISAGREE, GPU_SHARED, OVERLAPPED = "machine_busy", "repeats_disagree", "gpu_shared", "jobs_overlapped"
ALL_TIMING = "timing"
GUARDED_FIGURES = ("output_tokens_per_s", "tpot_ms.p50", "e2e_ms.mean")


def machine_busy(load_samples: Sequence[float | None], cpu_count: int | None, load_per_core: float = 1.0) -> bool:
    """Whether any 1-minute load average of ``load_samples`` exceeds ``load_per_core`` × ``cpu_count``
    (False when the CPU count or every sample is unknown)."""
    known = [s for s in load_samples if s is not None]
    if not cpu_count or not known:
        return False
    return max(known) > load_per_core * cpu_count


def disagreeing_figures(per_repeat: dict[str, Sequence[float | None]], max_relative_std: float) -> dict[str, float]:
    """``{figure: relative std}`` of the figures whose per-repeat values spread more than ``max_relative_std``
    (std / mean); figures with fewer than two values never disagree."""
    spread = {name: relative_std(values) for name, values in per_repeat.items()}
    return {name: value for name, value in spread.items() if value is not None and value > max_relative_std}


def other_gpu_processes(gpu: dict | None, own_pid: int, siblings: Sequence[int] = ()) -> list[dict]:
    """The compute processes of a :func:`specexp.measure.machine.gpu_state` reading that are neither
    ``own_pid`` nor one of ``siblings``."""
    skip = {own_pid, *siblings}
    return [p for p in (gpu or {}).get("processes") or [] if p.get("pid") not in skip]


def _load_samples(machine: dict, repeats: list[dict]) -> list[float | None]:
    """The 1-minute load of the reading before the first repeat and after each repeat."""
    readings = [machine.get("before")] + [r.get("machine", {}).get("after") for r in repeats]
    return [(reading or {}).get("load_avg", [None])[0] if (reading or {}).get("load_avg") else None
            for reading in readings]


def noise_report(machine: dict, repeats: list[dict], per_repeat: dict[str, Sequence[float | None]],
                 load_per_core: float, max_relative_std: float, own_pid: int,
                 siblings: Sequence[int] = (), concurrent: Sequence[dict] = ()) -> dict:
    """``{"flags", "figures", "warnings"}`` of one measurement (see the module docstring). ``machine``:
    ``{"before": reading, "after": reading}``; ``repeats``: the per-repeat records (each with ``machine.after``);
    ``per_repeat``: the guarded figures' values, one per repeat; ``concurrent``: the other jobs of a parallel
    sweep that overlapped this one (:func:`specexp.measure.overlap.concurrent_jobs`)."""
    flags, figures, warnings = [], [], []
    loads = _load_samples(machine, repeats)
    cpus = (machine.get("before") or {}).get("cpu_count")
    if machine_busy(loads, cpus, load_per_core):
        flags.append(BUSY)
        figures.append(ALL_TIMING)
        peak = max(v for v in loads if v is not None)
        warnings.append(f"the machine was busy (1-min load {peak:.2f} > {load_per_core:g} x {cpus} cores):"
                        " this run's timings are marked noisy")
    spread = disagreeing_figures(per_repeat, max_relative_std)
    if spread:
        flags.append(DISAGREE)
        figures.extend(name for name in spread if name not in figures)
        named = ", ".join(f"{name} {value:.0%}" for name, value in spread.items())
        warnings.append(f"repeats disagree (relative std {named} > {max_relative_std:.0%}): those figures are"
                        " marked noisy")
    gpu_readings = [machine.get("before"), *(r.get("machine", {}).get("after") for r in repeats)]
    others = {p["pid"]: p for reading in gpu_readings
              for p in other_gpu_processes((reading or {}).get("gpu"), own_pid, siblings)}
    if others:
        flags.append(GPU_SHARED)
        if ALL_TIMING not in figures:
            figures.append(ALL_TIMING)
        warnings.append(f"other processes ran on the GPU (pids {', '.join(map(str, sorted(others)))}):"
                        " this run's timings are marked noisy")
    during = disturbing(concurrent)
    if during:
        flags.append(OVERLAPPED)
        if ALL_TIMING not in figures:
            figures.append(ALL_TIMING)
        named = ", ".join(f"{c['job']}: {_overlap_text(c)}" for c in during)
        warnings.append(f"other jobs of this sweep ran on this host while it measured (job{'s' if len(during) > 1 else ''}"
                        f" {named}): its timings are marked disturbed")
    return {"flags": flags, "figures": figures, "warnings": warnings}


def _overlap_text(entry: dict) -> str:
    seconds = entry["measured_overlap_s"] if entry.get("measured_overlap_s") is not None else entry["overlap_s"]
    return f"{seconds:.1f} s"


def is_marked(noise: dict | None, figure: str) -> bool:
    """Whether ``figure`` (``output_tokens_per_s``, ``tpot_ms.p50``, ...) is marked noisy in a record's
    ``metrics.noise``: named there, or every timing figure is."""
    marked = (noise or {}).get("figures") or []
    return ALL_TIMING in marked or figure in marked
