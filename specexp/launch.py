"""``python -m specexp run`` / ``resume``: check everything, claim a directory, run, leave a record.

1. :func:`plan_run` checks the overrides (:mod:`specexp.overrides`), expands a sweep into its jobs and
   checks every job's config, checkpoints and prompts (:func:`specexp.experiment.build_run_spec`), loading no
   model and creating nothing: a bad input is one line and exit 2, with no directory left behind.
2. The run's (or sweep's) directory is claimed (:mod:`specexp.run_dirs`): the configured one, or the first
   free ``NAME-1``, ``NAME-2``, ...; a resume takes its directory over unless a live run owns it.
3. Hydra runs it there with SIGINT/SIGTERM handled (:mod:`specexp.interrupts`): the job in flight stops
   within seconds and is recorded ``interrupted``; a sweep stops launching jobs. A sweep of CUDA jobs on a
   machine with GPUs runs as many jobs at once as it has device slots (``sweep.devices``,
   ``sweep.gpus_per_job``: :mod:`specexp.device_slots`, :mod:`specexp.sweep_slots`); without a GPU its jobs
   run one after another.
4. Every directory the run created is left with a result.json, the directory is released, and a sweep
   prints what each job ended as (and on which GPUs). Exit status: 0 ok, 1 a run or job failed, 2 bad input,
   130/143 interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specexp import cluster, device_slots, experiment, interrupts, overrides, resume
from specexp import run_dirs as rd
from specexp.errors import ConfigError

_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")
_RESUME_KEYS = ("resume", "+resume", "++resume")


@dataclass
class PlannedJob:
    """One job as checked: the overrides Hydra gets for it, its resolved config, chosen options and spec."""

    num: int
    overrides: list[str]
    config: dict
    choices: dict
    spec: object


@dataclass
class RunPlan:
    """A checked run or sweep, ready to launch. ``hydra_args``: what Hydra is given (the directory
    override is added at launch); ``base_dir``: the directory the config names; ``resume_dir``: set for a
    resume; ``keep``: job numbers a resume leaves as they are."""

    hydra_args: list[str]
    multirun: bool
    jobs: list[PlannedJob]
    base_dir: Path
    resume_dir: Path | None = None
    keep: set = field(default_factory=set)
    interleave: tuple[bool, str] = (False, "a single run: its repeats ran back to back")
    groups: list = field(default_factory=list)  # job numbers sharing one engine (specexp.sweep_groups)
    slots: device_slots.SlotPlan | None = None  # a sweep on device slots (None: its jobs one after another)


def _split(args: list[str]) -> tuple[bool, list[str]]:
    """(multirun flag given, overrides) of a run's arguments; :class:`ConfigError` for anything else."""
    multirun = any(a in ("-m", "--multirun") for a in args)
    rest = [a for a in args if a not in ("-m", "--multirun")]
    for arg in rest:
        if arg.startswith("-"):
            raise ConfigError(f"unknown option '{arg}': run takes -m (a sweep) and key=value overrides;"
                              " --cfg job prints the composed config")
        if "=" not in arg:
            raise ConfigError(f"'{arg}' is not an override: write key=value (python -m specexp --help)")
    return multirun, rest


def _pop_resume(args: list[str]) -> tuple[list[str], Path | None]:
    kept, resume_dir = [], None
    for arg in args:
        key, _, value = arg.partition("=")
        if key in _RESUME_KEYS:
            if not value:
                raise ConfigError("resume needs a directory: +resume=SWEEP_DIR")
            resume_dir = Path(value).expanduser()
        else:
            kept.append(arg)
    return kept, resume_dir


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    missing = sorted(OmegaConf.missing_keys(job))
    if missing:
        raise ConfigError(f"no value for {', '.join(missing)}: set it on the command line ({missing[0]}=...)")
    try:
        return OmegaConf.to_container(job, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"the config cannot be resolved: {str(e).splitlines()[0]}") from None


def _distinct(jobs: list[list[str]], i: int) -> str:
    common = set.intersection(*(set(j) for j in jobs)) if jobs else set()
    return " ".join(o for o in jobs[i] if o not in common) or "no overrides of its own"


