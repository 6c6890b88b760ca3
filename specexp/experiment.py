"""Run lifecycle: resolved config -> validate -> RunSpec -> warm-up + repeats on one backend server
(:mod:`specexp.measure`) -> run record (result.json, outputs.jsonl, steps.parquet, traces.parquet,
answers.jsonl) -> W&B -> summary table.

:func:`execute` is Hydra-free (a notebook can call it with a config from Hydra's compose API);
:func:`hydra_task` is the Hydra entry point. In a sweep (``-m``) every job runs in a fresh spawned process
(``isolate_sweep_jobs``, :mod:`specexp.job_process`) so GPU memory, CUDA-graph pools and peak-memory
counters never leak from one job into the next; a failed job writes its result.json and the sweep goes on.
SIGINT and SIGTERM stop a run or a sweep's job in flight within seconds, recorded ``interrupted``
(:mod:`specexp.interrupts`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import specexp
from specexp import interrupts
from specexp.errors import ConfigError
from specexp.run_spec import build_run_spec
from specexp.tracking import records

# Exit statuses (README, Troubleshooting): 0 ok; 1 a run (or a sweep job) failed after it started; 2 bad input,
# refused before anything ran; 128 + the signal when interrupted (130 SIGINT, 143 SIGTERM).
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130
log = logging.getLogger("specexp")


@dataclass
class RunContext:
    """Where a run lives. ``sweep_dir``/``job_num`` are set for sweep jobs (the W&B group is the sweep
    directory's name); ``choices`` (group -> option, Hydra's ``hydra.runtime.choices``) makes the key check
    exact for the options chosen (without it a key of any option of a group is accepted); ``placement``: the
    device slot a sweep on GPU slots gave the job (:meth:`specexp.device_slots.SlotPlan.placement`, plus
    ``host`` and ``sweep_file``, the sweep's ``sweep.json`` when its jobs may overlap)."""

    run_dir: Path
    experiment: str
    sweep_dir: Path | None = None
    job_num: int | None = None
    choices: dict[str, str | None] | None = None
    placement: dict | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.sweep_dir = Path(self.sweep_dir) if self.sweep_dir is not None else None

    def to_dict(self) -> dict:
        """JSON-ready fields (to hand the context to a job's own process)."""
        return {"run_dir": str(self.run_dir), "experiment": self.experiment, "job_num": self.job_num,
                "sweep_dir": str(self.sweep_dir) if self.sweep_dir is not None else None, "choices": self.choices,
                "placement": self.placement}


# ---------------------------------------------------------------------------------------------- record


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(specexp.__file__).parent, capture_output=True, text=True, check=False,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict:
    """Facts about where the run ran: python, torch, transformers, device, gpu, specexp version, git sha,
    host, process id, the GPUs this process was shown (``cuda_visible_devices``: ``CUDA_VISIBLE_DEVICES``, None
    when unset) and the Slurm job it ran in (``slurm``: :func:`specexp.cluster.slurm.job_facts`, None outside
    Slurm)."""
    from specexp.cluster.slurm import job_facts

    env = {
        "python": platform.python_version(),
        "specexp_version": specexp.__version__,
        "git_sha": _git_sha(),
        "device": device,
        "gpu": None,
        "hostname": platform.node(),
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "slurm": job_facts(),
    }
    for module in ("torch", "transformers"):
        mod = sys.modules.get(module)
        env[module] = getattr(mod, "__version__", None) if mod else None
    if env["torch"] is None:
        env["torch"] = _torch_version()
    return env


def _torch_version() -> str | None:
    try:
        import torch
    except Exception:  # noqa: BLE001 - e.g. an import that a Ctrl-C cut short: the record matters more
        return None
    return torch.__version__


def _write_outputs(run_dir: Path, result, spec) -> None:
    from specexp.tracking import spec_bench

    records.write_jsonl(run_dir / records.OUTPUTS_FILE, [r.to_row() for r in result.requests])
    records.write_steps(run_dir / records.STEPS_FILE, result.steps)
    if result.traces:  # one row per (request, step), where the backend sees its steps
        records.write_steps(run_dir / records.TRACES_FILE, result.traces)
    records.write_jsonl(run_dir / records.ANSWERS_FILE,
                        spec_bench.answers(result.requests, spec_bench.model_id(spec.config)))


def _error_line(e: BaseException) -> str:
    if isinstance(e, ConfigError):
        return str(e)
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def wandb_options(cfg: dict, ctx: RunContext) -> dict:
    """``wandb.init`` keywords of a run: sweep jobs share ``group`` (the sweep directory's name) and
    ``job_type`` is the experiment name."""
    wandb_cfg = (cfg.get("tracking") or {}).get("wandb") or {}
    return {
        "mode": wandb_cfg.get("mode", "offline"),
        "project": wandb_cfg.get("project", "specexp"),
        "entity": wandb_cfg.get("entity"),
        "group": wandb_cfg.get("group") or (ctx.sweep_dir.name if ctx.sweep_dir else None),
        "job_type": ctx.experiment,
        "name": ctx.run_dir.name if ctx.sweep_dir is None else f"{ctx.sweep_dir.name}/{ctx.run_dir.name}",
        "tags": list(wandb_cfg.get("tags") or []),
    }


def _track(record: dict) -> None:
    """Log the run to W&B. W&B is never required for a run to finish: when the record is complete a W&B
    failure (disk full, no service) is one warning line and the run still succeeds. result.json is rewritten
    only when the mode actually used differs (online fell back), and a failed rewrite is a warning too."""
    from specexp.tracking.wandb_run import log_run

    options = dict(record["wandb"])
    mode = options.pop("mode")
    try:
        used = log_run(record, Path(record["run_dir"]), mode, options)
    except Exception as e:  # noqa: BLE001 - W&B is never required for a run to finish
        print(f"specexp: warning: W&B logging failed ({_error_line(e)}); the run record is complete",
              file=sys.stderr, flush=True)
        used = "failed"
    if used != mode:
        record["wandb"]["mode"] = used
        try:
            records.write_result(Path(record["run_dir"]), record)
        except OSError as e:
            print(f"specexp: warning: could not note the W&B mode in result.json ({_error_line(e)});"
                  " the record written before is complete", file=sys.stderr, flush=True)


def _new_record(cfg: dict, ctx: RunContext, started: float) -> dict:
    placement = {"placement": dict(ctx.placement)} if ctx.placement is not None else {}
    return {
        "status": "failed",
        "error": None,
        "experiment": ctx.experiment,
        "run_dir": str(ctx.run_dir),
        "started_at": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "duration_s": None,
        "config": cfg,
        "env": {},
        "metrics": {},
        "wandb": wandb_options(cfg, ctx),
        **placement,
    }


def _interrupt_text(e: BaseException) -> str:
    if isinstance(e, interrupts.RunInterrupted):
        return f"interrupted by {signal_name(e.signum)}"
    return "interrupted (KeyboardInterrupt)"


def signal_name(signum: int) -> str:
    """``SIGINT``, ``SIGTERM``, ... for a signal number."""
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def fallback_record(cfg: dict, ctx: RunContext, status: str, error: str) -> dict:
    """Write and return a complete result.json for a run that could not write its own (its process died
    or was stopped before it could); ``status`` is ``failed`` or ``interrupted``."""
    record = _new_record(cfg, ctx, time.time())
    record.update(status=status, error=error, duration_s=0.0)
    if status == "interrupted":
        record["interrupted_by"] = error.removeprefix("interrupted by ")
    record["env"] = environment(str((cfg.get("engine") or {}).get("device")))
    if ctx.placement is not None:  # written by the sweep's process: the job's GPUs, not this process's
        record["env"]["cuda_visible_devices"] = ctx.placement.get("cuda_visible_devices")
    records.write_result(ctx.run_dir, record)
    return record


def _prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` if needed and prove it writable, before anything is loaded (one-line ConfigError)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        records.check_writable(run_dir)
    except OSError as e:
        raise ConfigError(f"cannot write the run directory {run_dir} ({e.strerror or type(e).__name__}):"
                          " set SPECEXP_RUNS_DIR (or hydra.run.dir) to a directory you can write") from None


def _announce(spec) -> None:
    """The run's first lines: which weights each model got, then any warning."""
    for role, model in (("target", spec.pair.target), ("draft", spec.pair.draft)):
        unused = " (unused at k = 0)" if role == "draft" and spec.speculator.num_speculative_tokens == 0 else ""
        log.info("%s %s: %s weights (%s)%s", role, model.source, model.weights, model.weights_note, unused)
    if spec.config.get("engine", {}).get("max_model_len") == "auto":
        log.info("engine.max_model_len=auto: %d tokens per request", spec.engine.max_model_len)
    for line in spec.warnings:
        print(f"specexp: warning: {line}", file=sys.stderr, flush=True)


def _finish_ok(record: dict, run_dir: Path, measured: dict, spec, started: float) -> None:
    """Write outputs and the ok record (a write that fails makes the run ``failed``). ``measured``: what
    :func:`specexp.measure.summary.summarize` made of the repeats, plus the first repeat's ``env``."""
    from specexp.result import RunResult

    result = RunResult(measured["requests"], measured["steps"], measured["metrics"], measured["env"],
                       measured["traces"])
    try:
        _write_outputs(run_dir, result, spec)
    except OSError as e:
        record["error"] = f"writing the run's outputs failed ({_error_line(e)})"
        record["error_type"] = "OSError"
    else:
        record["metrics"] = result.metrics
        record["status"] = "ok"
    record["measure"], record["repeats"] = measured["measure"], measured["repeats"]
    if measured.get("concurrent_jobs") is not None:
        record["concurrent_jobs"] = measured["concurrent_jobs"]
    record["env"] = {**environment(spec.engine.device), **result.env}
    record["duration_s"] = time.time() - started
    records.write_result(run_dir, record)


def _write_record(record: dict, run_dir: Path, cfg: dict, started: float) -> None:
    """The record of a run that did not finish; a record that cannot be written is one error line."""
    with interrupts.deferred():
        record["env"] = record["env"] or environment(str(cfg.get("engine", {}).get("device")))
        record["duration_s"] = time.time() - started
        try:
            records.write_result(run_dir, record)
        except OSError as e:
            print(f"specexp: error: cannot write {run_dir / records.RESULT_FILE} ({_error_line(e)})",
                  file=sys.stderr, flush=True)


def _related_pids(measurement, siblings: bool) -> list[int]:
    """Processes on this job's GPU that are its own (vLLM's engine core, tensor-parallel workers) or, with
    ``siblings``, other jobs of its sweep (:func:`specexp.measure.machine.related_gpu_pids`)."""
    from specexp.measure.machine import related_gpu_pids

    readings = [measurement.machine.get("before"), *(r["machine"]["after"] for r in measurement.repeats)]
    return related_gpu_pids(readings, os.getpid(), os.getppid() if siblings else None)


def measure_run(backend, spec, cfg: dict, progress, pace=None, order_note: str | None = None,
                sweep_job: bool = False, placement: dict | None = None, job_num: int | None = None) -> dict:
    """Warm-up and the repeats of ``spec`` on ``backend`` (:mod:`specexp.measure`), summarised for the record;
    each noise warning is printed as one line. ``placement``/``job_num``: a sweep job's device slot and
    number (the other jobs that overlapped it are read from the sweep's ``sweep.json``)."""
    from specexp.measure.loop import measure
    from specexp.measure.rounds import BACK_TO_BACK, INTERLEAVED
    from specexp.measure.settings import MeasureSettings
    from specexp.measure.summary import summarize
    from specexp.sweep_timeline import jobs_beside

    settings = MeasureSettings.from_config(cfg)
    measurement = measure(backend, spec, settings, progress, pace)
    order = INTERLEAVED if pace is not None else BACK_TO_BACK
    note = order_note or ("the sweep's jobs ran their repeats in rounds" if pace is not None else
                          "a sweep job run on its own: its repeats ran back to back" if sweep_job else
                          "a single run: its repeats ran back to back")
    concurrent = jobs_beside(placement, job_num, measurement.repeats)
    measured = summarize(measurement, settings, order, note, os.getpid(),
                         _related_pids(measurement, siblings=pace is not None), concurrent or ())
    measured["env"] = measurement.results[0].env
    measured["concurrent_jobs"] = concurrent
    for line in measured["metrics"]["noise"]["warnings"]:
        print(f"specexp: warning: {line}", file=sys.stderr, flush=True)
    return measured


def execute(cfg: dict, ctx: RunContext, pace=None, order_note: str | None = None) -> dict:
    """Run one experiment from the resolved config ``cfg`` (a plain dict) into ``ctx.run_dir``.

    Always writes result.json (status ``ok``/``failed``/``interrupted``); outputs.jsonl, steps.parquet and
    answers.jsonl only when the backend finished. Returns the result record. An interruption (Ctrl-C,
    SIGTERM: :class:`specexp.interrupts.RunInterrupted`) is recorded and then re-raised; one that arrives
    while a finished run's record is written waits until it is complete (the run stays ``ok``). Every other
    error is recorded and printed as one line on stderr. A directory that cannot be written is a ConfigError
    raised before anything else (there is nowhere to record it). The backend's engine is built once, warmed
    up and run ``measure.repeats`` times (:func:`measure_run`); ``pace`` and ``order_note`` come from a sweep
    that measures its jobs' repeats in rounds (:mod:`specexp.sweep_rounds`), or say why it does not.
    """
    from specexp.backends import get_backend
    from specexp.progress import console_progress
    from specexp.tracking.summary import format_summary

    run_dir = ctx.run_dir
    _prepare_run_dir(run_dir)
    started = time.time()
    record = _new_record(cfg, ctx, started)
    interrupted = None
    written = False
    try:
        spec = build_run_spec(cfg, ctx)
        record["weights"] = {"target": spec.pair.target.weights, "draft": spec.pair.draft.weights}
        record["max_model_len"] = spec.engine.max_model_len  # engine.max_model_len=auto resolved
        _announce(spec)
        backend = get_backend(spec.backend)
        log.info("starting backend %s: %s, k=%d, %d prompts", spec.backend, spec.pair.name,
                 spec.speculator.num_speculative_tokens, len(spec.prompts))
        with console_progress() as progress:
            measured = measure_run(backend, spec, cfg, progress, pace, order_note, ctx.sweep_dir is not None,
                                   ctx.placement, ctx.job_num)
        with interrupts.deferred():
            _finish_ok(record, run_dir, measured, spec, started)
            written = True
    except KeyboardInterrupt as e:
        interrupted = e
        if not written:
            record["status"], record["error"] = "interrupted", _interrupt_text(e)
            record["interrupted_by"] = signal_name(e.signum) if isinstance(e, interrupts.RunInterrupted) else "SIGINT"
    except Exception as e:  # noqa: BLE001 - every failure is recorded in result.json
        record["status"] = "failed"
        record["error"] = _error_line(e)
        record["error_type"] = "config" if isinstance(e, ConfigError) else type(e).__name__
        if not isinstance(e, ConfigError):
            with contextlib.suppress(OSError):
                (run_dir / "error.log").write_text(traceback.format_exc())
    if not written:
        _write_record(record, run_dir, cfg, started)
    if interrupted is not None:
        raise interrupted
    if record["status"] != "ok":
        print(f"specexp: error: {record['error']}", file=sys.stderr, flush=True)
    _track(record)
    if record["status"] == "ok":
        print(format_summary(record), flush=True)
    return record


def exit_code(record: dict) -> int:
    """Process exit status for a run record: 0 ok, 2 bad config, 128 + signal interrupted (130 SIGINT,
    143 SIGTERM), 1 other failures."""
    if record["status"] == "ok":
        return EXIT_OK
    if record["status"] == "interrupted":
        import signal

        by = record.get("interrupted_by") or "SIGINT"
        return interrupts.exit_status(getattr(signal, by, signal.SIGINT))
    return EXIT_CONFIG if record.get("error_type") == "config" else EXIT_FAILED


# ----------------------------------------------------------------------------------------------- hydra


@dataclass
class SweepState:
    """What the sweep this process drives has done. ``jobs``: ``(job_num, run_dir, status)`` of each job
    launched so far; ``keep``: job numbers a resume leaves as they are (their record is ``ok``);
    ``resuming``: a resume (a job that runs again first moves its old record aside); ``own_process``: this
    process is a job's own (a cluster job, :mod:`specexp.cluster`), so the job runs here, not in a fresh one."""

    jobs: list = dataclasses.field(default_factory=list)
    keep: set = dataclasses.field(default_factory=set)
    resuming: bool = False
    own_process: bool = False
    rounds: object = None  # a specexp.sweep_rounds.RoundsCoordinator when the sweep measures in rounds
    order_note: str | None = None  # else: why each job runs its repeats back to back
    slots: object = None  # a specexp.sweep_slots.SlotRunner when the sweep runs its jobs on device slots
    groups: object = None  # a specexp.sweep_groups.EngineGroups when jobs share engines

    def reset(self, keep=(), resuming: bool = False, own_process: bool = False, rounds=None,
              order_note: str | None = None, slots=None, groups=None) -> None:
        self.jobs.clear()
        self.keep, self.resuming, self.own_process = set(keep), resuming, own_process
        self.rounds, self.order_note, self.slots, self.groups = rounds, order_note, slots, groups

    def finish_groups(self) -> None:
        """Run the grouped jobs (after the launch) and put their statuses in place of ``pending``."""
        statuses = self.groups.run()
        self.jobs[:] = [(num, run_dir, statuses.get(num, status)) for num, run_dir, status in self.jobs]


SWEEP = SweepState()
SWEEP_JOBS = SWEEP.jobs  # (job_num, run_dir, status) of the sweep jobs this process launched


def _job_status(run_dir: Path) -> str:
    try:
        return records.read_result(run_dir)["status"]
    except (OSError, ValueError, KeyError):
        return "interrupted"


def run_sweep_job(plain: dict, ctx: RunContext) -> str:
    """One job of a sweep, in a fresh process unless ``isolate_sweep_jobs`` is false or this process is the
    job's own (``SWEEP.own_process``); returns its status (``pending`` for a job started to measure in rounds,
    :mod:`specexp.sweep_rounds`, or started on a device slot beside others, :mod:`specexp.sweep_slots`). A job
    a resume keeps is not run. An interruption is recorded in :data:`SWEEP` and re-raised."""
    from specexp.job_process import run_in_fresh_process

    if ctx.job_num in SWEEP.keep:
        log.info("job %d: kept, its record is ok (%s)", ctx.job_num, ctx.run_dir)
        SWEEP.jobs.append((ctx.job_num, str(ctx.run_dir), "ok"))
        return "ok"
    if SWEEP.resuming:
        records.archive_previous(ctx.run_dir)
    try:
        if not SWEEP.own_process and SWEEP.groups is not None and SWEEP.groups.holds(ctx.job_num):
            status = SWEEP.groups.start(plain, ctx)  # "pending": it runs with its group after the launch
        elif plain.get("isolate_sweep_jobs", True) and not SWEEP.own_process and SWEEP.rounds is not None:
            status = SWEEP.rounds.start(plain, ctx)  # "pending": it measures in the rounds after the launch
        elif plain.get("isolate_sweep_jobs", True) and not SWEEP.own_process and SWEEP.slots is not None:
            status = SWEEP.slots.launch(plain, ctx)  # "pending": it runs on its slot beside the others
        elif plain.get("isolate_sweep_jobs", True) and not SWEEP.own_process:
            status = run_in_fresh_process(plain, ctx, SWEEP.order_note)
        else:
            status = execute(plain, ctx, order_note=SWEEP.order_note)["status"]
    except KeyboardInterrupt:
        SWEEP.jobs.append((ctx.job_num, str(ctx.run_dir), _job_status(ctx.run_dir)))
        raise
    SWEEP.jobs.append((ctx.job_num, str(ctx.run_dir), status))
    return status


def hydra_task(cfg) -> str:
    """Hydra task function: one run, or one job of a sweep. Returns the run's status.

    A single run that fails exits the process with :func:`exit_code`; a sweep job never raises but for an
    interruption (the sweep goes on), its status is collected in :data:`SWEEP`. The CLI has checked every
    job's config before Hydra started (:mod:`specexp.launch`).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        print(f"specexp: error: no value for {', '.join(missing)}: set it on the command line"
              f" ({missing[0]}=...)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except MissingMandatoryValue as e:  # an interpolation pointing at a missing value
        print(f"specexp: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    ctx = RunContext(
        run_dir=Path(hydra_cfg.runtime.output_dir),
        experiment=str(plain.get("name", "run")),
        sweep_dir=Path(hydra_cfg.sweep.dir).resolve() if multirun else None,
        job_num=hydra_cfg.job.num if multirun else None,
        choices={k: v for k, v in dict(hydra_cfg.runtime.choices).items() if not k.startswith("hydra")},
    )
    with interrupts.interruptible():  # Hydra's steps around the task hold signals back (specexp.launch)
        if not multirun:
            record = execute(plain, ctx)
            if record["status"] != "ok":
                sys.exit(exit_code(record))
            return "ok"
        return run_sweep_job(plain, ctx)
