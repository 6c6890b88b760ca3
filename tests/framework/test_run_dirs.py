"""Every run gets a directory of its own: claimed atomically, a suffix when the name is taken, and never a
directory another live run owns (two runs started in the same second used to overwrite each other)."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest
from cli_runs import TINY_RUN, error_line, run_cli, run_dirs, start_cli

from specexp import run_dirs as rd
from specexp.errors import ConfigError


def _claim_in_a_process(base: str, queue) -> None:
    queue.put(str(rd.claim_run_dir(base)))


def test_processes_claiming_one_name_at_once_get_distinct_directories(tmp_path):
    base = tmp_path / "runs" / "run_20260101-120000"
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim_in_a_process, args=(str(base), queue)) for _ in range(6)]
    for p in procs:
        p.start()
    claimed = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert len(set(claimed)) == 6
    assert sorted(claimed) == sorted([str(base)] + [f"{base}-{i}" for i in range(1, 6)])
    for path in claimed:
        assert rd.owner_of(path) is not None, "each claimed directory records its owner"


def test_a_directory_holding_another_run_is_never_reused(tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "result.json").write_text("{}")
    assert rd.claim_run_dir(taken) == tmp_path / "taken-1"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert rd.claim_run_dir(empty) == empty, "an empty directory the user made is free"


def test_a_directory_a_live_run_owns_cannot_be_taken_over(tmp_path):
    run_dir = rd.claim_run_dir(tmp_path / "live")
    with pytest.raises(ConfigError, match=f"in use by a live run .*pid {os.getpid()}"):
        rd.take_over(run_dir)
    rd.release(run_dir)
    rd.take_over(run_dir)  # released: free to resume
    assert rd.owner_of(run_dir)["pid"] == os.getpid()


def test_a_stale_owner_left_by_a_killed_run_does_not_block(tmp_path):
    run_dir = tmp_path / "stale"
    run_dir.mkdir()
    (run_dir / rd.OWNER_FILE).write_text(json.dumps({"pid": 2**22 + 12345, "host": rd.hostname(), "start": 0}))
    rd.take_over(run_dir)
    assert rd.owner_of(run_dir)["pid"] == os.getpid()


def test_a_second_run_into_a_taken_directory_leaves_the_first_intact(tmp_path):
    runs = tmp_path / "runs"
    fixed = runs / "fixed"
    first = run_cli(["run", *TINY_RUN, f"hydra.run.dir={fixed}"], runs)
    assert first.returncode == 0, first.stderr
    before = {name: (fixed / name).read_bytes() for name in ("result.json", "outputs.jsonl", "steps.parquet")}
    second = run_cli(["run", *TINY_RUN, "workload.seed=7", f"hydra.run.dir={fixed}"], runs)
    assert second.returncode == 0, second.stderr
    assert {name: (fixed / name).read_bytes() for name in before} == before
    moved = runs / "fixed-1"
    assert f"{fixed} holds another run: writing to {moved}" in second.stderr
    assert json.loads((moved / "result.json").read_text())["config"]["workload"]["seed"] == 7


def test_two_runs_started_together_on_one_name_get_their_own_directories(tmp_path):
    """What two runs started in the same second (or two array tasks given one directory) do."""
    runs = tmp_path / "runs"
    procs = [start_cli(["run", *TINY_RUN, f"workload.seed={seed}", f"hydra.run.dir={runs}/same"], runs) for seed in (1, 2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    dirs = run_dirs(runs)
    assert len(dirs) == 2
    seeds = {json.loads((d / "result.json").read_text())["config"]["workload"]["seed"] for d in dirs}
    assert seeds == {1, 2}, "each directory holds its own run's complete record"


def test_an_unwritable_runs_directory_is_refused_before_anything_loads(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    proc = run_cli(["run", *TINY_RUN], not_a_dir / "runs")
    assert proc.returncode == 2
    line = error_line(proc)
    assert f"cannot create the run directory {not_a_dir / 'runs'}" in line and "SPECEXP_RUNS_DIR" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_existing_read_only_run_directory_is_refused(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    proc = run_cli(["run", *TINY_RUN, f"hydra.run.dir={read_only}"], tmp_path / "runs")
    assert proc.returncode == 2
    assert "cannot write" in error_line(proc)
