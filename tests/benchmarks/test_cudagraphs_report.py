"""benchmarks/cudagraphs_report.py and cudagraphs_figures.py on small synthetic gpu_cudagraphs.py results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cudagraphs_figures
import cudagraphs_report
from leviathan import expected_acceptance_length, leviathan_speedup

MiB = 2**20


def _capture(managers: dict[str, int], total_mib: int) -> dict:
    return {"graph_capture_bytes": total_mib * MiB, "graph_capture_s": 1.5, "persistent_buffer_bytes": 0,
            "managers": {name: {"capture_bytes": mib * MiB, "capture_s": 0.1, "per_size": []}
                         for name, mib in managers.items()}}


def _e2e_rows(c: float, measured_over_theory: dict[int, float], rate: float = 0.8) -> list[dict]:
    """End-to-end rows whose speedups are the formula's times the given factor (k = 0: 100 tokens/s)."""
    rows = []
    for k in range(4):
        tps = 100.0 * (1.0 if k == 0 else leviathan_speedup(rate, k, c) * measured_over_theory[k])
        rows.append({"k": k, "acceptance_rate": rate, "acceptance_length": 1.0, "output_tokens_per_s": tps,
                     "output_tokens_per_s_runs": [tps * 0.98, tps, tps * 1.01], "step_ms_p50": 1.0 + k,
                     "draft_ms_p50": 0.3 * k, "verify_ms_p50": 1.0, "schedule_ms_p50": 0.02})
    return rows


def _result(**switches) -> dict:
    pair = {"capture": _capture({"target_verify": 200, "target_prefill_16": 10, "target_prefill_32": 6,
                                 "draft_prefill": 8, "draft_prompt_prefill_17": 4, "draft_decode": 12}, 250),
            "draft_decode_step": {"1": {"eager_step_ms": 3.0, "graph_step_ms": 0.3, "graph_speedup": 10.0}},
            "cost_ratio_c": 0.4, "end_to_end": _e2e_rows(0.4, {1: 0.8, 2: 0.9, 3: 1.0})}
    return {"file": "r.json", "machine": {"gpu": "NVIDIA H200", "torch": "x", "python": "y"},
            "pairs": {"llama-3.2-1b+llama-100m": pair}, **switches}


def test_memory_groups_prompt_graph_managers_and_keeps_what_no_manager_holds():
    groups = cudagraphs_report.manager_groups(_result()["pairs"]["llama-3.2-1b+llama-100m"]["capture"])
    assert groups == pytest.approx({"target verify": 200, "target prompt graphs": 16, "draft prefill": 8,
                                    "draft prompt graphs": 4, "draft decode": 12, "outside the managers": 10,
                                    "total": 250})


def test_switches_off_default_names_differing_and_unrecorded_switches():
    defaults = cudagraphs_report.engine_defaults()
    today = {key: defaults[key] for key in cudagraphs_report.SWITCHES}
    assert cudagraphs_report.switches_off_default(today, defaults) == []
    older = {**today, "compile_pointwise": not defaults["compile_pointwise"]}
    del older["cudagraph_shared_pool"]
    assert cudagraphs_report.switches_off_default(older, defaults) == [
        f"`compile_pointwise={not defaults['compile_pointwise']}`", "no `cudagraph_shared_pool`"]


def test_speedups_mark_the_points_outside_15_percent_of_the_formula():
    table = cudagraphs_report.render_speedups([_result()]).splitlines()
    k1, k2, k3 = table[2:5]
    assert ["*" in row for row in (k1, k2, k3)] == [True, False, False]  # 0.80, 0.90 and 1.00 of the formula


def test_speedups_at_another_tolerance_mark_and_count_the_points_outside_it():
    table = cudagraphs_report.render_speedups([_result()], tolerance=0.05).splitlines()
    k1, k2, k3, count = table[2:6]
    assert ["*" in row for row in (k1, k2, k3)] == [True, True, False]  # 0.80, 0.90 and 1.00 of the formula
    assert count == "| within 5% | 1 of 3 |"


def test_summary_counts_points_within_15_percent_and_reports_missing_sections_as_dashes():
    result = _result()
    result["pairs"]["lfm2-1.2b+lfm2-350m"] = {"capture": _capture({"target_verify": 100}, 100)}
    row_full, row_capture_only = cudagraphs_report.render_summary([result]).splitlines()[2:4]
    assert "| 2 of 3 |" in row_full
    assert row_capture_only.count("| - ") >= 10 and row_capture_only.endswith("| 100.0 (1.5 s) |")


def test_figures_have_a_panel_per_pair_and_short_legends():
    result = _result()
    speed = cudagraphs_figures.speedup_figure([result])
    assert len(speed.axes) == 1 and len(speed.axes[0].get_legend_handles_labels()[1]) == 2  # formula + measured
    memory = cudagraphs_figures.memory_figure([("one pool", result)])
    assert len(memory.legends[0].get_texts()) == len(cudagraphs_figures.GROUP_COLORS)
    assert all(bar.get_width() >= 0 for bar in memory.axes[0].patches)


def test_figures_refuse_results_without_the_section_they_draw():
    bare = {**_result(), "pairs": {"p": {"cost_ratio_c": 0.4}}}
    with pytest.raises(ValueError, match="--sections step,e2e"):
        cudagraphs_figures.speedup_figure([bare])
    with pytest.raises(ValueError, match="--sections capture"):
        cudagraphs_figures.memory_figure([("x", bare)])


def test_report_cli_says_which_file_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cudagraphs_report.main(["summary", str(tmp_path / "absent.json")])
    assert exit_info.value.code == 2
    assert "no such result file" in capsys.readouterr().err


