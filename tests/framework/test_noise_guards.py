"""Noise guards decide from recorded readings: a busy machine, repeats that disagree, a shared GPU, other jobs
of a parallel sweep running beside a job. The decisions are checked on recorded values (no timing thresholds
that could flake), the wiring into a run once."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from specexp.cli import compose_config
from specexp.experiment import RunContext, execute
from specexp.measure import guards, machine, overlap

# Readings recorded on the project's 2-core machine: while two other sweeps ran, and with nothing else running.
LOADED = {"before": {"load_avg": [3.41, 2.9, 1.7], "cpu_count": 2}}
LOADED_REPEATS = [{"machine": {"after": {"load_avg": [3.88, 3.0, 1.8], "cpu_count": 2}}}]
IDLE = {"before": {"load_avg": [0.31, 0.4, 0.5], "cpu_count": 2}}
IDLE_REPEATS = [{"machine": {"after": {"load_avg": [1.02, 0.5, 0.5], "cpu_count": 2}}}]
NVIDIA_SMI_GPU = "0, 1980, 2619, 1980, 41, 0, 74.52\n"
NVIDIA_SMI_APPS = "4242, 1520\n5151, 800\n"


def test_a_loaded_machine_is_busy_and_an_idle_one_is_not():
    assert guards.machine_busy([3.41, 3.88], 2)
    assert not guards.machine_busy([0.31, 1.02], 2)
    assert not guards.machine_busy([2.0], 2), "exactly one runnable thread per core is not oversubscribed"
    assert guards.machine_busy([1.2], 2, load_per_core=0.5)
    assert not guards.machine_busy([None], 2) and not guards.machine_busy([5.0], None)


def test_the_noise_report_of_a_loaded_machine_marks_every_timing_figure():
    noise = guards.noise_report(LOADED, LOADED_REPEATS, {}, 1.0, 0.05, own_pid=1)
    assert noise["flags"] == [guards.BUSY] and noise["figures"] == [guards.ALL_TIMING]
    assert len(noise["warnings"]) == 1 and "3.88 > 1 x 2 cores" in noise["warnings"][0]
    assert guards.is_marked(noise, "tpot_ms.p50")
    idle = guards.noise_report(IDLE, IDLE_REPEATS, {}, 1.0, 0.05, own_pid=1)
    assert idle == {"flags": [], "figures": [], "warnings": []}


def test_repeats_that_disagree_mark_only_their_figures():
    per_repeat = {"output_tokens_per_s": [188.7, 15.1, 12.6], "tpot_ms.p50": [5.0, 5.1, 4.95]}
    noise = guards.noise_report(IDLE, IDLE_REPEATS * 3, per_repeat, 1.0, 0.05, own_pid=1)
    assert noise["flags"] == [guards.DISAGREE] and noise["figures"] == ["output_tokens_per_s"]
    assert guards.is_marked(noise, "output_tokens_per_s") and not guards.is_marked(noise, "tpot_ms.p50")
    assert guards.disagreeing_figures({"x": [100.0]}, 0.0) == {}, "one repeat cannot disagree"


def test_other_processes_on_the_gpu_are_found_but_not_this_one_or_its_sibling_jobs():
    gpu = machine.parse_nvidia_smi(NVIDIA_SMI_GPU, NVIDIA_SMI_APPS)
    assert gpu["sm_clock_mhz"] == 1980 and gpu["temperature_c"] == 41 and gpu["power_w"] == pytest.approx(74.52)
    assert [p["pid"] for p in gpu["processes"]] == [4242, 5151]
    assert guards.other_gpu_processes(gpu, own_pid=4242) == [{"pid": 5151, "used_memory_mib": 800.0}]
    assert guards.other_gpu_processes(gpu, own_pid=4242, siblings=[5151]) == []
    noise = guards.noise_report({"before": {"gpu": gpu}}, [], {}, 1.0, 0.05, own_pid=4242)
    assert noise["flags"] == [guards.GPU_SHARED] and "5151" in noise["warnings"][0]


def test_nvidia_smi_fields_it_cannot_read_are_none():
    gpu = machine.parse_nvidia_smi("0, 1980, [N/A], 1980, 41, [Not Supported], [N/A]\n", "")
    assert gpu["memory_clock_mhz"] is None and gpu["utilization_pct"] is None and gpu["processes"] == []
    assert machine.parse_nvidia_smi("", "") is None


def test_a_jobs_gpu_is_read_under_the_name_the_machine_gives_it():
    assert machine.physical_gpu(0, None) == 0 and machine.physical_gpu(1, None) == 1
    assert machine.physical_gpu(0, "3") == 3 and machine.physical_gpu(1, "2, 5") == 5
    assert machine.physical_gpu(0, "GPU-8f0e") == "GPU-8f0e"
    assert machine.physical_gpu(0, "MIG-1c2d") is None, "a MIG slice is not a GPU nvidia-smi --id reads"
    assert machine.physical_gpu(1, "3") is None and machine.physical_gpu(0, "") is None


# Spans of three jobs of a sweep on two GPUs (seconds): 0 and 1 start together, 2 takes job 0's GPU after it.
SPANS = [{"job": 0, "start_s": 100.0, "end_s": 160.0, "devices": [0]},
         {"job": 1, "start_s": 100.5, "end_s": None, "devices": [1]},
         {"job": 2, "start_s": 160.2, "end_s": 175.0, "devices": [0]}]


def test_overlap_is_the_time_two_spans_share():
    assert overlap.overlap_s(0, 10, 5, 20) == 5 and overlap.overlap_s(0, 10, 10, 20) == 0
    assert overlap.overlap_s(0, 10, 12, 20) == 0 and overlap.overlap_s(2, 3, 0, 10) == 1


def test_a_job_lists_the_jobs_that_ran_beside_it_and_while_it_measured():
    # job 1 is still running at 170 s; it measured from 150 s to 165 s
    seen = overlap.concurrent_jobs(1, SPANS, now_s=170.0, measured=(150.0, 165.0))
    assert seen == [{"job": 0, "devices": [0], "overlap_s": 59.5, "measured_overlap_s": 10.0},
                    {"job": 2, "devices": [0], "overlap_s": 9.8, "measured_overlap_s": 4.8}]
    # job 2 measured after job 0 had ended: only job 1 ran beside it
    assert [c["job"] for c in overlap.concurrent_jobs(2, SPANS, now_s=175.0, measured=(170.0, 174.0))] == [1]
    assert overlap.concurrent_jobs(0, SPANS[:1], now_s=170.0) == [], "alone on the host"
    assert overlap.concurrent_jobs(7, SPANS, now_s=170.0) == [], "a job without a span overlaps nothing"


def test_jobs_that_ran_while_a_job_measured_mark_its_timings_disturbed():
    beside = overlap.concurrent_jobs(1, SPANS, now_s=170.0, measured=(150.0, 165.0))
    noise = guards.noise_report(IDLE, IDLE_REPEATS, {}, 1.0, 0.05, own_pid=1, concurrent=beside)
    assert noise["flags"] == [guards.OVERLAPPED] and noise["figures"] == [guards.ALL_TIMING]
    assert noise["warnings"] == [("other jobs of this sweep ran on this host while it measured (jobs 0: 10.0 s,"
                                  " 2: 4.8 s): its timings are marked disturbed")]
    assert guards.is_marked(noise, "output_tokens_per_s")
    # job 2 measured while job 1 still ran
    beside_2 = overlap.concurrent_jobs(2, SPANS, now_s=175.0, measured=(170.0, 174.0))
    assert guards.noise_report(IDLE, IDLE_REPEATS, {}, 1.0, 0.05, 1, concurrent=beside_2)["flags"] == [guards.OVERLAPPED]
    measured_alone = [{**c, "measured_overlap_s": 0.0} for c in beside]
    calm = guards.noise_report(IDLE, IDLE_REPEATS, {}, 1.0, 0.05, own_pid=1, concurrent=measured_alone)
    assert calm == {"flags": [], "figures": [], "warnings": []}, "overlap outside the measurement disturbs nothing"


def test_a_reading_of_this_machine_has_its_load_and_cores():
    reading = machine.snapshot("cpu")
    assert reading["cpu_count"] >= 1 and len(reading["load_avg"]) == 3 and "gpu" not in reading


def _tiny_run(tmp_path, name: str, load_per_core: float) -> dict:
    overrides = ["workload.num_prompts=1", "workload.input_len=6", "workload.output_len=4", "tracking=disabled",
                 "measure.repeats=2", f"measure.busy_load_per_core={load_per_core}"]
    cfg = OmegaConf.to_container(compose_config(overrides), resolve=True)
    return execute(cfg, RunContext(run_dir=tmp_path / name, experiment="guards"))


def test_a_run_records_its_readings_and_warns_in_one_line_exactly_when_they_say_busy(tmp_path, capfd):
    """The wiring, once: the record holds the readings before and after each repeat, and its noise flag and
    stderr warning follow the decision on them. A threshold no load reaches never fires; threshold 0 fires
    whenever the recorded load is above 0 (a machine that has just run this test)."""
    for name, load_per_core in (("calm", 1e9), ("strict", 0.0)):
        record = _tiny_run(tmp_path, name, load_per_core)
        err = capfd.readouterr().err
        on_disk = json.loads((tmp_path / name / "result.json").read_text())
        measure, repeats = on_disk["measure"], on_disk["repeats"]
        loads = [measure["machine"]["before"]["load_avg"][0], *(r["machine"]["after"]["load_avg"][0] for r in repeats)]
        cpus = measure["machine"]["before"]["cpu_count"]
        busy = guards.machine_busy(loads, cpus, load_per_core)
        assert (guards.BUSY in record["metrics"]["noise"]["flags"]) == busy
        lines = [line for line in err.splitlines() if "the machine was busy" in line]
        assert len(lines) == (1 if busy else 0), err
        if load_per_core == 1e9:
            assert not busy
        elif max(loads) > 0:
            assert busy and lines[0].startswith("specexp: warning: ")
