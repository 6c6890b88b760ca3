"""``SpecexpSlurmLauncher`` and ``SpecexpLocalLauncher``: Hydra's submitit launchers with specexp's sweep
semantics (:mod:`specexp.cluster`): a resume's ok jobs are not submitted, every job is recorded as in a local
sweep, SIGTERM from Slurm is recorded ``interrupted`` with Slurm's job state.

Hydra imports every module of ``hydra_plugins`` on each run: without the ``[cluster]`` extra
(hydra-submitit-launcher) this module defines nothing and imports nothing else.
"""

from __future__ import annotations

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
except ImportError:  # the [cluster] extra is not installed: no cluster launchers
    BaseSubmititLauncher = None

if BaseSubmititLauncher is not None:

    class _SpecexpSubmititLauncher(BaseSubmititLauncher):
        """The sweep's main process calls :meth:`launch`; each job's own process calls the pickled launcher."""

        def launch(self, job_overrides, initial_job_idx):
            from specexp.cluster.submit import launch

            return launch(self, self._EXECUTOR, job_overrides, initial_job_idx)

        def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state):
            from specexp.cluster.job import run_job_here

            return run_job_here(self, sweep_overrides, job_num, singleton_state)

    class SpecexpSlurmLauncher(_SpecexpSubmititLauncher):
        """Every job a Slurm job (one job array per sweep)."""

        _EXECUTOR = "slurm"

    class SpecexpLocalLauncher(_SpecexpSubmititLauncher):
        """Every job a submitit job process on this machine, one at a time."""

        _EXECUTOR = "local"
