"""The Triton batch-1 GEMV (`engine.linear_kernel=triton_gemv`) and its skinny sibling for 2..16 rows
(`triton_skinny`): products against a float64 reference, on a GPU (`pytest -m cuda`) and, where triton is
installed, under Triton's CPU interpreter; the linear-ops tables' routing and fallbacks and the config's checks
everywhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    PRODUCT_SIZES,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
    variants_to_check,
)

from specexp.engine.config import EngineConfig, EngineConfigError
from specexp.models import triton_gemv
from specexp.models.layers import RMSNorm
from specexp.models.linear_ops import CUBLAS, TRITON_GEMV, TRITON_SKINNY, add_linear_
from specexp.models.triton_gemv import skinny_config

# (K, N): K below, at and past one 1024-wide chunk and not a multiple of it; N odd, below and past BLOCK_N
SHAPES = [(5, 3), (64, 1), (1000, 37), (1024, 256), (2500, 130)]


# the RMSNorm before the product fused in ("norm"), with its weight folded into W ("rms": 1/rms(x) alone), or not
FUSIONS = ("none", "norm", "rms")
# rows of x: the GEMV (1), then the skinny kernel at and between powers of 2 (a verify of k + 1 <= 9 tokens, a
# draft prefill region of k + 2 <= 10, the 16 it takes at most)
TOKENS = (1, 2, 3, 5, 9, 16)


def float64_product(x: torch.Tensor, w: torch.Tensor, fusion: str = "none", norm_weight: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """What `triton_gemv.gemv` computes, in float64 on the CPU: a @ w^T (+ bias) (+ residual), a = x, or rms_norm(x)
    (eps 1e-5) with fusion "rms", times norm_weight with "norm"."""
    a = x.double().cpu()
    if fusion != "none":
        a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-5)
    if fusion == "norm":
        a = a * norm_weight.double().cpu()
    out = a @ w.double().cpu().T
    for term in (bias, residual):
        if term is not None:
            out = out + term.double().cpu()
    return out


def check_products(device: str, dtypes, fusions=FUSIONS, tokens=TOKENS) -> None:
    """Every SHAPES x dtypes x fusions x tokens product of triton_gemv.gemv, with and without bias and residual,
    vs a float64 reference."""
    gen = torch.Generator().manual_seed(0)
    cases = [(s, d, f, m) for s in SHAPES for d in dtypes for f in fusions for m in tokens]
    epilogues = [(False, False), (True, False), (False, True), (True, True)]
    for i, ((k, n), dtype, fusion, m) in enumerate(cases):
        # on the large shapes in the interpreter one epilogue a case, in turn: each fusion and row count meets several
        for with_bias, with_residual in variants_to_check(epilogues, device, k * n, i):
            x, w = torch.randn(m, k, generator=gen) * 3, torch.randn(n, k, generator=gen) / k**0.5
            # rows of very different scale: each row's RMSNorm must use its own rms
            x = x * torch.logspace(-1, 1, m).unsqueeze(1)
            bias, residual = torch.randn(n, generator=gen), torch.randn(m, n, generator=gen)
            norm_weight = torch.rand(k, generator=gen) + 0.5
            x, w, bias, residual, norm_weight = (t.to(dtype) for t in (x, w, bias, residual, norm_weight))
            expected = float64_product(x, w, fusion, norm_weight, bias if with_bias else None,
                                       residual if with_residual else None)
            res = residual.to(device).clone() if with_residual else None
            norm = {"none": {}, "norm": {"norm_weight": norm_weight.to(device), "eps": 1e-5},
                    "rms": {"eps": 1e-5, "rms_only": True}}[fusion]
            got = triton_gemv.gemv(x.to(device), w.to(device), bias.to(device) if with_bias else None,
                                   residual=res, **norm)
            assert got.shape == (m, n) and got.dtype == dtype
            if with_residual:
                assert got.data_ptr() == res.data_ptr(), "the residual is updated in place"
            tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3}[dtype]
            scale = expected.abs().max().item() + 1
            err = (got.double().cpu() - expected).abs().max().item() / scale
            label = f"M={m} K={k} N={n} {dtype} {fusion} bias={with_bias} residual={with_residual}"
            assert err < tol, f"{label}: error {err:.2e}"


def check_float_logits(device: str) -> None:
    """gemv(..., out_dtype=float32) holds exactly gemv(...).float() (rounded to x's dtype first), on the GEMV and
    the skinny kernel, with bias or not, fused norm or not; and the Triton tables' float_logits is that."""
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m in (1, 3):
            for k, n in ((64, 37), (1000, 70)):
                x = torch.randn(m, k, generator=gen).to(dtype).to(device)
                w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
                bias = torch.randn(n, generator=gen).to(dtype).to(device)
                for b in (None, bias):
                    for norm in ({}, {"eps": 1e-5, "rms_only": True}):
                        want = triton_gemv.gemv(x, w, b, **norm).float()
                        got = triton_gemv.gemv(x, w, b, out_dtype=torch.float32, **norm)
                        assert got.dtype == torch.float32 and torch.equal(got, want), f"{dtype} M={m} N={n}"


def check_head_tile(device: str) -> None:
    """An LM head on its own tile (`head_config`: 16 rows a program, narrower chunks, 8 warps) with the final norm
    fused, weight scaled or folded: fp32 logits within rounding of a float64 reference, at hidden sizes below, at
    and past one chunk."""
    gen = torch.Generator().manual_seed(4)
    for k, n in ((64, 300), (256, 37), (1000, 513)):
        x = torch.randn(1, k, generator=gen) * 3
        w, g = torch.randn(n, k, generator=gen) / k**0.5, torch.rand(k, generator=gen) + 0.5
        a = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
        for scale, weight, reference in (({"norm_weight": g.to(device)}, w, (a * g.double()) @ w.double().T),
                                         ({"rms_only": True}, w * g, a @ (w * g).double().T)):
            got = triton_gemv.gemv(x.to(device), weight.to(device), eps=1e-5, out_dtype=torch.float32,
                                   config=triton_gemv.head_config(k), **scale)
            assert got.dtype == torch.float32 and got.shape == (1, n)
            err = (got.double().cpu() - reference).abs().max().item() / (reference.abs().max().item() + 1)
            assert err < 1e-4, f"K={k} N={n} {sorted(scale)}: error {err:.2e}"


def check_row_grid(device: str) -> None:
    """With ROW_GRID_MAX_TOKENS = 2, products of 2 rows within ROW_GRID_MAX_N x ROW_GRID_MAX_K run a GEMV program per
    row: within rounding of a float64 reference, and a row's values do not depend on the other rows (bit for bit:
    the row beside itself gives the same), with bias, residual, fused norm or not, fp32 logits; wider outputs,
    longer inputs, more rows or a given config go to the skinny kernel."""
    gen = torch.Generator().manual_seed(5)
    rows = 2
    # this process only (a subprocess in the interpreter; the GPU test restores it)
    triton_gemv.ROW_GRID_MAX_TOKENS = rows
    for dtype in (torch.bfloat16, torch.float32):
        for k, n in ((64, 37), (1000, 70), (300, triton_gemv.ROW_GRID_MAX_N)):
            x = (torch.randn(rows, k, generator=gen) * torch.logspace(-1, 1, rows).unsqueeze(1)).to(dtype).to(device)
            w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
            bias, residual = torch.randn(n, generator=gen), torch.randn(rows, n, generator=gen)
            bias, residual = bias.to(dtype).to(device), residual.to(dtype).to(device)
            norm_weight = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device)
            fused = {"rms": {"eps": 1e-5, "rms_only": True}, "norm": {"eps": 1e-5, "norm_weight": norm_weight}}
            for fusion, case in (("none", {}), ("none", {"bias": bias}), ("rms", fused["rms"]),
                                 ("norm", fused["norm"]), ("none", {"out_dtype": torch.float32})):
                for with_residual in (False,) if "out_dtype" in case else (False, True):
                    whole = triton_gemv.gemv(x, w, residual=residual.clone() if with_residual else None, **case)
                    want = float64_product(x, w, fusion, norm_weight, case.get("bias"),
                                           residual if with_residual else None)
                    err = (whole.double().cpu() - want).abs().max().item() / (want.abs().max().item() + 1)
                    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
                    assert err < tol, f"{dtype} {sorted(case)}: {err:.2e}"
                    for r in range(rows):
                        twin = [r] * rows
                        alone = triton_gemv.gemv(x[twin], w, residual=residual[twin].clone() if with_residual else None,
                                                 **case)
                        label = f"{dtype} K={k} N={n} {sorted(case)} residual={with_residual} row {r}"
                        assert torch.equal(whole[r].expand_as(alone), alone), label
    launches = []  # the rows of each GEMV-kernel launch
    launch = triton_gemv._launch_gemv

    def counted_launch(x, *args, **kwargs):
        launches.append(x.shape[0])
        return launch(x, *args, **kwargs)

    triton_gemv._launch_gemv = counted_launch
    try:
        wide = torch.randn(triton_gemv.ROW_GRID_MAX_N + 1, 64, generator=gen).to(device)
        x = torch.randn(rows + 1, triton_gemv.ROW_GRID_MAX_K + 1, generator=gen).to(device)
        triton_gemv.gemv(x[:rows, :64], wide)  # wider: skinny
        triton_gemv.gemv(x[:rows], wide[:8, :1].expand(8, x.shape[1]).contiguous())  # longer: skinny
        triton_gemv.gemv(x[:, :64], wide[:64])  # more rows: skinny
        triton_gemv.gemv(x[:rows, :64], wide[:64], config=(16, 64, 4, 2))  # a tuned tile: skinny
        assert launches == [], launches
        triton_gemv.gemv(x[:rows, :64], wide[:64])
        assert launches == [rows], launches
    finally:
        triton_gemv._launch_gemv = launch