def _verify_result() -> dict:
    """A verify_cost.py result: k = 0, 1, 2, each k >= 1 with its kernels' change against k = 0."""
    growth = [{"kernel": "silu", "base_us": 0.0, "us": 20.0, "delta_us": 20.0},
              {"kernel": "attention", "base_us": 100.0, "us": 130.0, "delta_us": 30.0},
              {"kernel": "argmax", "base_us": 3.0, "us": 2.0, "delta_us": -1.0}]
    rows = {"0": {"target_verify": {"ms": 1.0}}}
    for k in (1, 2):
        rows[str(k)] = {"target_verify": {"ms": 1.0 + 0.05 * k}, "verify_growth_over_k0": growth}
    return {"file": "v.json", "pairs": {"llama-3.2-1b+llama-100m": rows}}


def test_verify_kernels_lists_the_largest_changes_then_the_wall_time():
    table = cudagraphs_report.render_verify_kernels([_verify_result()], {2}, top=2).splitlines()
    assert table[0] == "| file | pair | k | kernel | k = 0 µs | this k µs | change µs |"
    rows = [line.split(" | ")[3:] for line in table[2:]]
    assert rows == [["`attention`", "100", "130", "+30 |"], ["`silu`", "0", "20", "+20 |"],
                    ["wall time of the replay", "1000", "1100", "+100 |"]]
    every_k = cudagraphs_report.render_verify_kernels([_verify_result()]).splitlines()
    assert len(every_k) == 2 + 2 * 4  # k = 1 and 2: three kernels and the wall time each


def test_verify_kernels_refuses_depths_that_are_not_integers(tmp_path, capsys):
    path = tmp_path / "v.json"
    path.write_text(json.dumps(_verify_result()))
    with pytest.raises(SystemExit) as exit_info:
        cudagraphs_report.main(["verify-kernels", str(path), "--ks", "one"])
    assert exit_info.value.code == 2
    assert "--ks='one': comma-separated integers expected" in capsys.readouterr().err


def test_realized_speedups_take_each_rows_acceptance_length():
    """Rows whose shortfall from the formula is all in their acceptance draws sit on the formula at the length they
    realized; each cell names that length over the expected one."""
    result = _result()
    rows = result["pairs"]["llama-3.2-1b+llama-100m"]["end_to_end"]
    for r in rows[1:]:
        r["acceptance_length"] = expected_acceptance_length(0.8, r["k"]) * {1: 0.8, 2: 0.9, 3: 1.0}[r["k"]]
    table = cudagraphs_report.render_speedups([result], tolerance=0.05, realized=True).splitlines()
    k1, k2, k3, count = table[2:6]
    assert [row.endswith(f"({f})" + " |") for row, f in ((k1, "0.80"), (k2, "0.90"), (k3, "1.00"))] == [True] * 3
    assert not any("*" in row for row in (k1, k2, k3))
    assert count == "| within 5% | 3 of 3 |"


def test_spread_gives_each_speedup_its_rounds_range_and_count():
    """Round i of every k shares its k = 0 run: the speedups by round are the ratios of runs i."""
    result = _result()
    rows = {r["k"]: r for r in result["pairs"]["llama-3.2-1b+llama-100m"]["end_to_end"]}
    rows[0]["output_tokens_per_s_runs"] = [100.0, 110.0, 90.0]
    rows[1]["output_tokens_per_s_runs"] = [120.0, 121.0, 126.0]
    assert cudagraphs_report.round_speedups(rows, 1) == pytest.approx([1.2, 1.1, 1.4])
    del rows[2]["output_tokens_per_s_runs"]
    assert cudagraphs_report.round_speedups(rows, 2) == []  # no runs recorded: no range
    table = cudagraphs_report.render_speedups([result], spread=True).splitlines()
    assert f"| 1 | {rows[1]['speedup']:.2f} [1.10, 1.40] (n = 3) / " in table[2]
    assert "[" not in table[3]
    rows[2]["output_tokens_per_s_runs"] = [1.0, 2.0]  # not one per round of k = 0: no range
    assert cudagraphs_report.round_speedups(rows, 2) == []


def test_acceptance_length_of_a_run_counts_every_verify():
    """gpu_cudagraphs.acceptance_length: 1 + mean accepted drafts per verify (capped verifies count as drawn), 1.0
    for a run without verifies (k = 0)."""
    import gpu_cudagraphs

    assert gpu_cudagraphs.acceptance_length([]) == 1.0
    assert gpu_cudagraphs.acceptance_length([(4, 4), (4, 0), (2, 2)]) == pytest.approx(1 + 6 / 3)


def test_phases_set_each_files_draft_verify_and_step_medians_side_by_side():
    """One column per file, named with its draft_prefill_region (`full` where the result predates the setting), a
    row per k of draft / verify / step medians; a k one file lacks is a dash."""
    newer = {**_result(draft_prefill_region="last_two"), "file": "two.json"}
    newer["pairs"]["llama-3.2-1b+llama-100m"]["end_to_end"][2]["draft_ms_p50"] = 0.55
    older = _result()
    older["pairs"]["llama-3.2-1b+llama-100m"]["end_to_end"].pop()  # no k = 3
    lines = cudagraphs_report.render_phases([older, newer]).splitlines()
    assert lines[0] == ("| k | `r.json` (full): draft / verify / step ms | `two.json` (last_two): draft / verify / "
                        "step ms |")
    assert lines[2:] == ["| 0 | 0.00 / 1.00 / 1.00 | 0.00 / 1.00 / 1.00 |",
                         "| 1 | 0.30 / 1.00 / 2.00 | 0.30 / 1.00 / 2.00 |",
                         "| 2 | 0.60 / 1.00 / 3.00 | 0.55 / 1.00 / 3.00 |",
                         "| 3 | - | 0.90 / 1.00 / 4.00 |"]
