"""Loading run records and the derived metrics of specexp.analysis (synthetic records: no model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from analysis_records import synthetic_record, synthetic_steps

from specexp.analysis import graph_capture, load_runs, per_position, per_request, speedup, with_groups
from specexp.analysis.load import find_run_dirs, runs_dir, select_sweep
from specexp.analysis.wandb_source import load_wandb_rows, unflatten


def test_load_runs_gives_one_row_per_run_with_flattened_config_and_metrics(write_run, tmp_path):
    for k in (0, 1, 2):
        write_run(f"sweep_a/{k}", synthetic_record(k))
    df = load_runs(tmp_path / "runs")
    assert len(df) == 3
    assert list(df["k"]) == [0, 1, 2]
    assert list(df["speculator.num_speculative_tokens"]) == [0, 1, 2]
    for column in ("pair.name", "workload.name", "backend.name", "acceptance_length", "tpot_ms.p50",
                   "per_position_acceptance", "acceptance_histogram_per_request", "status", "run_dir",
                   "sweep_group", "job_num", "env.device"):
        assert column in df, column
    assert isinstance(df.loc[2, "per_position_acceptance"], list)
    assert isinstance(df.loc[2, "acceptance_histogram_per_request"], dict)
    assert set(df["sweep_group"]) == {"sweep_a"}


def test_load_runs_of_a_missing_or_empty_directory_is_empty(tmp_path):
    assert load_runs(tmp_path / "nowhere").empty
    assert load_runs(tmp_path).empty
    assert select_sweep(load_runs(tmp_path)).empty


def test_load_runs_accepts_run_dirs_result_files_and_lists(write_run):
    a = write_run("x/0", synthetic_record(0))
    b = write_run("x/1", synthetic_record(1))
    assert find_run_dirs([a / "result.json", b, b]) == sorted([a.resolve(), b.resolve()])
    assert len(load_runs([a, b / "result.json"])) == 2


def test_find_run_dirs_follows_symlinks_and_globs_once_each(write_run, tmp_path):
    a = write_run("sweep_a/0", synthetic_record(0))
    b = write_run("sweep_b/0", synthetic_record(0, group="sweep_b"))
    links = tmp_path / "links"
    links.mkdir()
    (links / "a").symlink_to(a.parent, target_is_directory=True)
    (links / "b0").symlink_to(b, target_is_directory=True)
    (links / "again").symlink_to(links, target_is_directory=True)  # a cycle
    assert find_run_dirs(links) == sorted([a.resolve(), b.resolve()])
    assert find_run_dirs(str(tmp_path / "runs" / "sweep_*")) == sorted([a.resolve(), b.resolve()])
    assert find_run_dirs(str(tmp_path / "runs" / "**" / "result.json")) == sorted([a.resolve(), b.resolve()])
    assert find_run_dirs(str(tmp_path / "nothing_*")) == []


def test_unusable_records_are_skipped_with_their_reason(write_run, tmp_path):
    write_run("s/0", synthetic_record(0))
    cases = (("cut", '{"status": "ok", "conf'), ("list", "[1, 2]"), ("partial", '{"status": "ok", "config": {}}'),
             ("no_k", '{"status": "ok", "config": {}, "metrics": {}}'),
             ("bad_k", '{"status": "ok", "config": {"speculator": {"num_speculative_tokens": "x"}}, "metrics": {}}'))
    for name, text in cases:
        (tmp_path / "runs" / name).mkdir()
        (tmp_path / "runs" / name / "result.json").write_text(text)
    with pytest.warns(UserWarning, match="skipped"):
        df = load_runs(tmp_path / "runs")
    assert len(df) == 1
    reasons = {Path(d).name: r for d, r in df.attrs["skipped"]}
    assert "not valid JSON" in reasons["cut"]
    assert "not a run record" in reasons["list"]
    assert "no 'metrics'" in reasons["partial"]
    assert "records no speculator.num_speculative_tokens" in reasons["no_k"]
    assert "'x', not a depth" in reasons["bad_k"]


def test_runs_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECEXP_RUNS_DIR", str(tmp_path))
    assert runs_dir() == tmp_path.resolve()
    monkeypatch.delenv("SPECEXP_RUNS_DIR")
    assert runs_dir().parts[-2:] == ("experiments", "runs")


def test_select_sweep_picks_the_latest_or_a_named_sweep(write_run, tmp_path):
    old, new = synthetic_record(0, group="old"), synthetic_record(0, group="new")
    old["started_at"], new["started_at"] = "2026-11-29T09:00:00", "2026-11-29T11:00:00"
    write_run("old/0", old)
    write_run("new/0", new)
    df = load_runs(tmp_path / "runs")
    assert set(select_sweep(df)["sweep_group"]) == {"new"}
    assert set(select_sweep(df, "old")["sweep_group"]) == {"old"}
    with pytest.raises(ValueError, match="choose one of new, old"):
        select_sweep(df, "nope")


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_unconditional_per_position_acceptance_sums_to_acceptance_length_minus_one(write_run, tmp_path, k):
    write_run(f"s/{k}", synthetic_record(k, alpha=0.6))
    df = load_runs(tmp_path / "runs")
    table = per_position(df)
    assert len(table) == k
    assert table["unconditional"].sum() == pytest.approx(df.loc[0, "acceptance_length"] - 1)
    assert list(table["unconditional"]) == pytest.approx(df.loc[0, "per_position_acceptance"])


def test_conditional_acceptance_is_accepted_over_the_previous_position(write_run, tmp_path):
    write_run("s/4", synthetic_record(4, alpha=0.6))
    df = load_runs(tmp_path / "runs")
    table = per_position(df)
    accepted, num_drafts = list(table["accepted"]), df.loc[0, "num_drafts"]
    expected = [accepted[0] / num_drafts] + [accepted[i] / accepted[i - 1] for i in range(1, 4)]
    assert list(table["conditional"]) == pytest.approx(expected)
    assert list(table["conditional"]) == pytest.approx(df.loc[0, "conditional_acceptance"])


def test_per_request_acceptance_lengths_average_to_the_run_value(write_run, tmp_path):
    write_run("s/3", synthetic_record(3, num_requests=4))
    df = load_runs(tmp_path / "runs")
    table = per_request(df)
    assert len(table) == 4
    drafts, accepted = table["num_drafts"].sum(), table["num_accepted_tokens"].sum()
    assert 1 + accepted / drafts == pytest.approx(df.loc[0, "acceptance_length"])


def test_speedup_of_k0_is_one_and_others_are_throughput_ratios(write_run, tmp_path):
    for k, tokens_per_s in [(0, 80.0), (1, 100.0), (2, 120.0), (4, 60.0)]:
        write_run(f"s/{k}", synthetic_record(k, tokens_per_s=tokens_per_s))
    table = speedup(load_runs(tmp_path / "runs")).set_index("k")
    assert table.loc[0, "speedup"] == 1.0
    assert table.loc[2, "speedup"] == pytest.approx(120 / 80)
    assert table.loc[4, "speedup"] == pytest.approx(60 / 80)


def test_speedup_baselines_are_per_pair_and_workload_within_a_sweep(write_run, tmp_path):
    for pair, base in (("a", 50.0), ("b", 200.0)):
        for workload in ("code", "prose"):
            for k, factor in ((0, 1.0), (2, 1.5)):
                record = synthetic_record(k, pair=pair, workload=workload, tokens_per_s=base * factor)
                write_run(f"s/{pair}-{workload}-{k}", record)
    df = load_runs(tmp_path / "runs")
    table = speedup(df)
    assert list(table["speedup"]) == pytest.approx([1.0 if k == 0 else 1.5 for k in table["k"]])
    labels = set(with_groups(df)["group"])
    assert labels == {"a · code", "a · prose", "b · code", "b · prose"}


def test_speedup_is_nan_without_a_k0_run_and_failed_runs_are_skipped(write_run, tmp_path):
    write_run("s/1", synthetic_record(1))
    write_run("s/0", synthetic_record(0, status="failed"))
    df = load_runs(tmp_path / "runs")
    assert set(df["status"]) == {"ok", "failed"}
    table = speedup(df)
    assert len(table) == 1 and math.isnan(table.loc[0, "speedup"])


def test_graph_capture_table_reads_per_manager_and_size(write_run, tmp_path):
    graph = {"graph_capture_bytes": 6 * 2**20, "graph_capture_s": 0.3, "persistent_buffer_bytes": 1024,
             "graph_capture_per_size": {"draft_decode": {"1": {"capture_bytes": 2**20, "capture_s": 0.1},
                                                         "2": {"capture_bytes": 2 * 2**20, "capture_s": 0.1}},
                                        "target_verify": [{"size": 1, "capture_bytes": 3 * 2**20, "capture_s": 0.1}]}}
    write_run("g/2", synthetic_record(2, graph=graph))
    write_run("c/2", synthetic_record(2, group="cpu"))
    table = graph_capture(load_runs(tmp_path / "runs"))
    assert sorted(zip(table["manager"], table["size"])) == [("draft_decode", 1), ("draft_decode", 2),
                                                           ("target_verify", 1)]
    assert table["capture_bytes"].sum() == 6 * 2**20


def test_step_summary_uses_decode_steps_only(write_run, tmp_path):
    write_run("s/2", synthetic_record(2), synthetic_steps(2, draft_forward_ms=3.0, verify_ms=11.0))
    row = load_runs(tmp_path / "runs").iloc[0]
    assert row["steps.decode_steps"] == 5
    assert row["steps.decode_verify_ms"] == pytest.approx(11.0)
    assert row["steps.draft_ms_per_forward"] == pytest.approx(3.0)


class _FakeRun:
    def __init__(self, k):
        self.path, self.name, self.group, self.job_type = ["me", "specexp", f"id{k}"], f"run{k}", "g", "depth_sweep"
        self.config = {"pair.name": "p", "speculator.num_speculative_tokens": k, "workload.name": "w",
                       "backend.name": "native", "_wandb": {}}
        self.summary = {"status": "ok", "error": None, "acceptance_length": 1.0 + k / 2,
                        "output_tokens_per_s": 10.0 * (1 + k), "tpot_ms.p50": 3.0, "_step": 0}

    def logged_artifacts(self):
        return []


class _FakeApi:
    def runs(self, project, filters=None):
        assert project == "me/specexp"
        return [_FakeRun(0), _FakeRun(2)]


def test_wandb_runs_without_the_record_artifact_are_rebuilt_from_config_and_summary():
    assert unflatten({"a.b": 1, "a.c": 2, "_x": 3}) == {"a": {"b": 1, "c": 2}}
    rows = load_wandb_rows("me/specexp", api=_FakeApi())
    assert [r["k"] for r in rows] == [0, 2]
    assert rows[1]["acceptance_length"] == 2.0 and rows[1]["tpot_ms.p50"] == 3.0
    assert rows[1]["sweep_group"] == "g"
    assert rows[1]["wandb_path"] == "me/specexp/id2"
