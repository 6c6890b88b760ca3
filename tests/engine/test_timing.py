"""PhaseTimer: phases close at the next mark, repeated names add up, a step's marks stay readable one step
late, and a GPU timer reuses its events."""

from __future__ import annotations

import time

import pytest
import torch

from specexp.engine.timing import PhaseTimer


def _step(timer: PhaseTimer, sleep_s: dict[str, float], order: list[str]) -> dict[str, float]:
    timer.start(order[0])
    for i, name in enumerate(order):
        if i:
            timer.mark(name)
        if timer.cuda:
            torch.cuda._sleep(int(sleep_s[name] * 1.4e9))  # ~cycles at a GPU's clock: device time, not host
        else:
            time.sleep(sleep_s[name])
    timer.mark("end")
    return timer.elapsed_ms()


def test_cpu_phases_close_at_the_next_mark_and_repeated_names_add_up():
    timer = PhaseTimer(torch.device("cpu"))
    sleeps = {"a": 0.004, "b": 0.012}
    out = _step(timer, sleeps, ["a", "b", "a"])
    assert set(out) == {"a", "b"}  # the closing mark's name is not a phase
    assert out["a"] >= 8.0 and out["b"] >= 12.0
    assert out["b"] < 12.0 + 50.0  # a phase is not charged the whole step
    again = _step(timer, {"c": 0.001}, ["c"])  # a new step forgets the last one's phases
    assert set(again) == {"c"}


def test_a_steps_marks_read_one_step_late_are_its_own():
    timer = PhaseTimer(torch.device("cpu"))
    _step(timer, {"a": 0.010}, ["a"])
    late = timer.stamps()
    _step(timer, {"b": 0.001}, ["b"])
    out = late.elapsed_ms()
    assert set(out) == {"a"} and out["a"] >= 10.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_timer_times_device_work_and_reuses_its_events():
    timer = PhaseTimer(torch.device("cuda"))
    _step(timer, {"a": 0.001, "b": 0.001}, ["a", "b"])  # warm-up: the first kernel of a process loads its module
    _step(timer, {"a": 0.001, "b": 0.001}, ["a", "b"])  # and the second bank's
    banks = [list(bank) for bank in timer._banks]
    first = _step(timer, {"a": 0.002, "b": 0.006}, ["a", "b"])
    first_late = timer.stamps()
    second = _step(timer, {"a": 0.006, "b": 0.002}, ["a", "b"])
    assert [list(bank) for bank in timer._banks] == banks and all(len(b) == 3 for b in banks)  # made once
    assert first["b"] > first["a"] and second["a"] > second["b"]  # each step reads its own times
    assert first_late.elapsed_ms() == first  # one step late, still the first step's events