def _check_environment() -> None:
    """Settings read from the environment, checked with the rest before anything starts."""
    from specexp.progress import progress_interval_s, progress_mode

    progress_mode()
    progress_interval_s()


def _fake_gpus() -> int | None:
    """:data:`specexp.device_slots.FAKE_GPUS_ENV` as a count (None when unset); :class:`ConfigError` otherwise."""
    value = os.environ.get(device_slots.FAKE_GPUS_ENV)
    if value is None or value == "":
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ConfigError(f"{device_slots.FAKE_GPUS_ENV}={value!r} is not valid: use a number of GPUs >= 1 (a test"
                          " hook: the sweep acts as if that many GPUs were visible), or unset it")
    return int(value)


def _visible_gpus(configs: list[dict]) -> tuple[tuple[str, ...], bool]:
    """(the GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` names them; whether they are fake). torch is
    asked only when a job runs on CUDA or names ``sweep.devices``."""
    fake = _fake_gpus()
    if fake is not None:
        return tuple(str(i) for i in range(fake)), True
    wanted = any((c.get("engine") or {}).get("device") == "cuda" or (c.get("sweep") or {}).get("devices") is not None
                 for c in configs)
    if not wanted:
        return (), False
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return device_slots.visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"), count), False


def _check_sweep_settings(configs: list[dict]) -> None:
    """``sweep.devices`` of a single run is not used, but still checked."""
    for cfg in configs:
        device_slots.parse_devices((cfg.get("sweep") or {}).get("devices"))


def plan_run(argv: list[str]) -> RunPlan:
    """Check ``argv`` (``["run", OVERRIDES...]`` or ``["resume", DIR]``) completely and return the plan;
    :class:`ConfigError` (one line) for the first problem. Creates nothing and loads no model."""
    from specexp.cli import conf_dir, run_args

    command, args = argv[0], list(argv[1:])
    if command == "resume":
        if not args or args[0].startswith("-") or "=" in args[0]:
            raise ConfigError("resume needs the sweep's directory: python -m specexp resume SWEEP_DIR")
        resume_dir, args = Path(args[0]).expanduser(), args[1:]
        multirun, given = _split(args)
    else:
        multirun, given = _split(args)
        given, resume_dir = _pop_resume(given)
    conf = conf_dir()
    _check_environment()
    if resume_dir is not None:
        recorded = resume.recorded_run(resume_dir)
        resume.check_same_overrides([g for g in given if not g.startswith(_DIR_KEYS)], recorded)
        given = [*recorded.task_overrides, *recorded.hydra_overrides]
        multirun = recorded.multirun
        resume_dir = recorded.path
    else:
        multirun = multirun or "-m" in run_args(given)  # an experiment that declares a sweep is one
    given = [g for g in given if not (resume_dir is not None and g.startswith(_DIR_KEYS))]
    cluster.check_launcher(given, multirun)
    normalized = overrides.normalize(given, conf, multirun)
    if multirun:
        fixed = [o.text for o in overrides.parse(normalized, conf) if not o.hydra.is_sweep_override()]
        probe = overrides.compose(conf, fixed)
        job_lists = overrides.sweep_jobs(normalized, overrides.sweeper_params(probe))
    else:
        job_lists = [normalized]
    jobs, prompt_cache = [], {}
    for i, job_overrides in enumerate(job_lists):
        try:
            cfg = overrides.compose_job(conf, job_overrides)
            plain = _plain(cfg)
            choices = overrides.choices_of(cfg)
            ctx = experiment.RunContext(run_dir=Path(str(cfg.hydra.run.dir)), experiment=str(plain.get("name")),
                                        choices=choices)
            spec = experiment.build_run_spec(plain, ctx, prompt_cache=prompt_cache)
        except ConfigError as e:
            if len(job_lists) > 1:
                raise ConfigError(f"sweep job {i} ({_distinct(job_lists, i)}): {e}") from None
            raise
        recorded_overrides = [o for o in job_overrides if not o.lstrip("+~").startswith("hydra")]
        jobs.append(PlannedJob(i, recorded_overrides, plain, choices, spec))
    first = overrides.compose_job(conf, job_lists[0])
    base_dir = Path(str(first.hydra.sweep.dir if multirun else first.hydra.run.dir))
    plan = RunPlan(hydra_args=[*(["-m"] if multirun else []), *normalized], multirun=multirun, jobs=jobs,
                   base_dir=base_dir, resume_dir=resume_dir)
    if resume_dir is not None:
        if multirun:
            plan.keep = resume.kept_jobs(resume_dir, [j.overrides for j in jobs])
        elif resume.job_status(resume_dir) == "ok":
            plan.keep = {0}
    if multirun:
        from specexp.measure.rounds import BASIC_LAUNCHER, interleave_decision

        launcher = first.hydra.get("launcher", {}).get("_target_")
        launcher = str(launcher) if launcher else None
        to_run = [j.config for j in jobs if j.num not in plan.keep]
        visible, fake = _visible_gpus(to_run)
        plan.slots = device_slots.plan_slots(to_run, launcher, visible, fake)
        parallel = len(plan.slots.slots) if plan.slots is not None and plan.slots.parallel else 1
        plan.interleave = interleave_decision(to_run, launcher, parallel)
        if parallel == 1 and (launcher is None or launcher == BASIC_LAUNCHER):
            from specexp.sweep_groups import plan_groups

            numbers = [j.num for j in jobs if j.num not in plan.keep]
            plan.groups = [{numbers[i] for i in group} for group in plan_groups(to_run)]
    else:
        _check_sweep_settings([j.config for j in jobs])
    return plan