def test_row_grid_rows_are_independent_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_gemv", "check_row_grid")


@on_triton_gpu
def test_row_grid_rows_are_independent_on_gpu(monkeypatch):
    monkeypatch.setattr(triton_gemv, "ROW_GRID_MAX_TOKENS", triton_gemv.ROW_GRID_MAX_TOKENS)  # restored after
    check_row_grid("cuda")


def test_lm_head_tile_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_gemv", "check_head_tile")


@on_triton_gpu
def test_float_logits_are_the_cast_products_on_gpu():
    check_float_logits("cuda")
    x, w = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16), torch.randn(50, 64, device="cuda",
                                                                              dtype=torch.bfloat16)
    for table in (TRITON_GEMV, TRITON_SKINNY):
        assert torch.equal(table.float_logits(x, w, None), triton_gemv.gemv(x, w).float())


def test_float_logits_are_the_cast_products_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_gemv", "check_float_logits")


@on_triton_gpu
def test_gemv_matches_reference_on_gpu():
    check_products("cuda", (torch.float32, torch.bfloat16, torch.float16))


def test_skinny_config_fits_its_stages_in_shared_memory():
    """The tuned 16-bit configurations keep their stages; 4-byte products drop stages until the pipeline fits
    (fp32 at the tuned stages asked the H200 for more shared memory than a block has)."""
    pytest.importorskip("triton")
    for n, k in [(130, 2500), (2048, 2048), (4096, 8192), (8192, 2048), (128256, 2048), (3, 5)]:
        assert skinny_config(n, k, 2)[3] == next(c for b, c in triton_gemv.SKINNY_CONFIGS_BY_N
                                                 if b is None or n <= b)[3]
        for element_bytes in (2, 4):
            block_n, block_k, _, stages = skinny_config(n, k, element_bytes)
            assert stages >= 1
            stage_bytes = (triton_gemv.TOKEN_TILE + block_n) * block_k * element_bytes
            assert stages * stage_bytes <= triton_gemv.SKINNY_STAGE_BYTES


