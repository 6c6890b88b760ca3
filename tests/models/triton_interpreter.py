"""Where the Triton kernel checks run: on a GPU (`on_triton_gpu`), or under Triton's CPU interpreter in a
subprocess (`run_in_triton_interpreter`: the interpreter is chosen when triton is imported, so it cannot be
switched on inside the test process). Both skip where triton is not installed (torch's CPU builds ship
without it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specexp.models import triton_support

MODELS_TESTS = Path(__file__).resolve().parent
ROOT = MODELS_TESTS.parents[1]


def on_triton_gpu(test):
    """Mark `test` as a GPU test (`pytest -m cuda`) that runs only where CUDA and triton are."""
    needs = pytest.mark.skipif(not torch.cuda.is_available() or not triton_support.AVAILABLE,
                               reason="needs a CUDA GPU")
    return pytest.mark.cuda(needs(test))


def run_in_triton_interpreter(module: str, check: str, *args: str) -> None:
    """`from {module} import {check}; {check}("cpu", *args)` with TRITON_INTERPRET=1; args are Python
    expressions (torch is imported). Fails with the subprocess's stderr when the check fails."""
    if not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    code = (f"import sys, torch; sys.path.insert(0, {str(MODELS_TESTS)!r}); from {module} import {check}; "
            f"{check}('cpu', {', '.join(args)}); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
