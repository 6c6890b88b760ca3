"""benchmarks/diagnostics/goodput_replay.py: the goodput policy replayed on a stored cost table, on a CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"))

import goodput_replay

from specexp.engine.goodput import GoodputSettings

MAX_K = 4


def _result(verify_per_token_ms: float, draft_step_ms: float, fixed_ms: float) -> dict:
    """A dynamic_depth_gpu-shaped result: one pair, rate 0.8, batches 1 and 4, static k1..k4 cells whose runs took
    the table's step time (wall s / steps), and a goodput cell."""
    sizes = ("1", "4")
    verify = [1.0 + verify_per_token_ms * q for q in range(1, MAX_K + 2)]
    draft = [0.0, 0.0] + [draft_step_ms * (k - 1) for k in range(2, MAX_K + 1)]
    costs = {"verify_ms": {s: verify for s in sizes}, "draft_ms": {s: draft for s in sizes},
             "fixed_ms": {s: fixed_ms for s in sizes}}
    cells = {}
    for k in range(1, MAX_K + 1):
        step_ms = fixed_ms + verify[k] + draft[k]
        tokens_per_step = sum(0.8**i for i in range(k + 1))
        cells[f"k{k}"] = {s: {"output_tokens_per_s": {"mean": tokens_per_step / step_ms * 1e3},
                              "runs": [{"wall_s": 0.05 * step_ms, "steps": 50}]} for s in sizes}
    cells["goodput"] = {s: {"mean_k_per_decode_step": 2.0, "output_tokens_per_s": {"mean": 1000.0}} for s in sizes}
    return {"new_tokens": 24, "pairs": {"p": {"engines": {"goodput": {"step_costs": costs}},
                                              "by_rate": {"0.8": {"cells": cells}, "greedy": {"cells": {}}}}}}


def test_the_replay_follows_the_table():
    """A table where drafting is nearly free makes the policy draft deep; one where each draft step costs more
    than a verify token makes it draft little; the table's own best k at the true rate says the same."""
    cheap = goodput_replay.replay_file(_result(0.01, 0.01, 0.1), seeds=3, settings=GoodputSettings())
    dear = goodput_replay.replay_file(_result(0.05, 2.0, 0.1), seeds=3, settings=GoodputSettings())
    assert [r["batch"] for r in cheap] == [1, 4] and all(r["rate"] == 0.8 for r in cheap)  # "greedy" is skipped
    for deep, shallow in zip(cheap, dear, strict=True):
        assert deep["table_best_k"] == MAX_K and shallow["table_best_k"] <= 1
        assert deep["simulated_mean_k"] > 3.0 and shallow["simulated_mean_k"] < 1.5
        assert deep["best_static_k"] == MAX_K  # the static cells were made from the same table
        assert deep["simulated_mean_k_std"] is not None and deep["seeds"] == 3


def test_the_replay_is_deterministic_and_counts_every_token():
    table = goodput_replay.cost_table(_result(0.02, 0.2, 0.1)["pairs"]["p"]["engines"]["goodput"]["step_costs"])
    first = goodput_replay.replay(table, 4, 0.8, 24, MAX_K, 7, GoodputSettings())
    assert first == goodput_replay.replay(table, 4, 0.8, 24, MAX_K, 7, GoodputSettings())
    assert len(goodput_replay.replay(table, 1, 0.0, 24, MAX_K, 0, GoodputSettings())) == 8 * 23  # 8 requests


def test_measured_step_times_fill_the_ks_between():
    statics = {1: {"1": {"runs": [{"wall_s": 1.0, "steps": 1000}]}}, 3: {"1": {"runs": [{"wall_s": 3.0, "steps": 1000}]}}}
    assert goodput_replay.measured_step_ms(statics, "1", 4) == pytest.approx([1.0, 1.0, 2.0, 3.0, 3.0])


def test_the_command_prints_tables_and_refuses_bad_input(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result(0.02, 0.2, 0.1)))
    text = goodput_replay.main([str(path), "--seeds", "2", "--out", str(tmp_path / "o.json")])
    assert "| p | 0.8 | 1 |" in text and "÷ best static" in text
    assert json.loads((tmp_path / "o.json").read_text())["rows"]
    for argv in ([str(path), "--seeds", "0"], [str(path), "--prior", "1.5"], [str(tmp_path / "missing.json")]):
        with pytest.raises(SystemExit, match="2"):
            goodput_replay.main(argv)
    assert "error:" in capsys.readouterr().err
