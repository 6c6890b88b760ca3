"""benchmarks/time_to_answer.sh without a GPU: it parses as bash, and bad arguments are one line and exit 2 before
anything runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "time_to_answer.sh"


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0


@pytest.mark.parametrize("args, message", [
    ([], "usage: bash benchmarks/time_to_answer.sh OUT [steps,sweep,context,kernels,cuts,reuse]"),
    (["out", "steps,speed"], "unknown section 'speed'; valid: steps, sweep, context, kernels, cuts, reuse"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, message, tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), *[str(tmp_path / a) if a == "out" else a for a in args]],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
