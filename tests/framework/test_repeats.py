"""Repeats and warm-up: one engine per job, warm-up discarded, every repeat recorded and summarised, and a
sweep's repeats measured in rounds (job 0, job 1, job 0, job 1, ...) in exactly the order stated."""

from __future__ import annotations

import datetime as dt
import json
import signal

import pandas as pd
import pytest
from cli_runs import TINY_RUN, run_cli, start_cli
from hypothesis import given
from hypothesis import strategies as st

from specexp import launch
from specexp.errors import ConfigError
from specexp.measure.rounds import BASIC_LAUNCHER, interleave_decision, interleaved_order


def test_rounds_take_repeat_r_of_every_job_in_job_order():
    assert interleaved_order([3, 3]) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert interleaved_order([2, 3, 1]) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (1, 2)]


@given(st.lists(st.integers(0, 5), max_size=6))
def test_every_repeat_runs_once_and_no_job_starts_round_r_plus_1_before_all_have_done_round_r(repeats):
    order = interleaved_order(repeats)
    assert sorted(order) == sorted((job, r) for job, n in enumerate(repeats) for r in range(n))
    rounds = [r for _, r in order]
    assert rounds == sorted(rounds)
    for job in range(len(repeats)):
        assert [r for j, r in order if j == job] == list(range(repeats[job]))


def _configs(n: int = 2, **overrides) -> list[dict]:
    base = {"measure": {"repeats": 3, "interleave": True}, "isolate_sweep_jobs": True, "backend": {"name": "native"}}
    return [{**base, **overrides} for _ in range(n)]


@pytest.mark.parametrize(("configs", "launcher", "interleaves", "why"), [
    (_configs(), BASIC_LAUNCHER, True, "rounds"),
    (_configs(1), BASIC_LAUNCHER, False, "single job"),
    (_configs(measure={"repeats": 1, "interleave": True}), BASIC_LAUNCHER, False, "measure.repeats=1"),
    (_configs(measure={"repeats": 3, "interleave": False}), BASIC_LAUNCHER, False, "measure.interleave=false"),
    (_configs(isolate_sweep_jobs=False), BASIC_LAUNCHER, False, "isolate_sweep_jobs=false"),
    (_configs(), "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", False, "SlurmLauncher"),
    (_configs(backend={"name": "vllm"}), BASIC_LAUNCHER, False, "vllm"),
])
def test_a_sweep_interleaves_only_where_its_jobs_can_stay_resident(configs, launcher, interleaves, why):
    decided, note = interleave_decision(configs, launcher)
    assert decided is interleaves and why in note


def test_a_sweep_plan_says_whether_it_interleaves():
    plan = launch.plan_run(["run", "-m", *TINY_RUN, "measure.repeats=2", "speculator.num_speculative_tokens=0,1"])
    assert plan.interleave[0]
    plan = launch.plan_run(["run", "-m", *TINY_RUN, "speculator.num_speculative_tokens=0,1"])
    assert plan.interleave == (False, "one repeat per job (measure.repeats=1): nothing to interleave")


@pytest.mark.parametrize("override", ["measure.repeats=0", "measure.warmup_requests=-1", "measure.interleave=3",
                                      "+measure.repeat=2"])
def test_bad_measure_values_are_refused(override):
    with pytest.raises(ConfigError) as info:
        launch.plan_run(["run", *TINY_RUN, override])
    assert "measure." in str(info.value)


def _started(record: dict) -> list[dt.datetime]:
    return [dt.datetime.fromisoformat(r["started_at"]) for r in record["repeats"]]


def test_a_sweep_measures_its_repeats_in_rounds_on_one_engine_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(["run", "-m", *TINY_RUN, "measure.repeats=2", "speculator.num_speculative_tokens=0,2",
                    "sweep.reuse_engine=false", f"hydra.sweep.dir={sweep}"], tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    a, b = (json.loads((sweep / str(n) / "result.json").read_text()) for n in (0, 1))
    assert [r["measure"]["order"] for r in (a, b)] == ["interleaved", "interleaved"]
    assert [r["sweep_slot"] for r in a["repeats"]] == [0, 2] and [r["sweep_slot"] for r in b["repeats"]] == [1, 3]
    (a0, a1), (b0, b1) = _started(a), _started(b)
    assert a0 < b0 < a1 < b1, "A B A B"
    assert a["env"]["pid"] != b["env"]["pid"] and a["measure"]["engine_builds"] == 1
    for record in (a, b):
        assert record["metrics"]["num_repeats"] == 2 and record["metrics"]["intervals"]["output_tokens_per_s"]["n"] == 2
        per_repeat = [r["figures"]["output_tokens_per_s"] for r in record["repeats"]]
        assert record["metrics"]["output_tokens_per_s"] == pytest.approx(sum(per_repeat) / 2)
        assert record["repeats"][1]["machine"]["after"]["cpu_count"] >= 1
    steps = pd.read_parquet(sweep / "1" / "steps.parquet")
    assert sorted(steps["repeat"].unique()) == [0, 1]
    assert "sweep: job 1 repeat 2/2 (slot 3)" in proc.stdout


def test_a_single_run_serves_its_warm_up_then_its_repeats_back_to_back(tmp_path):
    run_dir = tmp_path / "single"
    proc = run_cli(["run", *TINY_RUN, "workload.num_prompts=2", "measure.repeats=3", "measure.warmup_requests=3",
                    f"hydra.run.dir={run_dir}"], tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run_dir / "result.json").read_text())
    measure = record["measure"]
    assert measure["order"] == "back_to_back" and measure["warmup_requests"] == 3 and measure["engine_builds"] == 1
    assert [r["repeat"] for r in record["repeats"]] == [0, 1, 2] and _started(record) == sorted(_started(record))
    assert record["metrics"]["num_requests"] == 2, "warm-up requests are not counted"
    assert len((run_dir / "outputs.jsonl").read_text().splitlines()) == 2
    assert "mean ± std of 3 repeats" in proc.stdout


def test_an_interrupted_sweep_stops_every_job_waiting_for_its_round_and_records_it(tmp_path):
    sweep = tmp_path / "sweep"
    proc = start_cli(["run", "-m", "workload.num_prompts=1", "workload.input_len=6", "workload.output_len=1500",
                      "tracking=disabled", "measure.repeats=2", "measure.warmup_requests=0",
                      "speculator.num_speculative_tokens=0,1", f"hydra.sweep.dir={sweep}"], tmp_path / "runs")
    seen = []
    for line in proc.stdout:  # job 0's first repeat is in flight, job 1 (its engine built) waits for its turn
        seen.append(line)
        if "sweep: job 0 repeat 1/2" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    statuses = [json.loads((sweep / str(n) / "result.json").read_text())["status"] for n in (0, 1)]
    assert statuses == ["interrupted", "interrupted"], "".join(seen) + out
    assert "sweep: 2 jobs, 0 ok, 2 not ok (interrupted by SIGINT)" in out


def test_a_measured_pass_runs_with_the_heap_frozen_and_leaves_it_thawed():
    import gc

    from specexp.measure import loop

    frozen_inside = []
    result, record = loop._repeat(0, None, "cpu", {}, lambda: frozen_inside.append(gc.get_freeze_count()) or "done")
    assert result == "done" and record["repeat"] == 0 and record["wall_s"] >= 0
    assert frozen_inside[0] > 0  # the process's objects were out of the collector's view during the pass
    assert gc.get_freeze_count() == 0
