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


def test_a_group_process_that_dies_leaves_a_record_for_each_job_it_held(tmp_path, monkeypatch, capsys):
    """The sweep's side (`RoundsCoordinator.start_group`): a group process that reports its two jobs ready and is
    killed at the first go leaves both jobs recorded failed with the reason, and the lone job beside it goes on."""
    import subprocess
    import sys

    from specexp import sweep_rounds
    from specexp.experiment import RunContext
    from specexp.tracking import records

    script = ("import os, signal, sys\n"
              "r, w = int(sys.argv[1]), int(sys.argv[2])\n"
              "out, inp = os.fdopen(w, 'w'), os.fdopen(r)\n"
              "out.write('0 repeat 0\\n1 repeat 0\\n'); out.flush()\n"
              "inp.readline(); os.kill(os.getpid(), signal.SIGKILL)\n")
    lone = ("import os, sys\n"
            "r, w = int(sys.argv[1]), int(sys.argv[2])\n"
            "out, inp = os.fdopen(w, 'w'), os.fdopen(r)\n"
            "for label in ('repeat 0', 'repeat 1', 'finish'):\n"
            "    out.write(label + '\\n'); out.flush(); inp.readline()\n")

    def fake_start(payload, env=None, output=None, pass_fds=()):
        code = script if "group" in payload else lone
        fds = [str(fd) for fd in payload["pace_fds"]]
        return subprocess.Popen([sys.executable, "-c", code, *fds], pass_fds=tuple(pass_fds))

    monkeypatch.setattr(sweep_rounds, "start_job_process", fake_start)
    cfg = {"engine": {"device": "cpu"}, "measure": {"repeats": 2}}
    contexts = [RunContext(run_dir=tmp_path / str(n), experiment="x", sweep_dir=tmp_path, job_num=n) for n in range(3)]
    for ctx in contexts:
        ctx.run_dir.mkdir()
    rounds = sweep_rounds.RoundsCoordinator()
    assert rounds.start(cfg, contexts[1]) == "pending"
    assert rounds.start_group([(cfg, contexts[0]), (cfg, contexts[2])]) == {0: "pending", 2: "pending"}
    statuses = rounds.run()
    assert statuses[0] == statuses[2] == "failed"
    for n in (0, 2):
        assert "killed by SIGKILL" in records.read_result(contexts[n].run_dir)["error"]
    # the lone job still got both its rounds and its finish (a stand-in that writes no record: the parent's says so)
    assert "job 1 repeat 2/2 (slot 2)" in capsys.readouterr().out
    assert "exited with status 0" in records.read_result(contexts[1].run_dir)["error"]