def _dir_override(key: str, path: Path) -> str:
    quoted = str(path).replace("\\", "\\\\").replace("'", "\\'")
    return f"{key}='{quoted}'"


def _without_dir_overrides(args: list[str]) -> list[str]:
    return [a for a in args if a.split("=", 1)[0].lstrip("+") not in _DIR_KEYS]


def _ensure_records(plan: RunPlan, run_dir: Path, interrupted: interrupts.RunInterrupted | None) -> None:
    """Every directory this run created holds a result.json: write one for a job (or run) that got a
    directory but no record (stopped or failed before it could write)."""
    why = (f"interrupted by {experiment.signal_name(interrupted.signum)} before the run started"
           if interrupted else "the run stopped before it wrote its record")
    status = "interrupted" if interrupted else "failed"
    if not plan.multirun:
        targets = [(run_dir, plan.jobs[0], None)]
    else:
        targets = [(run_dir / str(job.num), job, job.num) for job in plan.jobs]
    for job_dir, job, num in targets:
        if not job_dir.is_dir() or (job_dir / "result.json").is_file():
            continue
        ctx = experiment.RunContext(run_dir=job_dir, experiment=str(job.config.get("name")),
                                    sweep_dir=run_dir if plan.multirun else None, job_num=num)
        try:
            experiment.fallback_record(job.config, ctx, status, why)
        except OSError as e:
            print(f"specexp: error: cannot write {job_dir / 'result.json'} ({e})", file=sys.stderr)


def _sweep_summary(plan: RunPlan, run_dir: Path, interrupted) -> int:
    """Print what each job ended as; returns the sweep's exit status."""
    launched = {num: Path(job_dir) for num, job_dir, _ in experiment.SWEEP.jobs}
    job_dirs = {job.num: launched.get(job.num, run_dir / str(job.num)) for job in plan.jobs}
    statuses = {num: resume.job_status(job_dir) for num, job_dir in job_dirs.items()}
    ok = sum(s == "ok" for s in statuses.values())
    not_run = sum(s is None for s in statuses.values())
    not_ok = len(statuses) - ok - not_run
    kept = f" ({len(plan.keep)} kept from before)" if plan.keep else ""
    line = f"sweep: {len(statuses)} jobs, {ok} ok{kept}, {not_ok} not ok"
    if not_run:
        line += f", {not_run} not run"
    if interrupted:
        line += f" (interrupted by {experiment.signal_name(interrupted.signum)})"
    print(line, flush=True)
    where = _where_jobs_ran(plan)
    _print_job_lines(plan, job_dirs, statuses, where)
    for num, status in statuses.items():
        if status not in ("ok", None):
            on = f" on {where[num]}" if where.get(num) else ""
            print(f"  job {num}: {status}{on} (see {job_dirs[num] / 'result.json'})", flush=True)
    if experiment.SWEEP.slots is not None:
        print(f"  where and when each job ran: {experiment.SWEEP.slots.timeline.path}", flush=True)
    if not_ok or not_run:
        print(f"  resume (runs only the jobs without an ok record): python -m specexp resume {run_dir}", flush=True)
    if interrupted:
        return interrupted.exit_status
    return experiment.EXIT_FAILED if not_ok or not_run else experiment.EXIT_OK


