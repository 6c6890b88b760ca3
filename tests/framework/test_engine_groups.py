"""Sweep points that share one engine (`sweep.reuse_engine`, `specexp.sweep_groups`): which jobs group, that a
grouped sweep serves what isolated jobs serve in one process, and that a failing job leaves the group's other
records whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_runs import run_cli

from specexp.sweep_groups import plan_groups, reuse_key

BASE = {"pair": {"name": "tiny_lfm2"}, "engine": {"device": "cpu", "seed": 0, "max_model_len": "auto"},
        "speculator": {"num_speculative_tokens": 2, "synthetic_acceptance_rate": 0.7}, "sampling": {"temperature": 0},
        "backend": {"name": "native"}, "short_conv": {}, "workload": {"name": "code"}, "measure": {"repeats": 1}}


def _job(**changes) -> dict:
    job = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        group, key = dotted.split("__")
        job[group][key] = value
    return job


def test_jobs_group_when_only_what_one_engine_changes_differs():
    jobs = [_job(), _job(speculator__num_speculative_tokens=4), _job(speculator__synthetic_acceptance_rate=0.9),
            _job(engine__seed=3), _job(workload__name="prose"), _job(measure__repeats=3),
            _job(speculator__num_speculative_tokens=0),          # the draft off on the group's engine
            _job(pair__name="tiny_llama"), _job(engine__max_model_len=512), _job(sampling__temperature=1.0),
            _job(backend__name="hf"), _job(pair__name="tiny_llama", speculator__num_speculative_tokens=3)]
    assert plan_groups(jobs) == [[0, 1, 2, 3, 4, 5, 6], [7, 11]]
    assert reuse_key({**_job(), "sweep": {"reuse_engine": False}}) is None
    assert reuse_key({**_job(), "isolate_sweep_jobs": False}) is None


def _outputs(job_dir: Path) -> list:
    return [json.loads(line)["output_token_ids"] for line in (job_dir / "outputs.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_grouped_sweep_serves_what_isolated_jobs_serve_in_one_process(tmp_path):
    """k = 0, 2, 4 on the demo pair: all three run in one process on one engine built at K = 4 (k = 0 with the
    draft off); every job's outputs and acceptance equal the same sweep's with reuse off."""
    sweep = ["run", "-m", "+exp=depth_sweep", "speculator.num_speculative_tokens=0,2,4", "measure.repeats=1",
             "workload.num_prompts=2", "sampling.max_new_tokens=16", "tracking=disabled"]
    on = run_cli([*sweep, f"hydra.sweep.dir={tmp_path / 'on'}"], tmp_path / "runs")
    off = run_cli([*sweep, "sweep.reuse_engine=false", f"hydra.sweep.dir={tmp_path / 'off'}"], tmp_path / "runs")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    records = {name: [json.loads((tmp_path / name / str(j) / "result.json").read_text()) for j in range(3)]
               for name in ("on", "off")}
    for j in range(3):
        assert _outputs(tmp_path / "on" / str(j)) == _outputs(tmp_path / "off" / str(j)), j
        acceptance = [records[name][j]["metrics"]["acceptance_length"] for name in ("on", "off")]
        assert acceptance[0] == acceptance[1], j
    assert all(r["env"]["kernels_launched_early"] is False for r in records["on"] + records["off"])  # a CPU
    pids = [r["env"]["pid"] for r in records["on"]]
    assert pids[0] == pids[1] == pids[2]
    assert len({r["env"]["pid"] for r in records["off"]}) == 3
    reuse = [r["metrics"].get("engine_reuse") for r in records["on"]]
    assert [r["served_before"] for r in reuse] == [0, 1, 2]
    assert all(r["engine_k"] == 4 and r["depths"] == [0, 2, 4] for r in reuse)
    assert records["on"][0]["metrics"]["num_draft_tokens"] == 0
    assert "shared one engine" in records["on"][2]["measure"]["order_note"]
    assert records["on"][2]["metrics"]["startup_s"]["engine_build"] == 0.0


def test_a_failing_job_leaves_the_group_s_other_records(tmp_path, monkeypatch):
    """A group of k = 1, 2, 3 in this process, k = 2's retarget raising: k = 2 is recorded failed with its error,
    k = 1 and 3 run on the one engine and are ok."""
    from specexp import launch
    from specexp.backends.native import NativeServer
    from specexp.experiment import RunContext
    from specexp.job_process import _run_group

    monkeypatch.setenv("SPECEXP_RUNS_DIR", str(tmp_path / "runs"))
    plan = launch.plan_run(["run", "-m", "+exp=depth_sweep", "speculator.num_speculative_tokens=1,2,3",
                            "measure.repeats=1", "workload.num_prompts=2", "sampling.max_new_tokens=8",
                            "tracking=disabled", "engine.max_model_len=256"])
    assert plan.groups == [{0, 1, 2}]
    retarget = NativeServer.retarget

    def failing(self, spec, first=False):
        if spec.speculator.num_speculative_tokens == 2:
            raise RuntimeError("k = 2 cannot be served")
        return retarget(self, spec, first)

    monkeypatch.setattr(NativeServer, "retarget", failing)
    jobs = [{"config": job.config, "context": RunContext(run_dir=tmp_path / str(job.num), experiment="depth_sweep",
                                                          sweep_dir=tmp_path, job_num=job.num).to_dict()}
            for job in plan.jobs]
    for job in plan.jobs:
        os.makedirs(tmp_path / str(job.num), exist_ok=True)
    assert _run_group(jobs, "shared") == 0
    records = [json.loads((tmp_path / str(j) / "result.json").read_text()) for j in range(3)]
    assert [r["status"] for r in records] == ["ok", "failed", "ok"]
    assert "k = 2 cannot be served" in records[1]["error"]
    assert records[2]["metrics"]["engine_reuse"]["served_before"] == 1


@pytest.mark.slow
def test_a_grouped_sweep_in_rounds_interleaves_and_serves_what_back_to_back_serves(tmp_path):
    """k = 1, 0, 2 (jobs 0, 1, 2) at T = 1, two repeats each, in rounds: the three share one process and one
    engine (k = 0 with the draft off), their repeats interleave in job order (slots 0..5 round by round), and every
    job's sampled outputs and acceptance equal those of the same sweep run back to back (each job's random state,
    counters and draft switch follow it)."""
    sweep = ["run", "-m", "+exp=depth_sweep", "speculator.num_speculative_tokens=1,0,2", "measure.repeats=2",
             "workload.num_prompts=2", "sampling.max_new_tokens=16", "sampling.temperature=1.0", "tracking=disabled"]
    rounds = run_cli([*sweep, f"hydra.sweep.dir={tmp_path / 'rounds'}"], tmp_path / "runs")
    back = run_cli([*sweep, "measure.interleave=false", f"hydra.sweep.dir={tmp_path / 'back'}"], tmp_path / "runs")
    assert rounds.returncode == 0 and back.returncode == 0, rounds.stderr + back.stderr
    records = {name: [json.loads((tmp_path / name / str(j) / "result.json").read_text()) for j in range(3)]
               for name in ("rounds", "back")}
    assert [[r["sweep_slot"] for r in rec["repeats"]] for rec in records["rounds"]] == [[0, 3], [1, 4], [2, 5]]
    assert all(rec["measure"]["order"] == "interleaved" for rec in records["rounds"])
    assert len({r["env"]["pid"] for r in records["rounds"]}) == 1
    for j in range(3):
        assert _outputs(tmp_path / "rounds" / str(j)) == _outputs(tmp_path / "back" / str(j)), j
        for key in ("acceptance_length", "num_accepted_tokens", "num_steps"):
            assert records["rounds"][j]["metrics"][key] == records["back"][j]["metrics"][key], (j, key)
    assert records["rounds"][2]["metrics"]["startup_s"]["engine_build"] == 0.0
