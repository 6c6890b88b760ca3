"""benchmarks/diagnostics/cache_writes.py: a command run twice, the kernel-cache files each run wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics"))

import cache_writes

# A stand-in for a process that compiles two kernels into Triton's cache on its first run and finds them there
# on the next (one entry folder per kernel, as Triton writes them).
COMPILE_ONCE = """
import os, pathlib, sys
root = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
for name, key in (("_gemv_kernel", "A1"), ("_skinny_kernel", "B2")):
    entry = root / key
    if not entry.exists():
        entry.mkdir(parents=True)
        (entry / f"{name}.json").write_text("{}")
        (entry / f"{name}.cubin").write_bytes(b"")
        (entry / f"__grp__{name}.json").write_text("{}")
"""


def test_the_second_run_of_a_cached_command_compiles_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    out = tmp_path / "writes.json"
    result = cache_writes.main(["--runs", "2", "--out", str(out), "--", sys.executable, "-c", COMPILE_ONCE])
    first, second = result["runs"]
    assert first["returncode"] == 0 and first["files_written"]["triton"] == 6
    assert first["triton_kernels_compiled"] == {"_gemv_kernel": 1, "_skinny_kernel": 1}
    assert second["files_written"]["triton"] == 0 and second["triton_kernels_compiled"] == {}
    assert json.loads(out.read_text())["runs"][1]["run"] == 2


def test_inductors_triton_folder_is_counted_apart(tmp_path):
    folders = {"inductor_triton": tmp_path / "ind" / "triton", "inductor": tmp_path / "ind"}
    (tmp_path / "ind" / "triton" / "X").mkdir(parents=True)
    (tmp_path / "ind" / "triton" / "X" / "k.json").write_text("{}")
    (tmp_path / "ind" / "fxgraph.bin").write_bytes(b"")
    written = cache_writes.written_since(folders, {})
    assert [p.name for p in written["inductor_triton"]] == ["k.json"]
    assert [p.name for p in written["inductor"]] == ["fxgraph.bin"]


def test_a_missing_command_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cache_writes.main(["--out", str(tmp_path / "w.json")])
    assert exc.value.code == 2
    assert "give the command to run after --" in capsys.readouterr().err