def _where_jobs_ran(plan: RunPlan) -> dict[int, str]:
    """``{job: "GPU 1"}`` for the jobs a sweep on device slots ran (empty for a sweep without slots)."""
    if experiment.SWEEP.slots is not None:
        labels = {job.num: experiment.SWEEP.slots.label(job.num) for job in plan.jobs}
        return {num: label for num, label in labels.items() if label}
    if experiment.SWEEP.rounds is not None and plan.slots is not None:  # one slot, every job resident on it
        return {job.num: plan.slots.label(0) for job in plan.jobs if job.num not in plan.keep}
    return {}


def _print_job_lines(plan: RunPlan, job_dirs: dict, statuses: dict, where: dict) -> None:
    """Per finished job: its own overrides, where it ran (a sweep on device slots), acceptance with its
    interval, tokens/s mean ± std over repeats."""
    from specexp.tracking import records
    from specexp.tracking.summary import job_line

    overrides = [job.overrides for job in plan.jobs]
    for i, job in enumerate(plan.jobs):
        if statuses.get(job.num) != "ok":
            continue
        try:
            record = records.read_result(job_dirs[job.num])
        except (OSError, ValueError):
            continue
        on = f" on {where[job.num]}" if where.get(job.num) else ""
        print(f"  job {job.num} ({_distinct(overrides, i)}){on}: {job_line(record)}", flush=True)


def _passthrough(args: list[str]) -> int:
    """``run --cfg job ...`` / ``--help`` / ``--info``: Hydra prints and runs nothing (the overrides are still
    checked, and rewritten as a run would have them)."""
    from specexp.cli import _run_hydra, conf_dir

    if not any(a in ("--help", "-h", "--hydra-help") for a in args):
        multirun = any(a in ("-m", "--multirun") for a in args)
        positions = [i for i, a in enumerate(args) if "=" in a and not a.startswith("-")]
        normalized = overrides.normalize([args[i] for i in positions], conf_dir(), multirun)
        args = list(args)
        for i, override in zip(positions, normalized):
            args[i] = override
    _run_hydra("config", experiment.hydra_task, args)
    return 0


def _rounds(plan: RunPlan):
    """A :class:`specexp.sweep_rounds.RoundsCoordinator` when the sweep measures its repeats in rounds (on a
    sweep with one device slot, every job is shown that slot's GPUs)."""
    if not plan.multirun or not plan.interleave[0]:
        return None
    from specexp.sweep_rounds import RoundsCoordinator

    if plan.slots is None:
        return RoundsCoordinator()
    placement = {**plan.slots.placement(0), "host": rd.hostname(), "sweep_file": None}
    return RoundsCoordinator(env=device_slots.env_for_slot(plan.slots, 0, os.environ), placement=placement)


def _slot_runner(plan: RunPlan, run_dir: Path, rounds):
    """A :class:`specexp.sweep_slots.SlotRunner` when the sweep runs its jobs on device slots (and not in
    rounds, which keep every job resident on the one slot)."""
    if not plan.multirun or plan.slots is None or rounds is not None:
        return None
    from specexp.sweep_slots import SlotRunner

    return SlotRunner(plan.slots, run_dir, rd.hostname(), plan.interleave[1], keep=plan.keep)


