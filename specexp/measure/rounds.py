"""In what order a sweep measures its jobs' repeats, and when it can interleave them.

A sweep whose jobs each run several repeats (``measure.repeats``) measures them **in rounds** when it can:
every job's process starts, loads its models, builds its engine and serves its warm-up requests, one job
after another, and then waits; round r then runs repeat r of job 0, job 1, ..., in job order, one at a time
(:func:`interleaved_order`: A B C A B C ...). Drift of the machine over the sweep (a clock that slows, a
neighbour that starts) then lands on every point alike instead of on the last points. Each engine is built
once; between its repeats it sits idle while the other jobs measure. After the last round the jobs write
their records one after another, in job order.

A sweep that runs several jobs at once on separate GPUs (device slots, :mod:`specexp.device_slots`) does not
interleave: each job runs its repeats back to back while the others run beside it, and its record lists the
jobs that overlapped it (:mod:`specexp.measure.overlap`). Limiting the sweep to one GPU (``sweep.devices=0``)
brings the rounds back.

What is *not* interleaved: model loading, engine building (CUDA-graph capture) and warm-up run job by job
before the first round, and a job's requests within one repeat are served as usual. Interleaving keeps every
job's process (its models, caches and graphs) resident until the sweep ends, so :func:`interleave_decision`
allows it only where that is safe: see its docstring. Otherwise each job runs its repeats back to back
(A A A B B B ...), and its record says why.
"""

from __future__ import annotations

from collections.abc import Sequence

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
INTERLEAVED, BACK_TO_BACK = "interleaved", "back_to_back"


def interleaved_order(repeats_per_job: Sequence[int]) -> list[tuple[int, int]]:
    """``(job index, repeat)`` in the order a sweep measures them: round r holds repeat r of every job that
    has more than r repeats, in job order. ``[2, 3]`` -> ``(0,0) (1,0) (0,1) (1,1) (1,2)``."""
    rounds = max(repeats_per_job, default=0)
    return [(job, r) for r in range(rounds) for job, n in enumerate(repeats_per_job) if r < n]


def interleave_decision(configs: Sequence[dict], launcher: str | None,
                        parallel_jobs: int = 1) -> tuple[bool, str]:
    """(interleave?, why) for a sweep of the resolved job ``configs`` run by the Hydra ``launcher``
    (its ``_target_``), ``parallel_jobs`` at a time (its device slots, :mod:`specexp.device_slots`). It
    interleaves only when all hold: at least two jobs to run; one job at a time (rounds keep every job
    resident, so jobs spread over several GPUs would need every job on a GPU of its own at once); every job sets
    ``measure.interleave`` and more than one ``measure.repeats``; ``isolate_sweep_jobs`` (one process per job);
    Hydra's basic launcher (jobs one at a time on this machine; a cluster launcher runs them elsewhere); and no
    job on backend ``vllm`` (which reserves a fixed share of the GPU, so two resident jobs cannot fit)."""
    if len(configs) < 2:
        return False, "a single job"
    if parallel_jobs > 1:
        return False, (f"the sweep ran up to {parallel_jobs} jobs at once on separate GPUs: each job's repeats ran"
                       " back to back (sweep.devices=<one GPU> measures in rounds)")
    measure = [c.get("measure") or {} for c in configs]
    if not all(m.get("interleave", True) for m in measure):
        return False, "measure.interleave=false"
    if not all((m.get("repeats") or 1) > 1 for m in measure):
        return False, "one repeat per job (measure.repeats=1): nothing to interleave"
    if not all(c.get("isolate_sweep_jobs", True) for c in configs):
        return False, "isolate_sweep_jobs=false runs the jobs in one process"
    if launcher is not None and launcher != BASIC_LAUNCHER:
        return False, f"the launcher {launcher.rsplit('.', 1)[-1]} runs jobs apart"
    if any((c.get("backend") or {}).get("name") == "vllm" for c in configs):
        return False, "backend vllm reserves a share of the GPU: its jobs cannot stay resident together"
    return True, "the sweep's jobs ran their repeats in rounds"
