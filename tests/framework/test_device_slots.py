"""Device slots of a local sweep (specexp.device_slots): which GPUs a sweep has, how they split into slots, and
which job runs where. The assignment is checked as a property over job durations and failures, the GPUs
faked: the pool is driven by a discrete-event simulation of the jobs' processes, exactly as the sweep's
launcher drives it (a job submitted when Hydra hands it over, a job finished when its process ends)."""

from __future__ import annotations

import heapq
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specexp import device_slots as ds
from specexp.errors import ConfigError
from specexp.overrides import device_list

CUDA_JOB = {"engine": {"device": "cuda"}}


def cuda_jobs(n: int, **sweep) -> list[dict]:
    return [{**CUDA_JOB, "sweep": dict(sweep)} for _ in range(n)]


# ------------------------------------------------------------------------------------ assignment property


def simulate(num_slots: int, jobs: list[tuple[float, float | None]], handed_over_one_at_a_time: bool):
    """Run ``jobs`` (duration s, failure time s or None) through a :class:`SlotPool`. Returns per job its
    ``(slot, start, end)``; at every moment the pool changed, its busy map and waiting queue; and per job end
    ``(job, failed, freed slot, jobs waiting before, what started)``."""
    pool = ds.SlotPool(num_slots)
    clock, ends, runs, states, endings = 0.0, [], {}, [], []

    def start(assignments):
        for job, slot in assignments:
            assert job not in runs, f"job {job} started twice"
            duration, fails_at = jobs[job]
            end = clock + (min(fails_at, duration) if fails_at is not None else duration)
            runs[job] = (slot, clock, end)
            heapq.heappush(ends, (end, job))
        states.append((clock, dict(pool.busy), list(pool.waiting)))
        return assignments

    def next_end():
        nonlocal clock
        clock, job = heapq.heappop(ends)
        slot, waiting = runs[job][0], list(pool.waiting)
        failed = jobs[job][1] is not None and jobs[job][1] < jobs[job][0]
        endings.append((job, failed, slot, waiting, start(pool.finish(job))))

    for job in range(len(jobs)):
        start(pool.submit(job))
        while handed_over_one_at_a_time and job in pool.waiting:  # the launch blocks until the job starts
            next_end()
    while ends:
        next_end()
    return runs, states, endings


JOBS = st.lists(st.tuples(st.floats(0.01, 100.0), st.one_of(st.none(), st.floats(0.0, 50.0))), max_size=14)


@settings(max_examples=300, deadline=None)
@given(num_slots=st.integers(1, 5), jobs=JOBS, one_at_a_time=st.booleans(),
       gpus_per_job=st.integers(1, 3), spare=st.integers(0, 2))
def test_no_gpu_runs_two_jobs_every_slot_works_while_jobs_wait_and_every_job_runs_once(
        num_slots, jobs, one_at_a_time, gpus_per_job, spare):
    devices = list(range(num_slots * gpus_per_job + spare % gpus_per_job))  # the spare ones stay idle
    slots = ds.split_slots(devices, gpus_per_job)
    assert len(slots) == num_slots and len({gpu for slot in slots for gpu in slot}) == num_slots * gpus_per_job
    runs, states, _ = simulate(num_slots, jobs, one_at_a_time)

    assert sorted(runs) == list(range(len(jobs))), "every job runs exactly once"
    for _, busy, waiting in states:
        if waiting:
            assert len(busy) == num_slots, "a job waits only while every slot is busy"
        assert not set(busy.values()) & set(waiting)
    # never two jobs on one GPU at once (a failed job's GPU is free from the moment it failed)
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for slot, start, end in runs.values():
        for gpu in slots[slot]:
            by_gpu.setdefault(gpu, []).append((start, end))
    for spans in by_gpu.values():
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    # jobs start in the order they were handed over
    starts = [runs[j][1] for j in range(len(jobs))]
    assert starts == sorted(starts)


@settings(max_examples=200, deadline=None)
@given(num_slots=st.integers(1, 4), jobs=JOBS, one_at_a_time=st.booleans())
def test_a_job_that_ends_failed_or_not_hands_its_slot_to_the_first_waiting_job_at_once(num_slots, jobs, one_at_a_time):
    runs, _, endings = simulate(num_slots, jobs, one_at_a_time)
    for job, _failed, slot, waiting, started in endings:
        if waiting:
            assert started == [(waiting[0], slot)]
            assert runs[waiting[0]][1] == runs[job][2], "it starts the moment the slot is freed"
        else:
            assert started == []
    assert any(failed for _, failed, *_ in endings) or not any(
        f is not None and f < d for d, f in jobs), "the failures drawn were simulated"


def test_the_pool_refuses_a_job_twice_and_one_that_is_not_running():
    pool = ds.SlotPool(1)
    assert pool.submit("a") == [("a", 0)]
    assert pool.submit("b") == []
    with pytest.raises(ValueError, match="twice"):
        pool.submit("b")
    with pytest.raises(ValueError, match="not running"):
        pool.finish("b")
    assert pool.finish("a") == [("b", 0)]


# --------------------------------------------------------------------------------------- sweep.devices


@pytest.mark.parametrize(("value", "devices"), [
    (None, None), (0, (0,)), ("0,1", (0, 1)), ("3", (3,)), ([2, 0], (2, 0)), (["1", "2"], (1, 2)), ("[0, 1]", (0, 1)),
])
def test_devices_are_read_as_gpu_indices(value, devices):
    assert ds.parse_devices(value) == devices