POINTERS = ("x_ptr", "norm_w_ptr", "w_ptr", "bias_ptr", "res_ptr", "y_ptr")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("norm", ["none", "norm", "rms"])
def test_every_launch_fits_a_hopper_block(dtype, norm):
    """Compiled for sm_90 without a GPU, every kernel configuration `gemv` launches (GEMV, skinny at each
    output-width bound of SKINNY_CONFIGS_BY_N) compiles and asks for no more shared memory than a Hopper block has.
    The fp32 skinny tiles first tuned on an H200 asked for 235520 bytes and failed only there."""
    if not triton_gemv.AVAILABLE:
        pytest.skip("triton is not installed")
    element_bytes = {"bf16": 2, "fp32": 4}[dtype]
    flags = {"HAS_BIAS": True, "HAS_RESIDUAL": True, "NORM": norm != "none", "SCALE": norm == "norm"}
    pointers = {name: f"*{dtype}" for name in POINTERS}
    k = 2500  # past one 1024-wide chunk: the widest BLOCK_K each kernel takes
    gemv_block_n = triton_gemv.NORM_BLOCK_N if norm != "none" else triton_gemv.BLOCK_N
    shared = {"gemv": hopper_shared_bytes(
        triton_gemv._gemv_kernel, {**pointers, **PRODUCT_SIZES},
        {**flags, "BLOCK_N": gemv_block_n, "BLOCK_K": triton_gemv.MAX_BLOCK_K}, triton_gemv.NUM_WARPS)}
    for bound, _ in triton_gemv.SKINNY_CONFIGS_BY_N:
        block_n, block_k, warps, stages = skinny_config(bound or 8192, k, element_bytes)
        shared[f"skinny N<={bound}"] = hopper_shared_bytes(
            triton_gemv._skinny_kernel, {**pointers, **PRODUCT_SIZES},
            {**flags, "IEEE": dtype == "fp32", "BLOCK_M": triton_gemv.TOKEN_TILE, "BLOCK_N": block_n,
             "BLOCK_K": block_k}, warps, stages)
    shared["gemv, fp32 logits"] = hopper_shared_bytes(
        triton_gemv._gemv_kernel, {**pointers, "y_ptr": "*fp32", **PRODUCT_SIZES},
        {**flags, "HAS_RESIDUAL": False, "BLOCK_N": gemv_block_n, "BLOCK_K": triton_gemv.MAX_BLOCK_K},
        triton_gemv.NUM_WARPS)
    head_n, head_k, head_warps = triton_gemv.head_config(k)
    shared["LM head"] = hopper_shared_bytes(
        triton_gemv._gemv_kernel, {**pointers, "y_ptr": "*fp32", **PRODUCT_SIZES},
        {**flags, "HAS_RESIDUAL": False, "BLOCK_N": head_n, "BLOCK_K": head_k}, head_warps)
    too_big = {name: size for name, size in shared.items() if size > HOPPER_SHARED_BYTES}
    assert not too_big, f"{dtype}, norm={norm}: shared memory over {HOPPER_SHARED_BYTES} bytes: {too_big}"


