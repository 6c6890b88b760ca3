"""The gate/up projection with its SiLU product in one skinny kernel (`triton_gemv.gate_up_silu`,
`engine.silu_in_gate_up`: a verify's gated MLP of 2..16 tokens on the `triton_skinny` table): against the skinny
product followed by eager's SiLU and multiply, under Triton's CPU interpreter, on a GPU (`pytest -m cuda`) and
compiled for a Hopper GPU without one; the table's routing and the config's check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    compile_for_hopper,
    on_triton_gpu,
    run_in_triton_interpreter,
    variants_to_check,
)

from specexp.models import triton_gemv
from specexp.models.linear_ops import no_gate_up_silu

ZOO = Path(__file__).resolve().parents[2] / "specexp" / "zoo"

# (I, K): widths below, at and past a program's rows; K below, at and past one chunk and not a multiple of it
SHAPES = [(5, 3), (40, 64), (300, 130), (1100, 600)]


def check_gate_up_silu(device: str, dtypes=(torch.float32, torch.bfloat16)) -> None:
    """gate_up_silu(x, W) == silu(gate) * up of the skinny product x W^T (gemv), each step rounded to the dtype as
    eager rounds it, within one rounding of the dtype, for 2, 5 and 16 rows, with and without the folded norm (in the
    interpreter, on shapes past BIG_SHAPE, one of the two a case)."""
    gen = torch.Generator().manual_seed(0)
    for (i, k), dtype in [(s, d) for s in SHAPES for d in dtypes]:
        w = (torch.randn(2 * i, k, generator=gen) / k**0.5).to(dtype).to(device)
        for rows in (2, 5, 16):
            x = (torch.randn(rows, k, generator=gen) * 3).to(dtype).to(device)
            norms = [{}, {"rms_only": True, "eps": 1e-5}]
            for norm in variants_to_check(norms, device, 2 * i * k, rows + (dtype == torch.float32)):
                gate, up = triton_gemv.gemv(x, w, **norm).split(i, dim=-1)
                expected = (F.silu(gate.float()).to(dtype).float() * up.float()).to(dtype)
                got = triton_gemv.gate_up_silu(x, w, **norm)
                label = f"I={i} K={k} M={rows} {dtype} {sorted(norm)}"
                assert got.shape == (rows, i) and got.dtype == dtype, label
                tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
                err = (got.double() - expected.double()).abs().max().item() / (expected.abs().max().item() + 1)
                assert err < tol, f"{label}: error {err:.2e}"


def test_gate_up_silu_matches_the_unfused_kernels_in_triton_interpreter():
    # fp32 and fp16 only: Triton's interpreter gets bf16 tensor-core products (tl.dot) wrong (values ~1e18 where
    # the product is ~1; fp16 and fp32 are right), so a bf16 check there compares two wrong skinny products.
    run_in_triton_interpreter("test_triton_gate_up_silu", "check_gate_up_silu", "(torch.float32, torch.float16)")


@on_triton_gpu
def test_gate_up_silu_matches_the_unfused_kernels_on_gpu():
    check_gate_up_silu("cuda", (torch.float32, torch.bfloat16, torch.float16))


def test_gate_up_silu_rejects_bad_shapes():
    w = torch.zeros(6, 8)
    for x, weight in ((torch.zeros(1, 8), w), (torch.zeros(17, 8), w), (torch.zeros(2, 7), w),
                      (torch.zeros(2, 8), torch.zeros(5, 8))):
        with pytest.raises(ValueError, match="gate_up_silu takes x"):
            triton_gemv.gate_up_silu(x, weight)


@pytest.mark.parametrize(("width", "k"), [(8192, 2048), (1024, 512), (6656, 1024)])
def test_the_launch_fits_a_hopper_block(width, k):
    """At the real-size shapes (Llama-3.2-1B, Llama-100M, LFM2-350M), bf16 with the folded norm, launched early:
    its shared memory fits a block."""
    if not triton_gemv.AVAILABLE:
        pytest.skip("needs Triton")
    block_n, block_k, warps, stages = triton_gemv.gate_up_config(2 * width, k)
    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "I": "i32", "K": "i32",
                 "stride_x": "i32", "stride_w": "i32", "stride_y": "i32", "eps": "fp32"}
    compiled = compile_for_hopper(triton_gemv._skinny_gate_up_kernel, signature,
                                  {"NORM": True, "IEEE": False, "BLOCK_M": triton_gemv.TOKEN_TILE, "BLOCK_N": block_n,
                                   "BLOCK_K": block_k, "GDC": True}, warps, stages, launch_pdl=True)
    assert compiled.metadata.shared <= HOPPER_SHARED_BYTES


def test_only_the_skinny_table_fuses_and_not_on_cpu_tensors():
    """No table fuses unless asked; only the skinny table can be asked; its fused op returns None off the GPU, so
    a gated MLP there runs as before."""
    from specexp.models.layers import GatedMLP
    from specexp.models.linear_ops import CUBLAS, TRITON_GEMV, TRITON_SKINNY, linear_kernel_ops

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 8, generator=gen), torch.randn(12, 8, generator=gen)
    fused = TRITON_SKINNY.with_silu_in_gate_up()
    for table in (CUBLAS, TRITON_GEMV, TRITON_SKINNY, fused, linear_kernel_ops("triton_skinny", True)):
        assert table.gate_up_silu(x, None, w) is None
    assert linear_kernel_ops("triton_skinny", True).with_silu_in_gate_up().pdl
    for table in (CUBLAS, TRITON_GEMV):
        with pytest.raises(ValueError, match="needs the skinny kernel's table"):
            table.with_silu_in_gate_up()
    mlp = GatedMLP(8, 6)
    residual = torch.randn(3, 8, generator=gen)
    expected = mlp(x, residual.clone())
    mlp.linear_ops = fused
    assert torch.equal(mlp(x, residual.clone()), expected)


def test_silu_in_gate_up_is_validated():
    from specexp.engine.config import EngineConfig, EngineConfigError

    for value in (True, "target", "draft"):
        EngineConfig(device="cuda", linear_kernel="triton_skinny", silu_in_gate_up=value).validate()
        for kernel in ("cublas", "triton_gemv"):
            with pytest.raises(EngineConfigError, match=f"engine.silu_in_gate_up={str(value).lower()} .* needs "
                                                        f"engine.linear_kernel=triton_skinny \\(got '{kernel}'\\)"):
                EngineConfig(device="cuda", linear_kernel=kernel, silu_in_gate_up=value).validate()
    with pytest.raises(EngineConfigError, match="engine.silu_in_gate_up='yes': must be true, false, target or draft"):
        EngineConfig(silu_in_gate_up="yes").validate()


@pytest.mark.parametrize(("silu_in_gate_up", "skinny_early_launch", "gemv_early_launch", "fused", "early",
                          "gemv_early"),
                         [(True, "both", "both", (True, True), (True, True), (True, True)),
                          ("target", "draft", "target", (True, False), (False, True), (True, False)),
                          ("draft", "target", "draft", (False, True), (True, False), (False, True)),
                          (False, "none", "none", (False, False), (False, False), (False, False))])
def test_each_model_gets_its_own_table(silu_in_gate_up, skinny_early_launch, gemv_early_launch, fused, early,
                                       gemv_early, monkeypatch):
    """engine.silu_in_gate_up, skinny_early_launch and gemv_early_launch name models: the target's table and the
    draft's differ as they say (programmatic launch on, as on an sm_90+ GPU)."""
    from specexp.engine.config import EngineConfig
    from specexp.engine.model_kernels import use_engine_kernels
    from specexp.models import load_model

    monkeypatch.setattr(EngineConfig, "launches_early", lambda self: True)
    models = (load_model(ZOO / "tiny-llama"), load_model(ZOO / "tiny-llama-draft"))
    use_engine_kernels(models, EngineConfig(device="cpu", linear_kernel="triton_skinny",
                                            silu_in_gate_up=silu_in_gate_up, skinny_early_launch=skinny_early_launch,
                                            gemv_early_launch=gemv_early_launch))
    for model, fused_here, early_here, gemv_early_here in zip(models, fused, early, gemv_early, strict=True):
        tables = {m.linear_ops for m in model.modules() if hasattr(m, "linear_ops")}
        assert len(tables) == 1
        table = tables.pop()
        assert table.pdl == gemv_early_here and table.skinny_pdl == early_here
        assert (table.gate_up_silu is not no_gate_up_silu) == fused_here


