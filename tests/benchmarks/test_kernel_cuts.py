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


def _row(config_switches: dict, target_ms: float, draft_ms: float, same: bool = True) -> dict:
    def summary(value: float) -> dict:
        return {"mean": value, "std": 0.0, "low": value * 0.99, "high": value * 1.01, "n": 5}
    launches = {part: {"launches_per_step": n} for part, n in (("target", 88.0), ("draft", 48.0), ("spec_decode", 144.0))}
    return {"switches": config_switches, "target_step_ms": summary(target_ms), "draft_step_ms": summary(draft_ms),
            "spec_draft_step_ms": summary(draft_ms), "cost_ratio_c": summary(draft_ms / target_ms),
            "target_fraction_of_copy_bandwidth": 0.772, "kernels": launches, "same_tokens_as_first": same}


def test_table_names_the_cuts_each_row_ran_with_from_the_recorded_defaults():
    # an older file: its defaults had every cut off, and its "all" row turned them on
    older = {"machine": {"gpu": "GPU A"}, "defaults": dict(kernel_cuts.NO_CUTS),
             "pairs": {"p": {"configs": {"defaults": _row({}, 1.2, 0.3),
                                         "all": _row(dict(kernel_cuts.CUTS), 1.0, 0.2, same=False)},
                             "errors": {"broken": "RuntimeError: no"}}}}
    # today's: the defaults run every cut, programmatic launch where the GPU can
    today = {"machine": {"gpu": "GPU B"}, "defaults": dict(kernel_cuts.CUDA_KERNELS),
             "pairs": {"p": {"configs": {"defaults": _row({}, 1.0, 0.2),
                                         "no_pdl": _row(kernel_cuts.CONFIGS["no_pdl"], 1.0, 0.21)}}}}
    lines = kernel_cuts.render_table([("old.json", older), ("new.json", today)]).splitlines()
    assert len(lines) == 2 + 3 + 2
    old_defaults, old_all, old_error, new_defaults, new_no_pdl = lines[2:]
    assert "| defaults | none |" in old_defaults and "| 0.250 [0.247, 0.253] |" in old_defaults
    assert "| all | argmax, sampler, silu_in_down, draft_step, pdl |" in old_all and "| no | 5 |" in old_all
    assert "| broken | failed to build: RuntimeError: no |" in old_error
    assert "| defaults | argmax, sampler, silu_in_down, draft_step, pdl (auto) |" in new_defaults
    assert "| no_pdl | argmax, sampler, silu_in_down, draft_step |" in new_no_pdl
    assert "| 88 / 48 / 144 |" in new_no_pdl and "(77.2%)" in new_no_pdl


def test_table_of_a_missing_file_is_one_line(capsys):
    with pytest.raises(SystemExit, match="2"):
        kernel_cuts.main(["--table", "no/such.json"])
    assert capsys.readouterr().err.strip() == "kernel_cuts.py --table: no such result file: no/such.json"
