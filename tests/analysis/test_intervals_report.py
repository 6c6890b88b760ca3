"""Figures and tables carry their uncertainty: speedup intervals from both points' repeats, ± and sample
counts in report.md, error bars in the figures, intervals on the theory fit, an honest "best k" claim, noisy
runs flagged, and an acceptance-only report with no timing figure at all."""

from __future__ import annotations

import math

import pytest
from analysis_records import synthetic_record, with_repeats
from matplotlib.container import ErrorbarContainer

from specexp.analysis import fit_theory, load_runs, plots, speedup
from specexp.analysis.report import write_report
from specexp.measure import guards, overlap
from specexp.measure.intervals import ratio_interval

REPEATS = {0: [100.0, 103.0, 97.0], 1: [131.0, 128.0, 134.0], 2: [150.0, 146.0, 155.0], 4: [149.0, 152.0, 144.0]}


@pytest.fixture
def sweep(write_run, tmp_path):
    for k, values in REPEATS.items():
        write_run(f"sweep/{k}", with_repeats(synthetic_record(k, alpha=0.7, num_requests=6), values, noisy=k == 4))
    return tmp_path / "runs" / "sweep"


def test_speedup_intervals_come_from_the_repeats_of_both_points(sweep):
    table = speedup(load_runs(sweep)).set_index("k")
    for k in (1, 2, 4):
        expected = ratio_interval(REPEATS[k], REPEATS[0])
        assert table.loc[k, "speedup"] == pytest.approx(expected["value"])
        assert (table.loc[k, "speedup_low"], table.loc[k, "speedup_high"]) == pytest.approx((expected["low"],
                                                                                             expected["high"]))
        assert table.loc[k, "speedup_repeats"] == 3 and table.loc[k, "baseline_repeats"] == 3
    assert math.isnan(table.loc[0, "speedup_low"]), "k=0 is the reference"


def test_a_record_from_before_repeats_reads_as_one_repeat_without_intervals(write_run, tmp_path):
    for k in (0, 2):
        write_run(f"old/{k}", synthetic_record(k, tokens_per_s=100.0 + 20 * k))
    table = speedup(load_runs(tmp_path / "runs" / "old")).set_index("k")
    assert (table["num_repeats"] == 1).all() and math.isnan(table.loc[2, "speedup_low"])
    assert table.loc[2, "speedup"] == pytest.approx(140 / 100)


def test_the_speedup_figure_has_error_bars_on_tokens_per_s_and_speedup(sweep):
    fig = plots.throughput_speedup(load_runs(sweep))
    throughput, speedups = fig.axes[:2]
    for ax in (throughput, speedups):
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert bars and bars[0].has_yerr
    assert "95%" in fig._suptitle.get_text()
    assert "n=3 repeats" in throughput.get_ylabel()


def test_the_acceptance_figure_has_bootstrap_error_bars_and_names_its_requests(sweep):
    fig = plots.acceptance_vs_k(load_runs(sweep))
    ax = fig.axes[0]
    assert [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert "n=6 req." in " ".join(t.get_text() for t in ax.get_legend().get_texts())


def test_the_theory_fit_has_intervals_and_tests_the_next_best_k(sweep):
    fit = fit_theory(load_runs(sweep)).iloc[0]
    assert fit["alpha_low"] < fit["alpha"] < fit["alpha_high"] and fit["alpha_interval"] == "bootstrap"
    assert fit["alpha_requests"] == 6
    assert fit["best_k_measured"] == 2 and fit["next_best_k_measured"] == 4
    assert bool(fit["next_best_inside"]) is True  # 4's speedup 1.49 lies inside 2's interval


def test_report_md_shows_intervals_sample_counts_and_flags_noisy_runs(sweep, tmp_path):
    text = write_report(sweep, tmp_path / "report").read_text()
    runs = text.split("## Runs")[1].split("## Theory fit")[0]
    assert "100.0 ± 3.0 (n=3)" in runs and "† " not in runs.splitlines()[3]
    assert next(line for line in runs.splitlines() if "| 4 |" in line).count("†") >= 2  # tokens/s and speedup
    speedups = text.split("## Speedup over k=0")[1].split("##")[0]
    low, high = (ratio_interval(REPEATS[2], REPEATS[0])[side] for side in ("low", "high"))
    assert f"[{low:.2f}, {high:.2f}]" in speedups
    assert "next best k=4" in text and "inside the interval: not told apart" in text
    assert "## Noise" in text and "the machine was busy" in text
    assert "Measured with 3 repeat(s) per run (interleaved), 1 warm-up request(s) each." in text


def test_a_run_that_other_jobs_ran_beside_while_it_measured_is_flagged_in_the_report(write_run, tmp_path):
    beside = overlap.concurrent_jobs(1, [{"job": 0, "start_s": 0.0, "end_s": 50.0, "devices": [0]},
                                         {"job": 1, "start_s": 1.0, "end_s": None, "devices": [1]}],
                                     now_s=60.0, measured=(30.0, 55.0))
    for k, values in ((0, [100.0, 101.0]), (2, [140.0, 141.0])):
        record = with_repeats(synthetic_record(k, alpha=0.7, num_requests=6), values)
        if k == 2:
            record["concurrent_jobs"] = beside
            record["metrics"]["noise"] = guards.noise_report({}, [], {}, 1.0, 0.05, own_pid=1, concurrent=beside)
        write_run(f"parallel/{k}", record)
    text = write_report(tmp_path / "runs" / "parallel", tmp_path / "report").read_text()
    runs = text.split("## Runs")[1].split("##")[0]
    assert next(line for line in runs.splitlines() if "| 2 |" in line).count("†") >= 1
    assert next(line for line in runs.splitlines() if "| 0 |" in line).count("†") == 0
    assert "## Noise" in text and "other jobs of this sweep ran on this host while it measured (job 0: 20.0 s)" in text


def test_an_acceptance_only_report_has_no_timing_figure(sweep, tmp_path):
    out = tmp_path / "acceptance"
    text = write_report(sweep, out, acceptance_only=True).read_text()
    tables = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    for word in ("tokens/s", "speedup", "TPOT", "c [95%]", "target step"):
        assert word not in tables, word
    assert "## Speedup" not in text and "## Noise" not in text
    assert "Acceptance only" in text and "acceptance length [95%]" in text
    assert {p.stem for p in out.glob("*.png")} == set(plots.ACCEPTANCE_FIGURES)
