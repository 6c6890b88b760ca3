"""Running ``python -m specexp`` in a subprocess the way a user does, for the CLI tests.

Every call gets its own ``SPECEXP_RUNS_DIR`` (so a test sees exactly the directories its runs created), no
W&B credentials and no network. ``TINY_RUN`` is the smallest run that loads the default random-weight pair:
one 6-token prompt, 4 new tokens, no W&B.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TINY_RUN = ["workload.num_prompts=1", "workload.input_len=6", "workload.output_len=4", "tracking=disabled"]


def cli_env(runs_dir: Path) -> dict:
    """The environment of a CLI subprocess whose runs go to ``runs_dir``."""
    env = {**os.environ, "SPECEXP_RUNS_DIR": str(runs_dir), "NETRC": str(Path(runs_dir).parent / "no-netrc")}
    env.pop("WANDB_API_KEY", None)
    return env


def run_cli(args: list[str], runs_dir: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """``python -m specexp ARGS`` to completion; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "specexp", *args], capture_output=True, text=True,
                          env=cli_env(runs_dir), check=False, timeout=timeout, **kwargs)


def start_cli(args: list[str], runs_dir: Path, **kwargs) -> subprocess.Popen:
    """``python -m specexp ARGS`` started as the leader of a new process group (its group id is its pid)."""
    return subprocess.Popen([sys.executable, "-m", "specexp", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(runs_dir), start_new_session=True,
                            **kwargs)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a refused command printed on stderr (asserts there is exactly one)."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specexp: error: "), proc.stderr
    return lines[0]


def run_dirs(runs_dir: Path) -> list[Path]:
    """The directories directly under ``runs_dir`` (none if it does not exist)."""
    return sorted(p for p in Path(runs_dir).glob("*") if p.is_dir()) if Path(runs_dir).exists() else []


def mismatched_checkpoint(source: Path, dest: Path) -> Path:
    """A copy of ``source`` whose config.json no longer matches its weights: it passes every check made before
    loading and fails when its tensors are loaded (a failure after the run started)."""
    shutil.copytree(source, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 8}))
    return dest
