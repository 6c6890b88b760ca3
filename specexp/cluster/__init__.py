"""Sweeps on a cluster: every job of a sweep as a Slurm job (``hydra/launcher=slurm``), or as a job process
of its own on this machine through the same code (``hydra/launcher=local``), with submitit.

The launchers (``hydra_plugins/specexp_cluster``, configured in ``conf/hydra/launcher/``) are thin; the work
is here:

- :mod:`specexp.cluster.submit`, in the sweep's main process: submits the jobs a resume does not keep (a
  Slurm array of at most ``array_parallelism`` running at once; locally one at a time), waits for them,
  copies submitit's logs into each job's directory, and makes sure every job that got a directory has a
  result.json, noting Slurm's state (``CANCELLED``, ``TIMEOUT``, ...) in the record of one that did not end
  ``ok``. The sweep summary and ``resume`` then work as for a local sweep.
- :mod:`specexp.cluster.job`, in each job's own process (on a compute node): runs the job through Hydra into
  ``SWEEP_DIR/<job number>`` with :func:`specexp.experiment.execute`, so its record is a local sweep's, and
  SIGTERM (``scancel``, a time limit, a preemption) stops it within seconds, recorded ``interrupted``.
- :mod:`specexp.cluster.slurm`: what Slurm says about a job (environment facts, a finished job's state).

:func:`check_launcher` refuses, before anything runs, a cluster launcher that cannot work here.
"""

from __future__ import annotations

import importlib.util
import shutil

from specexp.errors import ConfigError

LAUNCHERS = ("slurm", "local")
_SUBMITIT_LAUNCHERS = ("submitit_slurm", "submitit_local")
_HYDRA_LAUNCHERS = ("basic", "joblib")


def chosen_launcher(overrides: list[str]) -> str | None:
    """The option a ``hydra/launcher=NAME`` override in ``overrides`` chooses (the last one), else None."""
    chosen = None
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == "hydra/launcher":
            chosen = value
    return chosen


def check_launcher(overrides: list[str], multirun: bool) -> None:
    """:class:`ConfigError` (one line) when ``overrides`` choose a cluster launcher that cannot run here: the
    ``[cluster]`` extra is not installed, ``sbatch`` is missing for ``slurm``, the run is not a sweep, or
    submitit's own launcher is chosen (it cannot keep a resume's ok jobs nor record Slurm's states)."""
    name = chosen_launcher(overrides)
    if name in _SUBMITIT_LAUNCHERS:
        ours = name.removeprefix("submitit_")
        raise ConfigError(f"hydra/launcher={name}: use hydra/launcher={ours}, specexp's {ours} launcher on submitit"
                          " (it records every job, resumes a sweep and notes Slurm's job states)")
    if name is not None and name not in (*LAUNCHERS, *_HYDRA_LAUNCHERS):
        raise ConfigError(f"unknown launcher '{name}': choose slurm (every job a Slurm job), local (every job a"
                          " submitit job process here) or basic (the default: jobs one after another)")
    if name not in LAUNCHERS:
        return
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        raise ConfigError(f"hydra/launcher={name} needs hydra-submitit-launcher: pip install -e '.[cluster]'")
    if not multirun:
        raise ConfigError(f"hydra/launcher={name} launches the jobs of a sweep: add -m (a single run runs here)")
    if name == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("hydra/launcher=slurm needs Slurm's sbatch on PATH: start the sweep where jobs can be"
                          " submitted (a login node), or use hydra/launcher=local on this machine")
