"""Hydra launchers of specexp's cluster sweeps (``hydra/launcher=slurm``, ``hydra/launcher=local``).

Hydra finds launchers only in the ``hydra_plugins`` package; the work is done in :mod:`specexp.cluster`.
"""
