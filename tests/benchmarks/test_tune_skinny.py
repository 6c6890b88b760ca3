"""benchmarks/diagnostics/tune_skinny.py without a GPU: the table it derives from a measurement (least summed
time, only past the minimum gain over the default tile), merging measurements, its printed table and its
argument checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "diagnostics" / "tune_skinny.py"
sys.path.insert(0, str(SCRIPT.parent))

import tune_skinny

from specexp.models import skinny_configs

DEFAULT = "(16, 512, 4, 4)"


def timing(default_ms: float, **others: float | None) -> dict:
    return {"default": DEFAULT, "default_ms": default_ms, "one_row_gemv_ms": 0.5 * default_ms,
            "all": {DEFAULT: default_ms, **{f"({k[1:].replace('_', ', ')})": v for k, v in others.items()}}}


def measurement(device: str = "Some GPU") -> dict:
    """Two models sharing the shape (512, 512); (3072, 2048) only in the first; a gate_up_silu shape."""
    return {"device": device, "measured": "2026-12-06", "tokens": [2, 5], "models": {
        "target": {
            "(512, 512)": {"count": 8, "impl": "triton", "2": timing(1.0, c16_512_4_1=0.9, c32_256_4_3=None),
                           "5": timing(1.0, c16_512_4_1=0.9, c32_256_4_3=0.1)},
            "(3072, 2048)": {"count": 16, "impl": "triton_norm", "2": timing(1.0, c32_512_4_3=0.995),
                             "5": timing(1.0, c32_512_4_3=0.995)}},
        "draft": {"(512, 512)": {"count": 4, "impl": "triton", "2": timing(2.0, c16_512_4_1=1.9)}},
        "gated": {"(4096, 512)": {"count": 8, "impl": "gate_up_silu", "kernel": "gate_up_silu",
                                  "2": timing(1.0, c8_512_4_2=0.8)}}}}


def test_choose_sums_every_model_and_row_count_and_keeps_real_gains():
    entries = tune_skinny.choose(measurement(), min_gain=0.01)
    # (512, 512): 0.9 + 0.9 + 1.9 against 4.0; the config that failed once is out; (3072, 2048) gains 0.5% only
    assert entries == [
        {"kernel": "gate_up_silu", "n": 4096, "k": 512, "config": [8, 512, 4, 2], "summed_ms": 0.8,
         "default_summed_ms": 1.0},
        {"n": 512, "k": 512, "config": [16, 512, 4, 1], "summed_ms": 3.7, "default_summed_ms": 4.0}]
    assert [e["n"] for e in tune_skinny.choose(measurement(), min_gain=0.001)] == [4096, 512, 3072]


def test_written_table_is_what_the_engine_reads(tmp_path):
    path = tmp_path / "skinny_some_gpu.json"
    tune_skinny.write_table(measurement(), tune_skinny.choose(measurement(), 0.01), path, 0.01)
    data = json.loads(path.read_text())
    assert data["device"] == "Some GPU" and data["tokens"] == [2, 5]
    assert skinny_configs._table("Some GPU", str(tmp_path)) == {("skinny", 512, 512, 2): (16, 512, 4, 1),
                                                                ("gate_up_silu", 4096, 512, 2): (8, 512, 4, 2)}


def test_merge_joins_models_of_one_device_only():
    other = measurement()
    other["models"] = {"lfm2": other["models"].pop("gated")}
    other["tokens"] = [9]
    more = {**measurement(), "models": {"target": {"(9, 9)": {"count": 1}}}}
    merged = tune_skinny.merge([measurement(), other, more])
    assert sorted(merged["models"]) == ["draft", "gated", "lfm2", "target"] and merged["tokens"] == [2, 5, 9]
    assert sorted(merged["models"]["target"]) == ["(3072, 2048)", "(512, 512)", "(9, 9)"]  # shapes joined
    with pytest.raises(ValueError, match="different GPU models"):
        tune_skinny.merge([measurement(), measurement("Other GPU")])


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def test_cli_prints_tables_writes_from_files_and_rejects_bad_input(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(measurement()))
    second.write_text(json.dumps(measurement("Other GPU")))
    proc = run("--table", str(first))
    assert proc.returncode == 0, proc.stderr
    assert "| target | skinny | [512, 512] x 8 | 5 | 0.5000 | 1.0000 (16, 512, 4, 4) | 0.1000 (32, 256, 4, 3) |" in proc.stdout
    only_two = run("--table", str(first), "--tokens", "2").stdout
    assert "| 2 |" in only_two and "| 5 |" not in only_two
    out = tmp_path / "table.json"
    proc = run("--from", str(first), "--table-out", str(out))
    assert proc.returncode == 0 and json.loads(out.read_text())["configs"][1]["config"] == [16, 512, 4, 1]
    for args, message in [(("--tokens", "1,2"), "--tokens '1,2': give rows between 2 and 16"),
                          (("--targets", "nope"), "unknown model 'nope'"),
                          (("--shapes", "16384-2048"), "--shapes '16384-2048': give weight shapes as NxK"),
                          (("--table", str(tmp_path / "absent.json")), "no such measurement file: "),
                          (("--from", str(first), "--min-gain", "5"), "--min-gain 5.0: give a fraction in [0, 1)"),
                          (("--from", str(first), str(second), "--write"), "--from: measurements of different")]:
        proc = run(*args)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
