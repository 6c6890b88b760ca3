"""Dynamic depth in the metrics and the analysis layer: the per-step depth metrics from step rows, the acceptance
histogram by draft length, and the report's table of each dynamic mode against the best static k per batch
size (synthetic records: no model)."""

from __future__ import annotations

import pytest
from analysis_records import synthetic_record

from specexp.analysis.depth import (
    depth_mode,
    dynamic_depth_markdown,
    dynamic_depth_table,
    has_dynamic_runs,
    mean_depth,
    suggested_schedules,
)
from specexp.analysis.load import load_runs
from specexp.analysis.report import write_report
from specexp.cli import compose_config
from specexp.engine.depth import parse_batch_size_schedule
from specexp.engine.stats import AcceptanceStats
from specexp.result import StepRecord, depth_metrics


def test_steps_per_k_and_acceptance_length_per_k_come_from_the_step_rows():
    steps = [StepRecord(0, 4, 8, num_speculative_tokens=3),  # a prefill step: no drafts
             StepRecord(1, 4, 16, num_drafts=4, num_draft_tokens=12, num_accepted_tokens=6, num_speculative_tokens=3),
             StepRecord(2, 2, 4, num_drafts=2, num_draft_tokens=2, num_accepted_tokens=1, num_speculative_tokens=1),
             StepRecord(3, 2, 2, num_speculative_tokens=0)]
    m = depth_metrics(steps, 4)
    assert m["num_speculative_tokens_hist"] == [1, 1, 0, 2, 0]
    assert m["acceptance_length_by_num_speculative_tokens"] == [None, 1.5, None, 1 + 6 / 4, None]
    assert m["mean_draft_tokens_per_step"] == 14 / 4
    unknown = depth_metrics([StepRecord(0, 1, 3, num_drafts=1, num_draft_tokens=2)], 2)
    assert unknown["num_speculative_tokens_hist"] is None and unknown["mean_draft_tokens_per_step"] == 2.0


def test_the_acceptance_histogram_by_draft_length_splits_the_histogram():
    stats = AcceptanceStats(3)
    for drafts, accepted in [(3, 3), (3, 0), (1, 1), (2, 1), (2, 1), (0, 0)]:
        stats.record("r", drafts, accepted)
    m = stats.metrics()
    assert m["acceptance_histogram_by_draft_length"] == [[0], [0, 1], [0, 2, 0], [1, 0, 0, 1]]
    by_length = m["acceptance_histogram_by_draft_length"]
    assert [sum(h[j] for h in by_length if j < len(h)) for j in range(4)] == m["acceptance_histogram"]
    merged = AcceptanceStats(3)
    merged.total.merge(stats.total)
    assert merged.metrics()["acceptance_histogram_by_draft_length"] == by_length


def _dynamic(record: dict, **speculator) -> dict:
    record["config"]["speculator"].update(speculator)
    return record


def _depth_runs(write_run):
    """A dynamic-depth sweep: static k 1, 2, 4 and the three dynamic modes at batch sizes 1 and 16."""
    tokens = {(1, 1): 50.0, (1, 2): 70.0, (1, 4): 90.0, (16, 1): 400.0, (16, 2): 380.0, (16, 4): 300.0}
    dynamic = {"schedule": dict(num_speculative_tokens_per_batch_size=[[1, 1, 4], [2, 16, 1]]),
               "confidence": dict(draft_confidence_threshold=0.4), "goodput": dict(adaptive="goodput")}
    speed = {(1, "schedule"): 88.0, (16, "schedule"): 396.0, (1, "confidence"): 60.0, (16, "confidence"): 200.0,
             (1, "goodput"): 91.0, (16, "goodput"): 410.0}
    job = 0
    for batch in (1, 16):
        for k in (1, 2, 4):
            write_run(f"sweep_a/{job}", synthetic_record(k, tokens_per_s=tokens[(batch, k)], max_num_seqs=batch))
            job += 1
        for mode, keys in dynamic.items():
            record = _dynamic(synthetic_record(4, tokens_per_s=speed[(batch, mode)], max_num_seqs=batch), **keys)
            record["metrics"]["num_speculative_tokens_hist"] = [0, 3, 0, 0, 1]
            write_run(f"sweep_a/{job}", record)
            job += 1


def test_each_dynamic_mode_is_compared_with_the_best_static_k_per_batch_size(write_run, tmp_path):
    _depth_runs(write_run)
    runs = load_runs(tmp_path / "runs")
    assert sorted(set(map(depth_mode, (row for _, row in runs.iterrows())))) == ["confidence", "goodput", "schedule",
                                                                                 "static"]
    assert has_dynamic_runs(runs)
    table = dynamic_depth_table(runs)
    assert table["batch_size"].tolist() == [1, 16]
    assert table["best_static_k"].tolist() == [4, 1]
    assert table["best_static_tokens_per_s"].tolist() == [90.0, 400.0]
    assert table["goodput_ratio"].tolist() == pytest.approx([91 / 90, 410 / 400])
    assert table["confidence_ratio"].tolist() == pytest.approx([60 / 90, 200 / 400])
    assert table["schedule_mean_k"].tolist() == [mean_depth([0, 3, 0, 0, 1])] * 2 == [7 / 4] * 2


