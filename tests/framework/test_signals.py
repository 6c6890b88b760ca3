"""SIGINT and SIGTERM stop a run or a sweep within seconds: the job in flight is recorded ``interrupted``,
every job that got a directory has a valid result.json, no process is left behind, and the exit status is
130 (SIGINT) or 143 (SIGTERM) — whether the signal reaches the sweep's main process alone (``kill PID``) or
its whole process group (Ctrl-C in a terminal, ``scancel``, ``docker stop``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from cli_runs import start_cli

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find survivors")

STOP_WITHIN_S = 10.0
# Two jobs of a sweep, each long enough (1500 tokens a prompt) to be in flight when the signal comes.
LONG_SWEEP = ["run", "-m", "workload.num_prompts=2", "workload.input_len=6", "workload.output_len=1500",
              "tracking=disabled", "speculator.num_speculative_tokens=0,1"]


def processes_of(runs_dir: Path) -> list[int]:
    """Pids of live processes started by a test's CLI call (they carry its SPECEXP_RUNS_DIR)."""
    marker = f"SPECEXP_RUNS_DIR={runs_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker in environ.split(b"\0") and state != "Z":
            pids.append(int(entry.name))
    return pids


def wait_for(predicate, timeout_s: float, proc) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the CLI ended before the signal: {proc.communicate()[1]}")
        time.sleep(0.1)
    pytest.fail("timed out waiting for the run to reach the point to interrupt")


def started(job_dir: Path):
    """True once the job is serving its prompts (models loaded, warm-up done): a signal then finds it in
    Python code between engine steps, not inside one long native call of a model's load."""
    log = job_dir / "specexp.log"
    return lambda: log.is_file() and "serving" in log.read_text()


def send(proc, signum: int, whom: str) -> float:
    """Send ``signum`` to the CLI's main process or its whole process group; returns the time it was sent."""
    if whom == "group":
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)
    return time.monotonic()


