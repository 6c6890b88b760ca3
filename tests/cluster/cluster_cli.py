"""Running ``python -m specexp`` for the cluster tests, and skipping where the cluster cannot be used.

Every CLI process gets its own ``SPECEXP_RUNS_DIR``, no W&B credentials and no network; a Slurm sweep's
process also gets the cluster's ``SLURM_CONF`` (its jobs inherit the environment through sbatch).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRE_ENV = "SPECEXP_REQUIRE_SLURM"


def cannot_run(reason: str):
    """Skip (or, where CI requires Slurm, fail) a test that needs the cluster, with a one-line reason."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"Slurm is required ({REQUIRE_ENV}=1) but {reason}", pytrace=False)
    pytest.skip(reason)


def missing_extra() -> str | None:
    """Why the cluster launchers cannot be used here (the [cluster] extra is missing), None if they can."""
    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        return "the cluster extra is not installed: pip install -e '.[cluster]'"
    return None


def cli_env(runs_dir: Path, base: dict | None = None) -> dict:
    """The environment of a CLI process whose runs go to ``runs_dir``: no W&B credentials, no network, and
    torch on one thread (so sweeps can run side by side on a small machine, all with the same numerics)."""
    env = {**(base if base is not None else os.environ), "SPECEXP_RUNS_DIR": str(runs_dir),
           "NETRC": str(Path(runs_dir).parent / "no-netrc"), "OMP_NUM_THREADS": "1"}
    env.pop("WANDB_API_KEY", None)
    return env


class StartedCli:
    """``python -m specexp ARGS`` running in the background, its stdout and stderr going to files in ``log_dir``
    (a pipe nobody reads could fill up and stop it)."""

    def __init__(self, args: list[str], env: dict, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = log_dir / "stdout.txt", log_dir / "stderr.txt"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "specexp", *args], stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, text=True, env=env, start_new_session=True)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float = 300) -> subprocess.CompletedProcess:
        """Wait for it to end; its exit status, stdout and stderr."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            raise
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.out_path.read_text(),
                                           self.err_path.read_text())


def run_cli(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m specexp ARGS`` to completion."""
    return subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
