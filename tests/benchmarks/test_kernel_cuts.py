"""benchmarks/diagnostics/kernel_cuts.py without a GPU: its configurations are engine settings `engine=cuda`
accepts, and bad arguments are one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"))

import kernel_cuts

from specexp.engine.config import EngineConfig
from specexp.models import triton_support


def test_every_configuration_is_a_valid_cuda_engine():
    if not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    assert kernel_cuts.CONFIGS["defaults"] == {} and set(kernel_cuts.CUTS) == set(kernel_cuts.NO_CUTS)
    for switches in kernel_cuts.CONFIGS.values():
        assert set(switches) <= set(kernel_cuts.CUDA_KERNELS)
        EngineConfig(device="cuda", **{**kernel_cuts.CUDA_KERNELS, **switches}).validate()
    # engine=cuda runs every cut; "none" is engine=cuda with every one off
    assert all(kernel_cuts.CUDA_KERNELS[name] == value for name, value in kernel_cuts.CUTS.items()
               if name != "programmatic_launch")
    assert kernel_cuts.CUDA_KERNELS["programmatic_launch"] == "auto"  # on where the GPU can (sm_90+)
    assert all(kernel_cuts.CUTS[name] != value for name, value in kernel_cuts.NO_CUTS.items())


def test_bad_arguments_are_one_line():
    with pytest.raises(SystemExit, match="2"):
        kernel_cuts.main(["--configs", "defaults,bogus"])
    with pytest.raises(SystemExit):
        kernel_cuts.main(["--pairs", "nope"])
    with pytest.raises(SystemExit):
        kernel_cuts.main(["--rounds", "1"])
