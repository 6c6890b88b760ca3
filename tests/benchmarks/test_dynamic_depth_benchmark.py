"""benchmarks/dynamic_depth_gpu.py on the CPU (emulated graphs, the shipped demo pair) and its report: every cell
has its rounds, the ratios their intervals, and the report names each batch size's best static k."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import dynamic_depth_gpu
import dynamic_depth_report


def test_an_unknown_mode_or_pair_is_one_line(capsys):
    with pytest.raises(SystemExit, match="unknown depth mode 'k5'"):
        dynamic_depth_gpu.main(["--out", "x.json", "--modes", "k4,k5", "--device", "cpu"])
    with pytest.raises(SystemExit, match="needs at least one static k"):
        dynamic_depth_gpu.main(["--out", "x.json", "--modes", "goodput", "--device", "cpu"])
    with pytest.raises(SystemExit, match="--tuned-repeats=1: needs at least 2 rounds"):
        dynamic_depth_gpu.main(["--out", "x.json", "--tuned-repeats", "1", "--device", "cpu"])


@pytest.mark.slow
def test_the_benchmark_measures_every_mode_and_batch_and_the_report_renders_it(tmp_path):
    out = tmp_path / "dd.json"
    dynamic_depth_gpu.main(["--out", str(out), "--device", "cpu", "--pairs", "tiny_lfm2", "--batches", "1,2",
                            "--modes", "k1,k2,goodput", "--repeats", "2", "--tuned-repeats", "3",
                            "--new-tokens", "6"])
    result = json.loads(out.read_text())
    assert result["mixed_steps"] == "parts"  # the default: joined mixed-step graphs are of little use here
    by_rate = result["pairs"]["tiny_lfm2"]["by_rate"]["greedy"]
    for mode in ("k1", "k2", "goodput"):
        for b in ("1", "2"):
            cell = by_rate["cells"][mode][b]
            assert cell["output_tokens_per_s"]["n"] == 2 and len(cell["runs"]) == 2
            assert cell["eager_uncaptured_steps"] == 0  # every (size, k) a run visits was captured
    assert by_rate["cells"]["k2"]["1"]["acceptance_length"] > by_rate["cells"]["k1"]["1"]["acceptance_length"]
    ratio = by_rate["ratio_to_best_static"]["goodput"]["1"]
    assert ratio["low"] <= ratio["value"] <= ratio["high"]
    tuned = by_rate["tuned_schedule"]
    assert tuned["by_batch"]["1"]["tuned"]["output_tokens_per_s"]["n"] == 3  # --tuned-repeats
    best_k = [int(tuned["by_batch"][b]["best_static"][1:]) for b in ("1", "2")]
    expected = [[1, 1, best_k[0]], [2, 2, best_k[1]]] if best_k[0] != best_k[1] else [[1, 2, best_k[0]]]
    assert tuned["schedule"] == expected
    assert result["pairs"]["tiny_lfm2"]["engines"]["goodput"]["step_costs"]["fixed_ms"]
    text = dynamic_depth_report.main(["tables", str(out)])
    summary = dynamic_depth_report.main(["summary", str(out)])
    assert "| tiny_lfm2, greedy | " in summary and "(n = 3)" in summary
    assert "| tiny_lfm2 | goodput |" in dynamic_depth_report.main(["graphs", str(out)])
    dynamic_depth_report.main(["figure", str(tmp_path / "r.png"), str(out)])
    assert "best static" in text and "tuned schedule" in text and "±" in text
    assert (tmp_path / "r.png").stat().st_size > 0


def test_a_pair_measured_again_is_shown_from_the_later_file():
    first = {"machine": {"gpu": "GPU A"}, "pairs": {"a": {"run": 1}, "b": {"run": 1}}}
    second = {"machine": {"device": "cpu"}, "pairs": {"b": {"run": 2}}}
    kept, notes = dynamic_depth_report.latest_pairs([first, second], ["first.json", "second.json"])
    assert kept[0]["pairs"] == {"a": {"run": 1}} and kept[1]["pairs"] == {"b": {"run": 2}}
    assert notes == ["b: shown from second.json (cpu), which replaces its run in first.json (GPU A)."]
    assert first["pairs"] == {"a": {"run": 1}, "b": {"run": 1}}  # the inputs are left as they were
    assert dynamic_depth_report.latest_pairs([first], ["first.json"]) == ([first], [])


def test_the_graphs_table_shows_the_allocator_share_where_recorded():
    engine = {"graphs": 3, "graph_capture_bytes": 3 * 2**20, "graph_capture_s": 1.25}
    old = {"pairs": {"p": {"engines": {"k1": engine}, "by_rate": {}}}}
    assert "allocator" not in dynamic_depth_report.render_graphs([old])
    new = {"pairs": {"p": {"engines": {"k1": {**engine, "graph_capture_reserved_bytes": 2**20}}, "by_rate": {}}}}
    table = dynamic_depth_report.render_graphs([old, new]).splitlines()
    assert table[0] == "| pair | engine | graphs | graph memory MiB | of it in the allocator MiB | capture s |"
    assert table[2:] == ["| p | k1 | 3 | 3 | - | 1.2 |", "| p | k1 | 3 | 3 | 1 | 1.2 |"]
