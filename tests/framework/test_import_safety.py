"""specexp runs from any working directory, including one holding a folder named `specexp` (the parent of a
clone: git names the clone after the repository), which `python -m` would otherwise import in its place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specexp

# Two CLI runs from a shadowing directory (30-70 s each on a 2-core CPU).
pytestmark = pytest.mark.slow

PACKAGE_ROOT = Path(specexp.__file__).resolve().parents[1]  # realpath
TINY_RUN = ["run", "+exp=quickstart", "tracking=disabled", "workload.num_prompts=1", "sampling.max_new_tokens=2",
            "speculator.num_speculative_tokens=1"]

# A finder that serves specexp only after the path search has had its turn, as setuptools' editable finder
# for flat layouts does: the worst case for a `specexp` folder in the working directory. The package's own
# path entry (an editable install's .pth, PYTHONPATH) is taken off sys.path so that only this finder has it.
LATE_FINDER = '''
import importlib.util, os, sys
from importlib.machinery import PathFinder
ROOT = {root!r}
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != ROOT]

class LateFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "specexp":
            return importlib.util.spec_from_file_location(
                name, ROOT + "/specexp/__init__.py", submodule_search_locations=[ROOT + "/specexp"])
        if name.startswith("specexp.") and name.count(".") == 1:
            return PathFinder.find_spec(name, [ROOT + "/specexp"])
        return None

sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, LateFinder)
'''


def clone_parent(tmp_path: Path) -> Path:
    """A directory holding a folder named specexp that looks like a clone's root (no __init__.py)."""
    clone = tmp_path / "work" / "specexp"
    (clone / "specexp").mkdir(parents=True)
    (clone / "README.md").write_text("# specexp\n")
    (clone / "pyproject.toml").write_text("[project]\nname = 'specexp'\n")
    return clone.parent


def run_cli(cwd: Path, env: dict, run_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "specexp", *TINY_RUN, f"hydra.run.dir={run_dir}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run_dir / "result.json").read_text())


def test_a_run_from_the_parent_of_a_clone_named_specexp_works(tmp_path):
    record = run_cli(clone_parent(tmp_path), dict(os.environ), tmp_path / "run")
    assert record["status"] == "ok"
    assert record["env"]["specexp_version"] == specexp.__version__


def test_the_package_is_found_even_when_its_finder_runs_after_the_path_search(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LATE_FINDER.format(root=str(PACKAGE_ROOT)))
    env = {**os.environ, "PYTHONPATH": str(site)}
    shadowed = subprocess.run([sys.executable, "-c", "import specexp; print(specexp.__file__)"],
                              cwd=clone_parent(tmp_path), env=env, capture_output=True, text=True, check=True)
    assert shadowed.stdout.strip() == "None", "the setup must reproduce the shadowing it guards against"
    record = run_cli(clone_parent(tmp_path / "again"), env, tmp_path / "run")
    assert record["status"] == "ok"
    assert record["env"]["specexp_version"] == specexp.__version__
