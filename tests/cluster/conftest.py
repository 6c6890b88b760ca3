"""Fixtures of the cluster tests: one real one-node Slurm for the whole test session, and the CLI run against it.

``slurm_cluster`` starts munged, slurmctld and slurmd (:mod:`one_node_slurm`) once and stops them when the
session ends. Where Slurm cannot start (not root, slurm-wlm or munge missing, the cluster extra not installed)
the tests that need it skip with one line; with ``SPECEXP_REQUIRE_SLURM=1`` (CI sets it) they fail instead.
"""

from __future__ import annotations

import subprocess

import pytest
from cluster_cli import cannot_run, missing_extra
from one_node_slurm import OneNodeSlurm, SlurmUnavailable, why_slurm_cannot_start


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A running one-node Slurm (:class:`one_node_slurm.OneNodeSlurm`), shared by the session's tests."""
    why = why_slurm_cannot_start() or missing_extra()
    if why:
        cannot_run(why)
    cluster = OneNodeSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except (SlurmUnavailable, OSError, subprocess.SubprocessError) as e:
        cluster.stop()
        cannot_run(f"the one-node Slurm did not start: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def cluster_extra():
    """Skip (fail under SPECEXP_REQUIRE_SLURM=1) where the cluster launchers are not installed."""
    why = missing_extra()
    if why:
        cannot_run(why)
