"""The group's side of a sweep measuring in rounds (`specexp.group_rounds`): jobs start one after another, run
only between a go and their next report, a failing job reports it ended and the others go on, and an
interruption makes every waiting job raise."""

from __future__ import annotations

import os
import threading

import pytest

from specexp import interrupts
from specexp.group_rounds import GroupPace, run_group_in_rounds


class FakeSweep:
    """The sweep's end of the pipes, in a thread: answers each report with a go, in the order given."""

    def __init__(self, plan: list[str]) -> None:
        to_group_r, self.to_group_w = os.pipe()
        self.from_group_r, from_group_w = os.pipe()
        self.fds = (to_group_r, from_group_w)
        self.plan, self.reports = plan, []

    def serve(self, starts: int) -> None:
        out, inp = os.fdopen(self.to_group_w, "w"), os.fdopen(self.from_group_r, "r")
        for _ in range(starts):
            self.reports.append(inp.readline().strip())
        for message in self.plan:
            out.write(message + "\n")
            out.flush()
            self.reports.append(inp.readline().strip())
        out.close()


def test_jobs_run_one_at_a_time_in_the_sweep_s_order_and_a_failure_ends_only_its_job():
    events, running = [], []

    def run_job(index: int, pace) -> None:
        running.append(index)
        assert len(running) == 1, "two jobs ran at once"
        events.append((index, "start"))
        if index == 1:
            running.pop()
            raise RuntimeError("job 1 fails while it starts")
        for r in range(2):
            running.pop()
            slot = pace.wait(f"repeat {r}")
            running.append(index)
            events.append((index, f"repeat {r} slot {slot}"))
        running.pop()
        pace.wait("finish")
        running.append(index)
        events.append((index, "record"))
        running.pop()

    sweep = FakeSweep(["go 0 0", "go 2 1", "go 0 2", "go 2 3", "go 0", "go 2"])
    group = GroupPace(*sweep.fds, num_jobs=3, on_resume=lambda i: None)
    parent = threading.Thread(target=sweep.serve, args=(3,))
    parent.start()
    run_group_in_rounds(3, run_job, group)
    parent.join(timeout=10)
    assert sweep.reports == ["0 repeat 0", "1 ended", "2 repeat 0", "0 repeat 1", "2 repeat 1", "0 finish",
                             "2 finish", "0 ended", "2 ended"]
    assert events == [(0, "start"), (1, "start"), (2, "start"), (0, "repeat 0 slot 0"), (2, "repeat 0 slot 1"),
                      (0, "repeat 1 slot 2"), (2, "repeat 1 slot 3"), (0, "record"), (2, "record")]


def test_a_closed_pipe_stops_every_waiting_job_as_interrupted():
    stopped = []

    def run_job(index: int, pace) -> None:
        try:
            pace.wait("repeat 0")
        except interrupts.RunInterrupted as e:
            stopped.append((index, e.signum))
            raise

    sweep = FakeSweep([])
    group = GroupPace(*sweep.fds, num_jobs=2, on_resume=lambda i: None)
    parent = threading.Thread(target=sweep.serve, args=(2,))
    parent.start()
    run_group_in_rounds(2, run_job, group)
    parent.join(timeout=10)
    assert sorted(stopped) == [(0, 15), (1, 15)]


def test_a_bad_line_from_the_sweep_is_named():
    sweep = FakeSweep(["hello"])
    group = GroupPace(*sweep.fds, num_jobs=1, on_resume=lambda i: None)
    parent = threading.Thread(target=sweep.serve, args=(1,))
    parent.start()
    with pytest.raises(RuntimeError, match="the sweep sent 'hello'"):
        run_group_in_rounds(1, lambda i, pace: pace.wait("repeat 0"), group)
    parent.join(timeout=10)


def test_the_jobs_engine_work_runs_on_the_main_thread():
    """What a job hands to `call` (its engine's build and passes) runs on the process's main thread, its result or
    exception handed back to the job's thread."""
    seen = []

    def run_job(index: int, pace) -> None:
        seen.append(pace.group.call(lambda: threading.current_thread() is threading.main_thread()))
        with pytest.raises(ValueError, match="bad pass"):
            pace.group.call(lambda: (_ for _ in ()).throw(ValueError("bad pass")))
        pace.wait("repeat 0")
        seen.append(pace.group.call(lambda: threading.current_thread().name))

    sweep = FakeSweep(["go 0 0", "go 1 1"])
    group = GroupPace(*sweep.fds, num_jobs=2, on_resume=lambda i: None)
    parent = threading.Thread(target=sweep.serve, args=(2,))
    parent.start()
    run_group_in_rounds(2, run_job, group)
    parent.join(timeout=10)
    assert seen == [True, True, "MainThread", "MainThread"]
