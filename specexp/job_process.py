"""One sweep job in a fresh interpreter: nothing is inherited but its config, its context and ``sys.path``.

The parent (the sweep's main process) starts the job's interpreter in a process group of its own with SIGINT
and SIGTERM blocked (:func:`specexp.interrupts.signals_blocked`); the job installs its handlers, imports torch
(an import that a signal cuts short can crash the interpreter), then unblocks them, so a signal sent while it
starts waits instead of killing it or printing a traceback. When the parent is interrupted it forwards the
signal to the job's group, waits up to :data:`STOP_GRACE_S` for the job to record itself ``interrupted``, then
kills whatever of the group is left. If the job left no record (it died, or was killed), the parent writes one
(:func:`specexp.experiment.fallback_record`), so every job that got a directory has a result.json. On Linux
the job also asks to be sent SIGTERM if the parent dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specexp import interrupts

STOP_GRACE_S = 5.0
CHILD_CODE = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
               "from specexp.job_process import child_main; child_main()")
_PR_SET_PDEATHSIG = 1


def _signal_group(pid: int, signum: int) -> bool:
    """Send ``signum`` to the job's process group; False if none of it is left."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_jobs(procs: list[subprocess.Popen], signum: int, grace_s: float = STOP_GRACE_S) -> None:
    """Stop jobs' processes together: forward ``signum`` to each one's group (again every half second, in
    case one had not installed its handlers), wait up to ``grace_s`` for them to record themselves and exit,
    then SIGKILL the groups left."""
    deadline = time.monotonic() + grace_s
    live = [p for p in procs if p.poll() is None]
    while live and time.monotonic() < deadline:
        live = [p for p in live if p.poll() is None and _signal_group(p.pid, signum)]
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=min(0.5 / len(live), max(deadline - time.monotonic(), 0.01)))
        live = [p for p in live if p.poll() is None]
    for proc in procs:
        _signal_group(proc.pid, signal.SIGKILL)  # the job, if it is still there, and anything it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def stop_job(proc: subprocess.Popen, signum: int, grace_s: float = STOP_GRACE_S) -> None:
    """Stop one job's process (:func:`stop_jobs`)."""
    stop_jobs([proc], signum, grace_s)


def start_job_process(payload: dict, env: dict | None = None, output=None, pass_fds=()) -> subprocess.Popen:
    """A job's fresh interpreter, in a process group of its own, fed ``payload`` (JSON) on stdin. ``env``: its
    environment (default: this one's); ``output``: a file its stdout and stderr go to (default: this
    process's). Signals wait while it starts (:func:`specexp.interrupts.signals_blocked`); an interruption
    that arrives before it is handed back stops it (:func:`stop_job`) and is re-raised."""
    text = json.dumps(payload, default=str)
    streams = {"stdout": output, "stderr": subprocess.STDOUT} if output is not None else {}
    proc = None
    try:
        with interrupts.signals_blocked():
            proc = subprocess.Popen([sys.executable, "-c", CHILD_CODE, json.dumps(sys.path)], stdin=subprocess.PIPE,
                                    text=True, process_group=0, env=env, pass_fds=tuple(pass_fds), **streams)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(text)
            proc.stdin.close()
    except interrupts.RunInterrupted as e:
        if proc is not None:
            stop_job(proc, e.signum)
        raise
    return proc


def run_in_fresh_process(cfg: dict, ctx, order_note: str | None = None) -> str:
    """:func:`specexp.experiment.execute` of ``cfg`` in a new interpreter; returns the job's status as its
    result.json records it (written by the parent when the job could not). An interruption of the parent
    (:class:`specexp.interrupts.RunInterrupted`) stops the job (:func:`stop_job`), makes sure it is recorded,
    and is re-raised. ``order_note``: why the job's repeats run back to back (kept in its record)."""
    payload = {"config": cfg, "context": ctx.to_dict(), "order_note": order_note}
    return _run_jobs_process(payload, [(cfg, ctx)])[0]


def run_group_in_fresh_process(jobs: list[tuple[dict, object]], order_note: str | None) -> list[str]:
    """Jobs ``(cfg, ctx)`` that share one engine (:mod:`specexp.sweep_groups`), one after another in one new
    interpreter; returns each job's status as its result.json records it (the parent writes the record of every
    job the process left without one). An interruption stops the process, records the jobs and is re-raised."""
    payload = {"group": [{"config": cfg, "context": ctx.to_dict()} for cfg, ctx in jobs], "order_note": order_note}
    return _run_jobs_process(payload, jobs)


def _run_jobs_process(payload: dict, jobs: list[tuple[dict, object]]) -> list[str]:
    """Start one job process on ``payload``, wait for it, and return the status of each of ``jobs`` (``(cfg,
    ctx)``) as recorded (:func:`ensure_record`); on an interruption stop it, record the jobs and re-raise."""
    proc = None
    try:
        proc = start_job_process(payload)
        returncode = proc.wait()
    except interrupts.RunInterrupted as e:
        if proc is not None:
            stop_job(proc, e.signum)
        for cfg, ctx in jobs:
            ensure_record(cfg, ctx, proc.returncode if proc is not None else None, interrupted_by=e.signum)
        raise
    return [ensure_record(cfg, ctx, returncode) for cfg, ctx in jobs]


