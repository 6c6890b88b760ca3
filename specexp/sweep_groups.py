"""Sweep points that share one engine (`sweep.reuse_engine`, on by default): one process and one native engine
for each group of jobs that differ only in what the engine can change between runs.

Most of a small sweep's wall time is start-up: every job's process imports torch, loads the pair, builds the
engine and captures its graphs before it measures for a second. Jobs whose configs differ only in
``speculator.num_speculative_tokens``, ``speculator.synthetic_acceptance_rate``, ``engine.seed``, the
workload or the measurement settings (:func:`reuse_key`) form a group. Hydra still hands the jobs over one at a
time; a grouped job is only noted (:meth:`EngineGroups.start`) and the groups run after the launch
(:meth:`EngineGroups.run`), each in one fresh process (:func:`specexp.job_process.run_group_in_fresh_process`) that
runs its jobs one after another in job order. Each job still gets its own directory, result.json, outputs and
W&B run, with its own counters; the engine is built by the first and lent to the others
(:mod:`specexp.backends.reuse`). A job that fails records its error and the group goes on; a process that dies
leaves the parent to record every job it did not (:func:`specexp.job_process.ensure_record`).

In a sweep that measures in rounds (:mod:`specexp.sweep_rounds`), a group's process takes part in the rounds:
its jobs run in threads of that process, one at a time, paced by the sweep like lone jobs
(:mod:`specexp.group_rounds`), and the engine is switched back to a job before each of its repeats with its
counters, random state and start-up clock as it left them. Otherwise a group runs each job's repeats back to
back, and its records say so.

k = 0 joins its group: the engine, built with the draft for the group's other ks, runs it as an engine without
one would (the draft off, plain decoding's lookahead on: ``NativeEngine.use_static_depth``). A group of k = 0 jobs
alone builds no draft.

What is not grouped: other backends, ``isolate_sweep_jobs=false``, and sweeps that
run jobs at once on several device slots (their jobs stay one process each; on one slot the groups run after the
slot's other jobs).
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)

FREE_KEYS = {"speculator": ("num_speculative_tokens", "synthetic_acceptance_rate"), "engine": ("seed",)}
ENGINE_GROUPS = ("pair", "speculator", "short_conv", "engine", "sampling", "backend")


def reuse_key(config: dict) -> str | None:
    """What a job's engine is built from, less what one engine can change between runs (see the module
    docstring); None when the job does not share an engine."""
    if not (config.get("sweep") or {}).get("reuse_engine", True) or not config.get("isolate_sweep_jobs", True):
        return None
    if (config.get("backend") or {}).get("name", "native") != "native":
        return None
    key = {}
    for group in ENGINE_GROUPS:
        values = dict(config.get(group) or {})
        for free in FREE_KEYS.get(group, ()):
            values.pop(free, None)
        key[group] = values
    return json.dumps(key, sort_keys=True, default=str)


def plan_groups(configs: list[dict]) -> list[list[int]]:
    """Indices of the jobs that share an engine, one list per group of two or more, in job order."""
    groups: dict[str, list[int]] = {}
    for i, config in enumerate(configs):
        key = reuse_key(config)
        if key is not None:
            groups.setdefault(key, []).append(i)
    return [members for members in groups.values() if len(members) > 1]


def order_note(size: int) -> str:
    """Why a grouped job's repeats ran back to back (kept in its record)."""
    return f"the job shared one engine with {size - 1} other job(s) of the sweep: its repeats ran back to back"


class EngineGroups:
    """The sweep's groups (`groups`: sets of job numbers) and the jobs Hydra handed over for them."""

    def __init__(self, groups: list[set[int]]) -> None:
        self.groups = [set(g) for g in groups]
        self.pending: dict[int, tuple[dict, object]] = {}
        self.statuses: dict[int, str] = {}
        self._running = None

    def holds(self, job_num: int) -> bool:
        return any(job_num in g for g in self.groups)

    def start(self, plain: dict, ctx) -> str:
        """Note a grouped job; it runs with its group after the launch."""
        self.pending[ctx.job_num] = (plain, ctx)
        return "pending"

    def run(self) -> dict[int, str]:
        """Run every group's noted jobs, a group in one process; returns each job's status."""
        from specexp.job_process import run_group_in_fresh_process

        for jobs in self._take_noted(""):
            self._running = jobs
            statuses = run_group_in_fresh_process(jobs, order_note(len(jobs)))
            self._running = None
            self.statuses.update({ctx.job_num: s for (_, ctx), s in zip(jobs, statuses, strict=True)})
        return self.statuses

    def join_rounds(self, rounds) -> None:
        """Hand every group's noted jobs to a sweep measuring in rounds (a
        :class:`specexp.sweep_rounds.RoundsCoordinator`): each group starts in one process and its jobs' repeats
        interleave with the sweep's other jobs'."""
        for jobs in self._take_noted(", measured in rounds"):
            self.statuses.update(rounds.start_group(jobs))  # an interruption: the rounds record these jobs

    def _take_noted(self, how: str):
        """Each group's noted jobs ``(cfg, ctx)``, in job order, taken off the pending ones (groups with none
        noted skipped), each logged as sharing one engine (``how`` ends the line)."""
        for group in self.groups:
            jobs = [self.pending.pop(n) for n in sorted(group) if n in self.pending]
            if jobs:
                log.info("jobs %s share one engine in one process%s", ", ".join(str(ctx.job_num) for _, ctx in jobs),
                         how)
                yield jobs

    def stop(self, signum: int) -> None:
        """Record every noted job that did not run (a group that was running is recorded by its runner)."""
        from specexp.job_process import ensure_record

        for plain, ctx in self.pending.values():
            self.statuses[ctx.job_num] = ensure_record(plain, ctx, None, interrupted_by=signum)
        self.pending.clear()
