"""benchmarks/diagnostics/skinny_alternatives.py: its three kernels against F.linear under Triton's interpreter, the
configurations it tries, and its argument checks (the timing itself needs a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "diagnostics" / "skinny_alternatives.py"
sys.path.insert(0, str(SCRIPT.parent))

import skinny_alternatives

from specexp.models import triton_support


def check_kernels() -> None:
    """Every kernel equals F.linear in fp32 (within 1e-5 of the largest output) at 2 or 5 rows, with a residual or
    a folded norm, K a multiple of the chunk and not; split K over 1, 2 and 4 programs leaves every count at zero."""
    gen = torch.Generator().manual_seed(0)
    work = skinny_alternatives.SplitKWorkspace.allocate("cpu", max_n=512, max_tiles=64)
    for n, k, has_residual, norm, rows in [(96, 256, True, False, 2), (80, 300, False, True, 5),
                                           (40, 64, True, True, 2), (40, 64, False, False, 5)]:
        w = torch.randn(n, k, generator=gen) / k**0.5
        x = torch.randn(rows, k, generator=gen)
        residual = torch.randn(rows, n, generator=gen) if has_residual else None
        expected = skinny_alternatives.reference(x, w, residual, norm)
        runs = [(skinny_alternatives.split_k, {"work": work}, (16, 64, 4, 2, split)) for split in (1, 2, 4)]
        runs += [(skinny_alternatives.row_gemv, {}, (block_n, 64, 4, ahead)) for block_n in (1, 4)
                 for ahead in (False, True)]
        runs += [(skinny_alternatives.row_grid, {}, (block_n, 64, 4, ahead)) for block_n in (8, 32)
                 for ahead in (False, True)]
        for run, extra, config in runs:
            got = run(x, w, config=config, residual=None if residual is None else residual.clone(), norm=norm,
                      **extra)
            err = ((got - expected).abs().max() / expected.abs().max()).item()
            assert got.shape == (rows, n) and err < 1e-5, f"{run.__name__} {config} n={n} k={k} M={rows}: {err}"
            assert not work.counts.any(), f"{config}: a tile's count was left set"


def test_kernels_match_f_linear_in_triton_interpreter():
    if not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "from test_skinny_alternatives import check_kernels; check_kernels(); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_candidates_fit_the_product():
    if not triton_support.AVAILABLE:
        pytest.skip("triton is not installed")
    for config in skinny_alternatives.candidates("split_k", 5, 768):  # 768 columns: at most 6 chunks of 128
        assert 768 // config[1] >= config[4]
    assert {c[4] for c in skinny_alternatives.candidates("split_k", 5, 8192)} == {1, 2, 4, 8}
    for tokens in (2, 5, 9, 16):
        tried = skinny_alternatives.candidates("row_gemv", tokens, 2048)
        padded = 1 << (tokens - 1).bit_length()  # the kernel's BLOCK_M
        per_thread = [padded * block_n * block_k // (32 * warps) for block_n, block_k, warps, _ in tried]
        assert tried and max(per_thread) <= skinny_alternatives.MAX_ACCUMULATOR_REGISTERS
    grid = skinny_alternatives.candidates("row_grid", 5, 2048)  # one token's accumulator a program
    assert grid and max(n * k // (32 * w) for n, k, w, _ in grid) <= skinny_alternatives.MAX_ACCUMULATOR_REGISTERS


@pytest.mark.parametrize(("args", "message"), [(["--tokens", "1,5"], "each must be 2..16"),
                                               (["--tokens", "a"], "comma-separated integers"),
                                               (["--section", "cublas"], "invalid choice")])
def test_bad_arguments_exit_2_with_one_line(args, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *(["--section", "split_k"] if "--section" not in args
                                                           else []), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_the_table_shows_each_row_and_the_tokens_asked_for():
    row = {"M": 2, "N": 2048, "K": 2048, "count": 16, "gemv_m1_ms": 0.1, "skinny_ms": 0.2,
           "split_k_ms": {"(16, 512, 4, 2, 2)": 0.15, "(16, 512, 4, 4, 1)": "error x"}, "best": "(16, 512, 4, 2, 2)"}
    copy_bw = 2 * 2048 * 2048 * 16 / 0.1e-3  # bytes/s: the chain's weights (bf16) in 0.1 ms
    result = {"copy_bw": copy_bw, "rows": [row, {**row, "M": 5, "best": None}]}
    lines = skinny_alternatives.render_table(result).splitlines()
    assert lines[2] == ("| 2 | [2048, 2048] x 16 | 0.1000 (100%) | 0.2000 (50%) | 0.1500 (67%) (16, 512, 4, 2, 2) |")
    assert lines[3].endswith("| none ran |")
    assert len(skinny_alternatives.render_table(result, tokens=[5]).splitlines()) == 3
    grid_row = {**row, "row_grid_ms": {"(8, 256, 4, True)": 0.08}, "best": "(8, 256, 4, True)"}
    del grid_row["split_k_ms"]
    assert "best row_grid ms" in skinny_alternatives.render_table({"copy_bw": copy_bw, "rows": [grid_row]})
