"""``python -m specexp resume SWEEP_DIR`` (or ``run ... +resume=SWEEP_DIR``) runs again only the jobs without
an ``ok`` record, in the same job directories and the same W&B group."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from cli_runs import run_cli

from specexp import launch
from specexp import run_dirs as rd
from specexp.errors import ConfigError


@pytest.fixture(scope="module")
def failed_sweep(tmp_path_factory, tiny_llama_dir, tiny_llama_draft_dir):
    """A finished two-job sweep whose job 0 failed after it started (its draft's config.json did not match its
    weights) and whose job 1 is ok; the draft is repaired afterwards. Returns (sweep_dir, overrides).
    Shared by this module's tests, in file order: the last one resumes it."""
    tmp_path = tmp_path_factory.mktemp("failed-sweep")
    broken = tmp_path / "draft-a"
    shutil.copytree(tiny_llama_draft_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "intermediate_size": config["intermediate_size"] + 8}))
    sweep_dir = tmp_path / "sweep"
    overrides = ["pair=local", f"pair.target.path={tiny_llama_dir}", f"pair.draft.path={broken},{tiny_llama_draft_dir}",
                 "workload.num_prompts=1", "workload.input_len=6", "workload.output_len=4", "tracking=disabled",
                 "speculator.num_speculative_tokens=2"]
    proc = run_cli(["run", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"], tmp_path / "runs")
    assert proc.returncode == 1 and "sweep: 2 jobs, 1 ok, 1 not ok" in proc.stdout, proc.stderr
    assert f"python -m specexp resume {sweep_dir}" in proc.stdout
    shutil.copy(tiny_llama_draft_dir / "config.json", broken / "config.json")  # the fix
    return sweep_dir, overrides


def test_run_with_resume_takes_the_same_overrides_or_none(tmp_path, failed_sweep):
    sweep_dir, overrides = failed_sweep
    plan = launch.plan_run(["run", "-m", *overrides, f"+resume={sweep_dir}"])
    assert plan.resume_dir == sweep_dir and plan.keep == {1} and len(plan.jobs) == 2
    assert launch.plan_run(["run", f"+resume={sweep_dir}"]).keep == {1}
    with pytest.raises(ConfigError, match="resume: the overrides differ .*new: \\['sampling.max_new_tokens=9'\\]"):
        launch.plan_run(["run", *overrides, "sampling.max_new_tokens=9", f"+resume={sweep_dir}"])


def test_a_sweep_a_live_run_owns_cannot_be_resumed(tmp_path, failed_sweep):
    sweep_dir, _ = failed_sweep
    (sweep_dir / rd.OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "host": rd.hostname(), "start": None}))
    try:
        proc = run_cli(["resume", str(sweep_dir)], tmp_path / "runs")
    finally:
        (sweep_dir / rd.OWNER_FILE).unlink()
    assert proc.returncode == 2
    assert f"is in use by a live run (pid {os.getpid()})" in proc.stderr


def test_resume_needs_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="holds neither multirun.yaml"):
        launch.plan_run(["resume", str(tmp_path)])


def test_resume_runs_only_the_jobs_without_an_ok_record(tmp_path, failed_sweep):
    sweep_dir, _ = failed_sweep
    kept = (sweep_dir / "1" / "result.json").read_bytes()
    proc = run_cli(["resume", str(sweep_dir)], tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    assert "sweep: 2 jobs, 2 ok (1 kept from before), 0 not ok" in proc.stdout
    assert (sweep_dir / "1" / "result.json").read_bytes() == kept, "an ok job is not run again"
    record = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert record["status"] == "ok"
    assert record["wandb"]["group"] == sweep_dir.name == json.loads(kept)["wandb"]["group"]
    assert json.loads((sweep_dir / "0" / "result.previous.json").read_text())["status"] == "failed"
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0", "1"]
    assert rd.owner_of(sweep_dir) is None, "the resumed sweep released its directory"