def _reason(returncode: int | None) -> str:
    from specexp.experiment import signal_name

    if returncode is None:
        return "the job's process did not exit"
    if returncode < 0:
        killed = signal_name(-returncode)
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"the job's process was killed by {killed}{hint} before it wrote its record"
    return f"the job's process exited with status {returncode} before it wrote its record"


def ensure_record(cfg: dict, ctx, returncode: int | None, interrupted_by: int | None = None) -> str:
    """The status in the job's result.json, writing a complete ``failed``/``interrupted`` record first if the
    job left none (its result.json of an earlier attempt was moved aside before it started)."""
    from specexp.experiment import fallback_record, signal_name
    from specexp.tracking import records

    try:
        status = records.read_result(ctx.run_dir)["status"]
        if status in records.STATUSES:
            return status
    except (OSError, ValueError, KeyError):
        pass
    signum = interrupted_by
    if signum is None and returncode is not None and returncode in (interrupts.exit_status(s) for s in interrupts.HANDLED):
        signum = returncode - 128
    if signum is None and returncode is not None and -returncode in interrupts.HANDLED:
        signum = -returncode
    status, error = ("interrupted", f"interrupted by {signal_name(signum)}") if signum is not None else \
        ("failed", _reason(returncode))
    with interrupts.deferred():
        try:
            fallback_record(cfg, ctx, status, error)
        except OSError as e:
            print(f"specexp: error: cannot write {ctx.run_dir / records.RESULT_FILE} ({e.strerror or e})",
                  file=sys.stderr, flush=True)
    return status


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the parent (the sweep) dies, so no job outlives it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _log_to(run_dir: Path) -> None:
    """Log as Hydra's job logging does: INFO lines on stdout and appended to the job's specexp.log (only this
    job's: a group's earlier job's handlers go)."""
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    handlers = [logging.StreamHandler(sys.stdout)]
    with contextlib.suppress(OSError):
        handlers.append(logging.FileHandler(run_dir / "specexp.log"))
    for handler in handlers:
        handler.setFormatter(fmt)
        root.addHandler(handler)


def child_main() -> None:
    """Entry point of a job's process: read ``{"config", "context"}`` (JSON; ``pace_fds`` for a sweep measuring
    in rounds, ``order_note``) from stdin, run, exit with the run's status (:func:`specexp.experiment.exit_code`; 128 + the signal when interrupted)."""
    interrupts.install()
    _die_with_parent()
    import torch  # noqa: F401 - still blocked: an import a signal cuts short can crash the interpreter
    try:
        interrupts.unblock()  # a signal that waited is raised here
        try:
            payload = json.loads(sys.stdin.read())
        except ValueError:  # the parent went away before it sent the job
            sys.exit(1)
        from specexp.errors import ConfigError
        from specexp.experiment import EXIT_CONFIG, RunContext, execute, exit_code

        if "group" in payload:
            sys.exit(_run_group(payload["group"], payload.get("order_note"), payload.get("pace_fds")))
        ctx = RunContext(**payload["context"])
        _log_to(ctx.run_dir)
        try:
            pace = None
            if payload.get("pace_fds"):  # a sweep measuring in rounds (specexp.sweep_rounds)
                from specexp.sweep_rounds import ChildPace

                pace = ChildPace(*payload["pace_fds"])
            record = execute(payload["config"], ctx, pace=pace, order_note=payload.get("order_note"))
        except ConfigError as e:  # the run directory cannot be written: nowhere to record it
            print(f"specexp: error: {e}", file=sys.stderr, flush=True)
            sys.exit(EXIT_CONFIG)
    except interrupts.RunInterrupted as e:
        sys.exit(e.exit_status)
    sys.exit(exit_code(record))


def _run_group(jobs: list[dict], order_note: str | None, pace_fds: list[int] | None = None) -> int:
    """A group's jobs (``{"config", "context"}`` each) in this process, on one engine (:mod:`specexp.backends.reuse`):
    one after another, or, with ``pace_fds`` (a sweep measuring in rounds), each in a thread the sweep paces
    (:mod:`specexp.group_rounds`). Each job records itself, a failure included, and the others go on. Exit
    status 0 (each job's is in its record)."""
    from specexp.backends.reuse import pooled
    from specexp.errors import ConfigError
    from specexp.experiment import RunContext, execute
    from specexp.run_spec import build_run_spec

    contexts = [RunContext(**job["context"]) for job in jobs]
    specs = []
    for job, ctx in zip(jobs, contexts, strict=True):
        with contextlib.suppress(Exception):  # a job whose spec does not build fails on its own below
            specs.append(build_run_spec(job["config"], ctx))

    def run_job(index: int, pace=None) -> None:
        _log_to(contexts[index].run_dir)
        try:
            execute(jobs[index]["config"], contexts[index], pace=pace, order_note=order_note)
        except ConfigError as e:  # its directory cannot be written: the parent records it
            print(f"specexp: error: {e}", file=sys.stderr, flush=True)

    if pace_fds:
        from specexp.group_rounds import GroupPace, run_group_in_rounds

        group = GroupPace(*pace_fds, num_jobs=len(jobs), on_resume=lambda i: _log_to(contexts[i].run_dir))
        with pooled(specs, run_on_engine_thread=group.call):
            run_group_in_rounds(len(jobs), run_job, group)
    else:
        with pooled(specs):
            for index in range(len(jobs)):
                run_job(index)
    return 0
