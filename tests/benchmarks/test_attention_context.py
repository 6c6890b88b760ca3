"""benchmarks/diagnostics/attention_context.py without a GPU: its configuration strings, the table it prints from a
measurement, and its argument checks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "diagnostics" / "attention_context.py"
sys.path.insert(0, str(SCRIPT.parent))

import attention_context


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("text, parsed", [
    ("64x4/1", {"keys": 64, "warps": 4, "stages": None, "splits": 1, "ahead": True}),
    ("128x8x2/16+0", {"keys": 128, "warps": 8, "stages": 2, "splits": 16, "ahead": False}),
    ("32x4+1", {"keys": 32, "warps": 4, "stages": None, "splits": 16, "ahead": True})])
def test_configuration_strings(text, parsed):
    assert attention_context.parse_config(text) == parsed


@pytest.mark.parametrize("text", ["64", "60x4", "64x3", "64x4x0", "64x4x2x1", "ax4", "8x4", "64x4/0", "64x4/a",
                                  "64x4+2", "64x4/1+", "64x4+a"])
def test_bad_configuration_strings_name_the_value_and_the_form(text):
    with pytest.raises(ValueError, match=rf"{re.escape(repr(text))}: KEYSxWARPS\[xSTAGES\]\[/SPLITS\]\[\+AHEAD\] "
                                         "expected"):
        attention_context.parse_config(text)


def measurement() -> dict:
    runs = {"target_step_ms": {"1": [1.0, 1.2, 1.1], "128": [1.1, 1.3, 1.2]},
            "target_verify_ms": {"1": [1.1, 1.3, 1.2], "128": [1.2, 1.2, 1.2]},
            "draft_step_ms": {"1": [0.2, 0.2, 0.2], "128": [0.3, 0.24, 0.25]}}
    return {"machine": {"gpu": "Some GPU"}, "pair": "a+b", "k": 4, "contexts": [1, 128], "rounds": 3,
            "configs": {"64x4": {"config": {"keys": 64, "warps": 4, "stages": None, "splits": 16}, **runs,
                                 "same_tokens_as_first": True},
                        "64x4/1+0": {"config": {"keys": 64, "warps": 4, "stages": None, "splits": 1, "ahead": False},
                                     **runs, "same_tokens_as_first": True}}}


def test_table_gives_medians_ranges_and_ratios(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(measurement()))
    done = run_script("--table", str(path))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| Some GPU")]
    assert rows == [
        "| Some GPU | a+b | 64 x 4 x default / 16 (from 0 keys) | 1 | 1.1000 [1.0000, 1.2000] | 1.2000 [1.1000, 1.3000] (1.091) "
        "| 0.2000 [0.2000, 0.2000] | 0.182 | yes | 3 |",
        "| Some GPU | a+b | 64 x 4 x default / 16 (from 0 keys) | 128 | 1.2000 [1.1000, 1.3000] | 1.2000 [1.2000, 1.2000] (1.000) "
        "| 0.2500 [0.2400, 0.3000] | 0.208 | yes | 3 |",
        "| Some GPU | a+b | 64 x 4 x default / 1, each tile loaded in turn | 1 | 1.1000 [1.0000, 1.2000] | 1.2000 [1.1000, "
        "1.3000] (1.091) | 0.2000 [0.2000, 0.2000] | 0.182 | yes | 3 |",
        "| Some GPU | a+b | 64 x 4 x default / 1, each tile loaded in turn | 128 | 1.2000 [1.1000, 1.3000] | 1.2000 [1.2000, "
        "1.2000] (1.000) | 0.2500 [0.2400, 0.3000] | 0.208 | yes | 3 |"]


@pytest.mark.parametrize("args, message", [
    (["--configs", "64x3"], "'64x3': KEYSxWARPS[xSTAGES][/SPLITS][+AHEAD] expected"),
    (["--contexts", "0,64"], "--contexts 0,64, --k 4, --rounds 3: each must be >= 1"),
    (["--pair", "nope"], "--pair 'nope': one of"),
    (["--table", "missing.json"], "--table: no such file: missing.json"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, message):
    done = run_script(*args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