def assert_stopped(proc, sent_at: float, signum: int, runs_dir: Path) -> str:
    """Asserts the CLI stopped in time, with the right status and no survivor; returns its stdout."""
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - sent_at
    assert elapsed < STOP_WITHIN_S, f"took {elapsed:.1f} s to stop"
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 3
    while processes_of(runs_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of(runs_dir) == [], "a process of the run outlived it"
    return out


def job_records(sweep_dir: Path) -> dict[int, dict]:
    records = {}
    for job_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        record = json.loads((job_dir / "result.json").read_text())
        assert record["status"] in ("ok", "failed", "interrupted")
        assert {"config", "env", "metrics", "error"} <= set(record)
        records[int(job_dir.name)] = record
    return records


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("whom", ["main", "group"])
def test_a_signal_stops_a_sweep_and_records_the_job_in_flight(tmp_path, signum, whom):
    runs, sweep_dir = tmp_path / "runs", tmp_path / "sweep"
    proc = start_cli([*LONG_SWEEP, "sweep.reuse_engine=false", f"hydra.sweep.dir={sweep_dir}"], runs)
    wait_for(started(sweep_dir / "0"), 240, proc)
    time.sleep(0.2)  # generating now
    sent_at = send(proc, signum, whom)
    out = assert_stopped(proc, sent_at, signum, runs)
    records = job_records(sweep_dir)
    assert list(records) == [0], "the sweep launches no job after the signal"
    assert records[0]["status"] == "interrupted"
    assert records[0]["error"] == f"interrupted by {signal.Signals(signum).name}"
    assert records[0]["env"]["pid"] != proc.pid, "the job recorded itself, in its own process"
    assert f"sweep: 2 jobs, 0 ok, 1 not ok, 1 not run (interrupted by {signal.Signals(signum).name})" in out
    assert f"python -m specexp resume {sweep_dir}" in out


def test_a_signal_stops_a_sweep_whose_jobs_share_an_engine_and_records_every_job(tmp_path):
    """k = 0 and 1 in one process on one engine: Ctrl-C while k = 0 generates records both jobs interrupted (the
    one in flight and the one its process never reached), with the resume hint."""
    runs, sweep_dir = tmp_path / "runs", tmp_path / "sweep"
    proc = start_cli([*LONG_SWEEP, f"hydra.sweep.dir={sweep_dir}"], runs)
    wait_for(started(sweep_dir / "0"), 240, proc)
    time.sleep(0.2)  # generating now
    sent_at = send(proc, signal.SIGINT, "main")
    out = assert_stopped(proc, sent_at, signal.SIGINT, runs)
    records = job_records(sweep_dir)
    assert [records[n]["status"] for n in (0, 1)] == ["interrupted", "interrupted"]
    assert records[0]["env"]["pid"] != proc.pid, "the job recorded itself, in its own process"
    assert "sweep: 2 jobs, 0 ok, 2 not ok (interrupted by SIGINT)" in out
    assert f"python -m specexp resume {sweep_dir}" in out


@pytest.mark.parametrize("whom", ["main", "group"])
def test_ctrl_c_stops_every_job_of_a_parallel_sweep_and_launches_no_more(tmp_path, monkeypatch, whom):
    """Two jobs on two (fake) GPUs in flight, a third waiting for a slot: all stop, each recorded."""
    monkeypatch.setenv("SPECEXP_FAKE_GPUS", "2")
    runs, sweep_dir = tmp_path / "runs", tmp_path / "sweep"
    proc = start_cli([*LONG_SWEEP[:-1], "speculator.num_speculative_tokens=0,1,2", "sweep.devices=0,1",
                      f"hydra.sweep.dir={sweep_dir}"], runs)
    wait_for(lambda: started(sweep_dir / "0")() and started(sweep_dir / "1")(), 240, proc)
    time.sleep(0.2)  # both generating now
    sent_at = send(proc, signal.SIGINT, whom)
    out = assert_stopped(proc, sent_at, signal.SIGINT, runs)
    records = job_records(sweep_dir)
    assert [records[n]["status"] for n in (0, 1)] == ["interrupted", "interrupted"]
    assert all(records[n]["env"]["pid"] != proc.pid for n in (0, 1)), "each job recorded itself"
    if 2 in records:  # Hydra had made its directory while it waited for a slot: it never started
        assert records[2]["status"] == "interrupted" and records[2]["error"].endswith("before the run started")
    timeline = json.loads((sweep_dir / "sweep.json").read_text())
    assert sorted(s["job"] for s in timeline["jobs"]) == [0, 1], "the waiting job never got a slot"
    assert all(s["status"] == "interrupted" and s["end_s"] is not None for s in timeline["jobs"])
    assert "(interrupted by SIGINT)" in out


def test_ctrl_c_while_a_job_process_starts_leaves_a_record_and_no_traceback(tmp_path):
    runs, sweep_dir = tmp_path / "runs", tmp_path / "sweep"
    proc = start_cli([*LONG_SWEEP, f"hydra.sweep.dir={sweep_dir}"], runs)
    wait_for(lambda: (sweep_dir / "0").is_dir(), 240, proc)
    sent_at = send(proc, signal.SIGINT, "group")
    assert_stopped(proc, sent_at, signal.SIGINT, runs)
    records = job_records(sweep_dir)
    assert records[0]["status"] == "interrupted" and records[0]["error"].startswith("interrupted by SIGINT")


def test_sigterm_stops_a_single_run_and_records_it(tmp_path):
    runs, run_dir = tmp_path / "runs", tmp_path / "run"
    proc = start_cli(["run", *LONG_SWEEP[2:-1], f"hydra.run.dir={run_dir}"], runs)
    wait_for(started(run_dir), 240, proc)
    sent_at = send(proc, signal.SIGTERM, "main")
    assert_stopped(proc, sent_at, signal.SIGTERM, runs)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "interrupted" and record["error"] == "interrupted by SIGTERM"
