"""benchmarks/diagnostics/depth_headroom.py on the CPU (emulated graphs, the shipped demo pair): both engines run
every step at k, and each batch size has its ratio with an interval."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"))

import depth_headroom


def test_bad_depths_or_pairs_are_one_line():
    with pytest.raises(SystemExit, match="--k=3 --max-k=2"):
        depth_headroom.main(["--out", "x.json", "--k", "3", "--max-k", "2", "--device", "cpu"])
    with pytest.raises(SystemExit, match="unknown pair 'nope'"):
        depth_headroom.main(["--out", "x.json", "--pairs", "nope", "--device", "cpu"])


@pytest.mark.slow
def test_both_engines_run_k_and_each_batch_has_its_ratio(tmp_path):
    out = tmp_path / "h.json"
    depth_headroom.main(["--out", str(out), "--device", "cpu", "--pairs", "tiny_lfm2", "--k", "2", "--max-k", "5",
                         "--batches", "1,2", "--repeats", "2", "--new-tokens", "6"])
    cells = json.loads(out.read_text())["pairs"]["tiny_lfm2"]
    assert set(cells) == {"1", "2"}
    for cell in cells.values():
        for name in ("K=2", "K=5 at k=2"):
            assert len(cell[name]["runs"]) == 2 and cell[name]["output_tokens_per_s"]["n"] == 2
            assert all(set(run["step_ks"]) <= {0, 2} for run in cell[name]["runs"])  # prompt-only steps: k = 0
        assert cell["ratio"]["low"] <= cell["ratio"]["value"] <= cell["ratio"]["high"]