@on_triton_gpu
def test_triton_table_takes_single_rows_only():
    w = torch.randn(96, 200, device="cuda")
    one, many = torch.randn(1, 200, device="cuda"), torch.randn(3, 200, device="cuda")
    torch.testing.assert_close(TRITON_GEMV.linear(one, w, None), F.linear(one, w), atol=1e-4, rtol=1e-4)
    assert torch.equal(TRITON_GEMV.linear(many, w, None), F.linear(many, w))  # cuBLAS, bit for bit
    residual = torch.randn(1, 96, device="cuda")
    expected = residual + F.linear(one, w)
    torch.testing.assert_close(TRITON_GEMV.add_linear_(residual, one, w, None), expected, atol=1e-4, rtol=1e-4)
    norm = RMSNorm(200, 1e-6).cuda()
    torch.testing.assert_close(TRITON_GEMV.norm_linear(one, norm, w, None), F.linear(norm(one), w),
                               atol=1e-4, rtol=1e-4)
    assert torch.equal(TRITON_GEMV.norm_linear(many, norm, w, None), F.linear(norm(many), w))


def test_gemv_matches_reference_in_triton_interpreter():
    """The kernel's arithmetic on CPU tensors, in Triton's interpreter (skipped without triton)."""
    run_in_triton_interpreter('test_triton_gemv', 'check_products', "(torch.float32,)")


def test_triton_table_falls_back_to_torch_off_the_gpu():
    """On CPU tensors (or without triton) the triton table is torch's GEMMs, bit for bit."""
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(7, 11, generator=gen), torch.randn(7, generator=gen)
    for table in (TRITON_GEMV, TRITON_SKINNY):
        for rows in (1, 4):
            x, residual = torch.randn(rows, 11, generator=gen), torch.randn(rows, 7, generator=gen)
            assert torch.equal(table.linear(x, w, b), CUBLAS.linear(x, w, b))
            assert torch.equal(table.add_linear_(residual.clone(), x, w, b), add_linear_(residual.clone(), x, w, b))
            norm = RMSNorm(11, 1e-6)
            for n in (norm, None):
                assert torch.equal(table.norm_linear(x, n, w, b), CUBLAS.norm_linear(x, n, w, b))
            assert torch.equal(table.float_logits(x, w, b), CUBLAS.linear(x, w, b).float())
            assert torch.equal(table.norm_float_logits(x, norm, w, b), CUBLAS.linear(norm(x), w, b).float())