def run_command(argv: list[str]) -> int:
    """``python -m specexp run|resume ...`` (see the module docstring); returns the exit status."""
    from specexp.cli import _NO_RUN_FLAGS, _run_hydra

    if argv[0] == "run" and any(a.split("=")[0] in _NO_RUN_FLAGS for a in argv[1:]):
        return _passthrough(argv[1:])
    interrupts.install()  # from here on SIGINT and SIGTERM raise RunInterrupted
    plan = run_dir = interrupted = None
    code = experiment.EXIT_OK
    try:
        plan = plan_run(argv)
        if plan.resume_dir is not None and not plan.multirun and plan.keep:
            print(f"resume: {plan.resume_dir} finished ok: nothing to run", flush=True)
            return experiment.EXIT_OK
        with interrupts.deferred():  # a directory claimed is always released and left with a record
            run_dir = rd.take_over(plan.resume_dir) if plan.resume_dir is not None else rd.claim_run_dir(plan.base_dir)
        if plan.resume_dir is None and run_dir != plan.base_dir.expanduser().absolute():
            print(f"specexp: {plan.base_dir} holds another run: writing to {run_dir}", file=sys.stderr, flush=True)
        if plan.resume_dir is not None and not plan.multirun:
            from specexp.tracking import records

            records.archive_previous(run_dir)
        key = "hydra.sweep.dir" if plan.multirun else "hydra.run.dir"
        args = [*_without_dir_overrides(plan.hydra_args), _dir_override(key, run_dir)]
        rounds = _rounds(plan)
        slots = _slot_runner(plan, run_dir, rounds)
        groups = None
        if plan.groups and (slots is None or len(plan.slots.slots) == 1):  # one device (always so in rounds)
            from specexp.sweep_groups import EngineGroups

            groups = EngineGroups(plan.groups)
        experiment.SWEEP.reset(keep=plan.keep if plan.multirun else (), resuming=plan.resume_dir is not None,
                               rounds=rounds, order_note=None if rounds else plan.interleave[1], slots=slots,
                               groups=groups)
        if slots is not None:
            print(slots.announce(), flush=True)
        # Hydra's own steps (composing each job's config) run with signals held back: a signal inside omegaconf
        # leaves its config half built and Hydra prints the error; each job's run takes them at once.
        with interrupts.deferred():
            _run_hydra("config", experiment.hydra_task, args)
        if rounds is not None:
            if groups is not None:  # grouped jobs take part in the rounds, a process per group
                groups.join_rounds(rounds)
            rounds.run()
        if slots is not None:
            slots.drain()
        if groups is not None and rounds is None:
            experiment.SWEEP.finish_groups()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else experiment.EXIT_FAILED
    except interrupts.RunInterrupted as e:
        if run_dir is None:
            raise  # nothing was created
        interrupted = e
    finally:
        if experiment.SWEEP.rounds is not None:  # jobs still waiting for their rounds: stop and record them
            with interrupts.deferred():
                experiment.SWEEP.rounds.stop(interrupted.signum if interrupted else signal.SIGTERM)
        if experiment.SWEEP.groups is not None:  # grouped jobs that did not run: record them
            with interrupts.deferred():
                experiment.SWEEP.groups.stop(interrupted.signum if interrupted else signal.SIGTERM)
        if experiment.SWEEP.slots is not None:  # jobs still running on their slots: stop and record them
            with interrupts.deferred():
                experiment.SWEEP.slots.stop(interrupted.signum if interrupted else signal.SIGTERM)
        if run_dir is not None:
            with interrupts.deferred():
                _ensure_records(plan, run_dir, interrupted)
                rd.release(run_dir)
        interrupts.uninstall()
    if plan.multirun:
        return _sweep_summary(plan, run_dir, interrupted)
    if interrupted is not None:
        print(f"specexp: interrupted by {experiment.signal_name(interrupted.signum)}; the record is"
              f" {run_dir / 'result.json'}", file=sys.stderr, flush=True)
        return interrupted.exit_status
    return code
