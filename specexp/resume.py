"""Resuming a sweep (or a single run) in place: only jobs without an ``ok`` record run again.

``python -m specexp resume SWEEP_DIR`` (or ``run ... +resume=SWEEP_DIR``) reads the overrides the sweep was
started with from ``SWEEP_DIR/multirun.yaml`` (Hydra writes it), expands the same jobs into the same job
directories (``SWEEP_DIR/0``, ``1``, ...), keeps every job whose result.json says ``ok`` and runs the others
(failed, interrupted, never started). The W&B group is the sweep directory's name, so resumed jobs join the
same group. A job that runs again first moves its old record to ``result.previous.json``. A job directory
whose recorded overrides differ from the job the sweep expands to now (its experiment file was edited) stops
the resume before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specexp.errors import ConfigError
from specexp.tracking import records

# Hydra settings a resume sets itself.
_OWN_HYDRA_KEYS = ("hydra.mode", "hydra.run.dir", "hydra.sweep.dir")


@dataclass
class RecordedRun:
    """What a run directory says about how it was started: its task overrides, its own ``hydra.*``
    overrides, and whether it is a sweep."""

    path: Path
    task_overrides: list[str]
    hydra_overrides: list[str]
    multirun: bool


def _load_yaml(path: Path):
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - any unreadable file: one line
        raise ConfigError(f"cannot read {path} ({type(e).__name__}): is it a specexp run directory?") from None


def recorded_run(run_dir: str | Path) -> RecordedRun:
    """The overrides ``run_dir`` (a sweep directory or a single run's directory) was started with."""
    from omegaconf import OmegaConf

    path = Path(run_dir).expanduser().absolute()
    if not path.is_dir():
        raise ConfigError(f"resume: {path} is not a directory: give the sweep's (or run's) directory")
    multirun_file = path / "multirun.yaml"
    if multirun_file.is_file():
        cfg = _load_yaml(multirun_file)
        multirun = True
    elif (path / ".hydra" / "hydra.yaml").is_file():
        cfg = _load_yaml(path / ".hydra" / "hydra.yaml")
        multirun = False
    else:
        raise ConfigError(f"resume: {path} holds neither multirun.yaml (a sweep) nor .hydra/hydra.yaml (a run):"
                          " give the directory a run or sweep was started in")
    task = list(OmegaConf.select(cfg, "hydra.overrides.task") or [])
    hydra = [o for o in OmegaConf.select(cfg, "hydra.overrides.hydra") or []
             if not o.split("=")[0].lstrip("+~").startswith(_OWN_HYDRA_KEYS)]
    return RecordedRun(path, [str(o) for o in task], [str(o) for o in hydra], multirun)


def check_same_overrides(given: list[str], recorded: RecordedRun) -> None:
    """``run ... +resume=DIR`` must repeat the overrides DIR was started with (or give none)."""
    def plain(overrides):  # '+'/'++' as typed or as specexp rewrote them mean the same here
        return {o.lstrip("+") for o in overrides}

    if given and plain(given) != plain(recorded.task_overrides):
        missing = sorted(plain(recorded.task_overrides) - plain(given))
        extra = sorted(plain(given) - plain(recorded.task_overrides))
        raise ConfigError(
            f"resume: the overrides differ from those {recorded.path} was started with (missing: {missing or '-'};"
            f" new: {extra or '-'}): give the same ones, or none (python -m specexp resume {recorded.path})"
        )


def job_status(job_dir: Path) -> str | None:
    """The status a job directory's result.json records, None if it has none."""
    try:
        return records.read_result(job_dir)["status"]
    except (OSError, ValueError, KeyError):
        return None


def kept_jobs(sweep_dir: Path, jobs: list[list[str]]) -> set[int]:
    """Numbers of the jobs whose record is ``ok`` (they are not run again), after checking every existing
    job directory was started with the overrides job ``i`` has now."""
    kept = set()
    for i, overrides in enumerate(jobs):
        job_dir = sweep_dir / str(i)
        recorded = job_dir / ".hydra" / "overrides.yaml"
        if recorded.is_file():
            was = [str(o) for o in _load_yaml(recorded)]
            if sorted(was) != sorted(overrides):
                raise ConfigError(
                    f"resume: job {i} in {job_dir} was started with {was}, but the sweep's job {i} is now"
                    f" {overrides}: the experiment changed since; start a new sweep instead"
                )
        if job_status(job_dir) == "ok":
            kept.add(i)
    return kept