@on_triton_gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_triton_tables_fuse_one_row_final_norm_into_the_lm_head(dtype, tol):
    """norm_float_logits: one row's final norm inside the head's GEMV (its weight folded or not), fp32 logits equal
    to the fused-norm GEMV's; several rows normalised apart, then the table's float_logits, bit for bit; both
    within rounding of normalising first."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(300, 200, generator=gen) / 200**0.5).to(device="cuda", dtype=dtype)
    norm = RMSNorm(200, 1e-6).to(device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(200, generator=gen) + 0.5)
    folded = RMSNorm(200, 1e-6).to(device="cuda", dtype=dtype)
    folded.folded = True
    for table in (TRITON_GEMV, TRITON_SKINNY):
        for rows in (1, 4):
            x = (torch.randn(rows, 200, generator=gen) * 3).to(device="cuda", dtype=dtype)
            got = table.norm_float_logits(x, norm, w, None)
            want = F.linear(norm(x), w).float()
            assert got.dtype == torch.float32 and got.shape == (rows, 300)
            assert (got - want).abs().max().item() < tol * (want.abs().max().item() + 1), f"{dtype} rows={rows}"
            if rows == 1:
                head = {"eps": 1e-6, "out_dtype": torch.float32, "config": triton_gemv.head_config(200)}
                assert torch.equal(got, triton_gemv.gemv(x, w, norm_weight=norm.weight, **head))
                assert torch.equal(table.norm_float_logits(x, folded, w, None),
                                   triton_gemv.gemv(x, w, rms_only=True, **head))
            else:
                assert torch.equal(got, table.float_logits(norm(x), w, None))


@on_triton_gpu
def test_skinny_table_takes_up_to_max_tokens_rows():
    """triton_skinny: 1..MAX_TOKENS rows on the Triton kernels (the skinny kernel from 2); more rows on cuBLAS,
    bit for bit."""
    table, most = TRITON_SKINNY, triton_gemv.MAX_TOKENS
    w, norm = torch.randn(96, 200, device="cuda"), RMSNorm(200, 1e-6).cuda()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(200) + 0.5)
    folded = RMSNorm(200, 1e-6).cuda()  # the same norm with its weight folded into the projection
    folded.folded = True
    w_folded = w * norm.weight.detach()
    for rows in sorted({1, 2, 3, most // 2 + 1, most}):
        x = torch.randn(rows, 200, device="cuda")
        torch.testing.assert_close(table.linear(x, w, None), F.linear(x, w), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(table.norm_linear(x, norm, w, None), F.linear(norm(x), w), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(table.norm_linear(x, folded, w_folded, None), F.linear(norm(x), w),
                                   atol=1e-4, rtol=1e-4)
        residual = torch.randn(rows, 96, device="cuda")
        expected = residual + F.linear(x, w)
        torch.testing.assert_close(table.add_linear_(residual, x, w, None), expected, atol=1e-4, rtol=1e-4)
    many = torch.randn(most + 1, 200, device="cuda")
    assert torch.equal(table.linear(many, w, None), F.linear(many, w))  # cuBLAS, bit for bit
    strided = torch.randn(most, 400, device="cuda")[:, ::2]  # a strided view: the kernels read a contiguous copy
    torch.testing.assert_close(table.linear(strided, w, None), F.linear(strided, w), atol=1e-4, rtol=1e-4)


def test_gemv_rejects_more_rows_than_it_takes():
    if not triton_gemv.AVAILABLE:
        pytest.skip("triton is not installed")
    x = torch.zeros(triton_gemv.MAX_TOKENS + 1, 8)
    with pytest.raises(ValueError, match=f"1..{triton_gemv.MAX_TOKENS} rows of x"):
        triton_gemv.gemv(x, torch.zeros(4, 8))


def test_gemv_rejects_rms_only_with_a_norm_weight():
    if not triton_gemv.AVAILABLE:
        pytest.skip("triton is not installed")
    with pytest.raises(ValueError, match="rms_only normalises without a weight"):
        triton_gemv.gemv(torch.zeros(2, 8), torch.zeros(4, 8), norm_weight=torch.ones(8), rms_only=True)


def test_linear_kernel_is_validated():
    with pytest.raises(EngineConfigError, match="engine.linear_kernel='gemv'.*'cublas', 'triton_gemv'"):
        EngineConfig(linear_kernel="gemv").validate()
    for choice in ("triton_gemv", "triton_skinny"):
        with pytest.raises(EngineConfigError, match=f"engine.linear_kernel='{choice}' needs engine.device=cuda"):
            EngineConfig(device="cpu", linear_kernel=choice).validate()
    EngineConfig(linear_kernel="cublas").validate()