@on_triton_gpu
def test_the_skinny_table_fuses_two_to_sixteen_rows_on_gpu():
    """On the GPU the fused skinny table takes 2..16 rows without a bias (the norm absent or folded), and leaves
    one row, 17 rows and a biased product to the unfused path; a gated MLP on it matches the unfused table's."""
    from specexp.models.layers import GatedMLP, RMSNorm
    from specexp.models.linear_ops import TRITON_SKINNY

    fused = TRITON_SKINNY.with_silu_in_gate_up()
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(2 * 256, 128, generator=gen) / 128**0.5).to(torch.bfloat16).cuda()
    folded = RMSNorm(128, 1e-5).cuda()
    folded.folded = True
    for rows, norm in ((2, None), (9, folded), (16, None)):
        x = torch.randn(rows, 128, generator=gen).to(torch.bfloat16).cuda()
        got = fused.gate_up_silu(x, norm, w)
        extra = {} if norm is None else {"rms_only": True, "eps": 1e-5}
        assert torch.equal(got, triton_gemv.gate_up_silu(x, w, **extra))
    for rows, bias in ((1, None), (17, None), (4, torch.zeros(512, dtype=torch.bfloat16, device="cuda"))):
        x = torch.randn(rows, 128, generator=gen).to(torch.bfloat16).cuda()
        assert fused.gate_up_silu(x, None, w, bias) is None
    mlp = GatedMLP(128, 256).to(torch.bfloat16).cuda()
    x = torch.randn(5, 128, generator=gen).to(torch.bfloat16).cuda()
    mlp.linear_ops = TRITON_SKINNY
    expected = mlp(x, torch.zeros_like(x))
    mlp.linear_ops = fused
    got = mlp(x, torch.zeros_like(x))
    assert (got.float() - expected.float()).abs().max().item() <= 2e-2 * (expected.abs().max().item() + 1)