@pytest.mark.parametrize(("value", "words"), [
    ("0,x", ["sweep.devices=0,x", "'x' is not a GPU index", "0,1"]),
    ([0, -1], ["'-1' is not a GPU index"]),
    ([0, 0], ["names GPU 0 twice"]),
    ([], ["names no GPU"]),
    (True, ["sweep.devices=True is not valid"]),
    ({"a": 1}, ["is not valid"]),
])
def test_bad_devices_are_one_line_naming_the_value(value, words):
    with pytest.raises(ConfigError) as e:
        ds.parse_devices(value)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_comma_list_of_devices_on_the_command_line_is_a_list_not_a_sweep():
    assert device_list("sweep.devices=0,1") == "sweep.devices=[0,1]"
    assert device_list("+sweep.devices=0,1") == "+sweep.devices=[0,1]"
    for kept in ("sweep.devices=0", "sweep.devices=[0,1]", "sweep.devices='0,1'", "speculator.num_speculative_tokens=1,2"):
        assert device_list(kept) == kept


def test_slots_take_the_devices_in_order_and_the_remainder_stays_idle():
    assert ds.split_slots([0, 1, 2, 3, 4], 2) == ((0, 1), (2, 3))
    plan = ds.plan_slots(cuda_jobs(2, devices=[4, 0, 2], gpus_per_job=2), None, ("0", "1", "2", "3", "4"))
    assert plan.slots == ((4, 0),) and plan.idle == (2,) and not plan.parallel
    assert plan.cuda_visible(0) == "4,0" and plan.label(0) == "GPUs 4,0"


def test_a_job_sees_the_gpus_its_slot_stands_for_outside_this_process():
    visible = ds.visible_entries("3,5,GPU-aa", 3)
    assert visible == ("3", "5", "GPU-aa")
    assert ds.visible_entries(None, 2) == ("0", "1")
    assert ds.visible_entries("", 0) == ()
    plan = ds.plan_slots(cuda_jobs(3, devices="1,2"), None, visible)
    assert [plan.cuda_visible(s) for s in range(2)] == ["5", "GPU-aa"]
    env = ds.env_for_slot(plan, 1, {"CUDA_VISIBLE_DEVICES": "3,5,GPU-aa", "PATH": "/bin"})
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-aa", "PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert ds.env_for_slot(plan, 0, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert plan.placement(1) == {"slot": 1, "devices": [2], "cuda_visible_devices": "GPU-aa", "fake_devices": False}


def test_every_visible_gpu_is_used_by_default():
    plan = ds.plan_slots(cuda_jobs(5), None, ("0", "1", "2"))
    assert plan.slots == ((0,), (1,), (2,)) and plan.parallel and plan.idle == ()


def test_without_a_gpu_a_sweep_runs_its_jobs_one_after_another():
    assert ds.plan_slots(cuda_jobs(3), None, ()) is None
    assert ds.plan_slots([{"engine": {"device": "cpu"}}] * 3, None, ()) is None


def test_cpu_jobs_take_no_slots_unless_the_gpus_are_fake():
    cpu = [{"engine": {"device": "cpu"}, "sweep": {"devices": None}}] * 2
    assert ds.plan_slots(cpu, None, ("0", "1")) is None
    fake = ds.plan_slots(cpu, None, ("0", "1"), fake=True)
    assert fake.parallel and fake.fake


@pytest.mark.parametrize(("configs", "launcher", "visible", "words"), [
    (cuda_jobs(2, devices="0,1"), None, (), ["sweep.devices=0,1 names GPUs", "shows none"]),
    ([{"engine": {"device": "cpu"}, "sweep": {"devices": [0]}}], None, ("0",), ["job 0 runs on engine.device=cpu"]),
    (cuda_jobs(2, devices="0,2"), None, ("0", "1"), ["GPU 2 is not visible", "sees 2 GPUs: 0-1"]),
    (cuda_jobs(2, gpus_per_job=3), None, ("0", "1"), ["sweep.gpus_per_job=3 is more than the 2 GPUs"]),
    (cuda_jobs(2, devices="0"), "hydra_plugins.specexp_cluster.specexp_launchers.SpecexpSlurmLauncher", ("0",),
     ["SpecexpSlurmLauncher places its jobs itself", "gpus_per_node"]),
    ([{**CUDA_JOB, "sweep": {"devices": [0]}}, {**CUDA_JOB, "sweep": {"devices": [1]}}], None, ("0", "1"),
     ["sweep.devices differs between the sweep's jobs"]),
    ([{**CUDA_JOB, "isolate_sweep_jobs": False, "sweep": {"devices": [0]}}], None, ("0",), ["isolate_sweep_jobs=false"]),
    ([{"engine": {"device": "cuda", "tensor_parallel_size": 2}, "backend": {"name": "vllm"}}], None, ("0", "1"),
     ["sweep job 0: engine.tensor_parallel_size=2 needs 2 GPUs", "sweep.gpus_per_job=2"]),
])
def test_settings_that_cannot_apply_are_refused_in_one_line(configs, launcher, visible, words):
    with pytest.raises(ConfigError) as e:
        ds.plan_slots(configs, launcher, visible)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_tensor_parallel_job_fits_a_slot_of_as_many_gpus():
    job = {"engine": {"device": "cuda", "tensor_parallel_size": 2}, "backend": {"name": "vllm"},
           "sweep": {"gpus_per_job": 2}}
    plan = ds.plan_slots([job] * 3, None, tuple("01234"))
    assert plan.slots == ((0, 1), (2, 3)) and plan.idle == (4,)


def test_a_cluster_launcher_left_at_the_defaults_places_jobs_itself():
    assert ds.plan_slots(cuda_jobs(2), "hydra_plugins.specexp_cluster.specexp_launchers.SpecexpLocalLauncher",
                         ("0", "1")) is None