def test_the_report_has_a_dynamic_depth_section_and_figure(write_run, tmp_path):
    _depth_runs(write_run)
    report = write_report(tmp_path / "runs", tmp_path / "out").read_text()
    section = report.split("## Dynamic depth", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| p · w")]
    assert len(lines) == 2 and "| 1 | 4 | 90.0 (n=1) |" in lines[0] and "| 16 | 1 | 400.0 (n=1) |" in lines[1]
    assert "1.025" in lines[1]  # goodput ÷ the best static k at batch 16
    assert (tmp_path / "out" / "dynamic_depth.png").is_file()


def test_a_report_without_dynamic_runs_has_no_dynamic_depth_section(write_run, tmp_path):
    for job, k in enumerate((0, 1, 2)):
        write_run(f"sweep_a/{job}", synthetic_record(k))
    runs = load_runs(tmp_path / "runs")
    assert not has_dynamic_runs(runs) and dynamic_depth_table(runs).empty
    report = write_report(tmp_path / "runs", tmp_path / "out").read_text()
    assert "## Dynamic depth" not in report and not (tmp_path / "out" / "dynamic_depth.png").exists()


def test_dynamic_depth_tokens_per_s_carry_their_spread_over_repeats(write_run, tmp_path):
    for job, (keys, tps, std) in enumerate([({}, 90.0, 1.5), ({"adaptive": "goodput"}, 95.0, 4.25)]):
        record = _dynamic(synthetic_record(4, tokens_per_s=tps, max_num_seqs=1), **keys)
        record["metrics"]["num_repeats"] = 3
        record["metrics"]["intervals"] = {"output_tokens_per_s": {"mean": tps, "std": std, "low": tps - 2 * std,
                                                                  "high": tps + 2 * std, "n": 3}}
        write_run(f"sweep_a/{job}", record)
    table = dynamic_depth_table(load_runs(tmp_path / "runs"))
    assert table["best_static_tokens_per_s_std"].tolist() == [1.5] and table["goodput_tokens_per_s_n"].tolist() == [3]
    markdown = dynamic_depth_markdown(table)
    assert "| 90.0 ± 1.5 (n=3) |" in markdown and "| 95.0 ± 4.2 (n=3) |" in markdown


def test_the_schedule_of_each_batch_sizes_best_static_k_is_suggested_as_overrides(write_run, tmp_path):
    _depth_runs(write_run)
    (suggestion,) = suggested_schedules(load_runs(tmp_path / "runs"))
    assert suggestion["best_k"] == {1: 4, 16: 1} and suggestion["schedule"] == [[1, 1, 4], [2, 16, 1]]
    overrides = suggestion["overrides"].split()
    assert overrides == ["speculator.num_speculative_tokens=4",
                         "speculator.num_speculative_tokens_per_batch_size=[[1,1,4],[2,16,1]]"]
    cfg = compose_config(["+exp=dynamic_depth", *overrides])  # what a user pastes composes and validates
    assert [list(r) for r in cfg.speculator.num_speculative_tokens_per_batch_size] == suggestion["schedule"]
    parse_batch_size_schedule(suggestion["schedule"], cfg.speculator.num_speculative_tokens)
    report = write_report(tmp_path / "runs", tmp_path / "out").read_text()
    assert f"`{suggestion['overrides']}`" in report.split("## Dynamic depth", 1)[1]


def test_a_static_sweep_over_batch_sizes_gets_a_schedule_but_one_batch_size_does_not(write_run, tmp_path):
    tokens = {(1, 2): 70.0, (1, 4): 90.0, (8, 2): 300.0, (8, 4): 280.0}
    for job, ((batch, k), tps) in enumerate(tokens.items()):
        write_run(f"sweep_a/{job}", synthetic_record(k, tokens_per_s=tps, max_num_seqs=batch))
    runs = load_runs(tmp_path / "runs")
    assert not has_dynamic_runs(runs)
    assert [s["schedule"] for s in suggested_schedules(runs)] == [[[1, 1, 4], [2, 8, 2]]]
    section = write_report(tmp_path / "runs", tmp_path / "out").read_text().split("## Dynamic depth", 1)[1]
    assert "speculator.num_speculative_tokens_per_batch_size=[[1,1,4],[2,8,2]]" in section
    assert "÷ best static" not in section  # no dynamic runs: no comparison table
    for job, k in enumerate((1, 2)):
        write_run(f"sweep_b/{job}", synthetic_record(k, tokens_per_s=10.0 * k, max_num_seqs=1))
    assert suggested_schedules(load_runs(tmp_path / "runs" / "sweep_b")) == []


def test_the_suggested_schedule_takes_the_mean_over_the_runs_of_one_k(write_run, tmp_path):
    runs = [(1, 2, 70.0), (1, 4, 90.0), (1, 4, 40.0), (8, 2, 300.0), (8, 4, 280.0)]  # k = 4 at batch 1 run twice
    for job, (batch, k, tps) in enumerate(runs):
        write_run(f"sweep_a/{job}", synthetic_record(k, tokens_per_s=tps, max_num_seqs=batch))
    (suggestion,) = suggested_schedules(load_runs(tmp_path / "runs"))
    assert suggestion["best_k"] == {1: 2, 8: 2} and suggestion["schedule"] == [[1, 8, 2]]  # k = 4 at 1: 65 < 70
    assert suggestion["overrides"] == "speculator.num_speculative_tokens=2"  # one k everywhere: that static k
