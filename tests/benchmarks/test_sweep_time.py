"""benchmarks/sweep_time.py on the CPU: both modes of a small depth sweep run, every job's start-up is read back,
and reused and isolated jobs agree on acceptance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import sweep_time


def test_bad_arguments_are_one_line():
    with pytest.raises(SystemExit, match="unknown mode 'shared'"):
        sweep_time.main(["--out", "x.json", "--modes", "reused,shared"])
    with pytest.raises(SystemExit, match="--ks=1,x: comma-separated depths"):
        sweep_time.main(["--out", "x.json", "--ks", "1,x"])


@pytest.mark.slow
def test_both_modes_sweep_every_k_with_the_same_acceptance(tmp_path):
    out = tmp_path / "st.json"
    result = sweep_time.main(["--out", str(out), "--pair", "tiny_lfm2", "--engine", "cpu", "--ks", "1,2",
                              "--num-prompts", "2", "--output-len", "8", "--warm-up", "--", "measure.repeats=2"])
    assert json.loads(out.read_text()) == result
    by_mode = {s["mode"]: s for s in result["sweeps"]}
    assert set(by_mode) == {"reused", "isolated"}
    for sweep in by_mode.values():
        assert sweep["returncode"] == 0 and [j["k"] for j in sweep["jobs"]] == [1, 2]
        assert all(j["status"] == "ok" and j["startup_s"]["total"] > 0 for j in sweep["jobs"])
    # k = 1 and 2 share one engine when reused: the later job loads no model (k = 0 in a group: test_engine_groups)
    reused = {j["k"]: j for j in by_mode["reused"]["jobs"]}
    isolated = {j["k"]: j for j in by_mode["isolated"]["jobs"]}
    assert min(reused[1]["startup_s"]["model_load"], reused[2]["startup_s"]["model_load"]) == 0.0
    assert all(j["startup_s"]["model_load"] > 0 for j in isolated.values())
    assert result["acceptance_mismatches"] == []
    assert reused[2]["acceptance_length"] == isolated[2]["acceptance_length"] > 1.0
    assert result["warm_up"]["mode"] == "reused" and [j["k"] for j in result["warm_up"]["jobs"]] == [1, 2]
    assert len(result["sweeps"]) == 2  # the warm-up sweep is in no round
    table = sweep_time.render(result)
    assert "acceptance identical" in table and table.startswith("warm-up sweep, not in the rounds (reused): ")
    # each job keeps its median phases (CPU wall-clock ms here), and the table shows them per mode
    assert all(j["phase_ms_p50"]["step"] > 0 and j["phase_ms_p50"]["verify"] > 0
               for sweep in by_mode.values() for j in sweep["jobs"])
    assert "Median ms of a step's phases (reused / isolated):" in table


def _sweep(mode: str, gpu: str | None) -> dict:
    job = {"k": 1, "status": "ok", "acceptance_length": 1.8, "output_tokens_per_s": 100.0, "startup_s": dict.fromkeys(sweep_time.STARTUP_PHASES, 1.0),
           "gpu": gpu, "git_sha": "abc1234" if gpu else None}
    return {"mode": mode, "wall_s": 10.0, "returncode": 0, "jobs": [job],
            "startup_sum_s": dict.fromkeys(sweep_time.STARTUP_PHASES, 1.0)}


def test_table_says_which_gpu_the_jobs_ran_on_and_nothing_for_cpu_runs():
    gpu = {"modes": ["reused", "isolated"], "acceptance_mismatches": [],
           "sweeps": [_sweep("reused", "NVIDIA H200"), _sweep("isolated", "NVIDIA H200")]}
    assert sweep_time.render(gpu).startswith("Jobs ran on: NVIDIA H200, commit abc1234.\n\n| mode |")
    cpu = {**gpu, "sweeps": [_sweep("reused", None), _sweep("isolated", None)]}
    assert sweep_time.render(cpu).startswith("| mode |")


def test_phase_table_joins_the_modes_and_is_left_out_for_results_without_phases():
    result = {"modes": ["reused", "isolated"], "acceptance_mismatches": [],
              "sweeps": [_sweep("reused", None), _sweep("isolated", None)]}
    assert "Median ms" not in sweep_time.render(result)  # results written before the jobs kept their phases
    for sweep, step in zip(result["sweeps"], (2.0, 1.5)):
        sweep["jobs"][0]["phase_ms_p50"] = {"step": step, "verify": 1.0, "draft": step - 1.0, "schedule": None}
    assert sweep_time.render(result).endswith("| k | step ms | verify ms | draft ms | schedule ms |\n"
                                              "|---|---|---|---|---|\n"
                                              "| 1 | 2.000 / 1.500 | 1.000 / 1.000 | 1.000 / 0.500 | - / - |")



def test_compiling_is_given_for_results_whose_jobs_record_it():
    result = {"modes": ["reused", "isolated"], "acceptance_mismatches": [],
              "sweeps": [_sweep("reused", None), _sweep("isolated", None)]}
    assert "compiling" not in sweep_time.render(result)  # results written before start-up recorded it
    result["sweeps"][1]["jobs"][0]["startup_s"] = {"engine_build": 9.0, "graph_capture": 8.0, "compile": 6.5}
    lines = sweep_time.render(result).splitlines()
    assert "isolated: of engine_build, graph capture 8.0 s summed over jobs, of it compiling 6.5 s" in lines[5]
    assert not any(line.startswith("reused: of engine_build") for line in lines)


def test_the_gpu_as_passes_ended_is_tabled_per_k_and_mode():
    result = {"modes": ["reused", "isolated"], "acceptance_mismatches": [],
              "sweeps": [_sweep("reused", "NVIDIA H100"), _sweep("isolated", "NVIDIA H100")]}
    assert "SM clock" not in sweep_time.render(result)  # results written before jobs kept the readings
    for sweep, clocks in zip(result["sweeps"], ((1755, 1745), (1980, None))):
        sweep["jobs"][0]["gpu_after_passes"] = [{"sm_clock_mhz": c, "temperature_c": 60, "power_w": 300.0}
                                                for c in clocks]
    assert sweep_time.render(result).endswith("| k | SM clock MHz | temperature °C | power W |\n|---|---|---|---|\n"
                                              "| 1 | 1750 / 1980 | 60 / 60 | 300 / 300 |")
    repeat = {"machine": {"after": {"gpu": {"sm_clock_mhz": 1500, "temperature_c": 70, "power_w": 410.5,
                                            "source": "nvidia-smi"}}}}
    assert sweep_time.gpu_reading(repeat) == {"sm_clock_mhz": 1500, "temperature_c": 70, "power_w": 410.5}
    assert sweep_time.gpu_reading({"machine": {"after": {"time": "t"}}}) == dict.fromkeys(sweep_time.GPU_READINGS)
