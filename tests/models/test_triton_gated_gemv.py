"""The gated GEMV (`engine.silu_in_down_gemv`): a SiLU-gated MLP's down projection of one token with the SiLU
product computed in the kernel, against eager silu_mul + the product; on a GPU (`pytest -m cuda`), under Triton's
CPU interpreter, and compiled for a Hopper GPU without one; the table's routing and the config's check."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import (
    HOPPER_SHARED_BYTES,
    PRODUCT_SIZES,
    hopper_shared_bytes,
    on_triton_gpu,
    run_in_triton_interpreter,
)

from specexp.engine.config import EngineConfig, EngineConfigError
from specexp.models import linear_ops, triton_gemv
from specexp.models.linear_ops import CUBLAS, TRITON_GEMV, TRITON_SKINNY, silu_down_
from specexp.models.pointwise import silu_mul

# (I, N): the intermediate width below, at and past one 1024-wide chunk and not a multiple of it; N below and past
# GATED_BLOCK_N, odd
SHAPES = [(5, 3), (64, 1), (1000, 37), (1024, 9), (2500, 130)]


def check_gated(device: str, dtypes=(torch.float32, torch.bfloat16, torch.float16)) -> None:
    """gated_gemv(gate_up, W, bias, residual) == silu_down_ on eager ops (silu_mul, then the product in float64),
    within the dtype's rounding, for every shape, dtype and bias / residual combination; the residual in place."""
    gen = torch.Generator().manual_seed(0)
    for (i, n), dtype in [(s, d) for s in SHAPES for d in dtypes]:
        for with_bias, with_residual in [(False, False), (True, False), (False, True), (True, True)]:
            gate_up = (torch.randn(1, 2 * i, generator=gen) * 3).to(dtype)
            w = (torch.randn(n, i, generator=gen) / i**0.5).to(dtype)
            bias, residual = torch.randn(n, generator=gen).to(dtype), torch.randn(1, n, generator=gen).to(dtype)
            gate, up = gate_up.split(i, dim=-1)
            x = silu_mul(gate.float(), up.float()).to(dtype)  # eager's roundings: silu, then the product
            expected = x.double() @ w.double().T + (bias.double() if with_bias else 0)
            expected = expected + (residual.double() if with_residual else 0)
            res = residual.to(device).clone() if with_residual else None
            got = triton_gemv.gated_gemv(gate_up.to(device), w.to(device), bias.to(device) if with_bias else None,
                                         residual=res)
            assert got.shape == (1, n) and got.dtype == dtype
            if with_residual:
                assert got.data_ptr() == res.data_ptr(), "the residual is updated in place"
            tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3}[dtype]
            err = (got.double().cpu() - expected).abs().max().item() / (expected.abs().max().item() + 1)
            assert err < tol, f"I={i} N={n} {dtype} bias={with_bias} residual={with_residual}: error {err:.2e}"


def test_gated_gemv_matches_eager_in_triton_interpreter():
    run_in_triton_interpreter("test_triton_gated_gemv", "check_gated", "(torch.float32, torch.bfloat16)")


@on_triton_gpu
def test_gated_gemv_matches_eager_on_gpu():
    check_gated("cuda")


@on_triton_gpu
def test_the_table_fuses_one_token_and_leaves_the_rest():
    """with_silu_in_down_gemv: one token's down projection on the gated GEMV; more tokens as the table was."""
    for table in (TRITON_GEMV, TRITON_SKINNY):
        fused = table.with_silu_in_down_gemv()
        w = torch.randn(96, 200, device="cuda") / 200**0.5
        for rows in (1, 3):
            gate_up, residual = torch.randn(rows, 400, device="cuda"), torch.randn(rows, 96, device="cuda")
            expected = table.silu_down_(residual.clone(), gate_up, silu_mul, w, None)
            got = fused.silu_down_(residual.clone(), gate_up, silu_mul, w, None)
            if rows == 1:
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
            else:
                assert torch.equal(got, expected)


def test_the_triton_tables_run_the_down_projection_on_their_own_kernels():
    """A Triton table's down projection goes through its own add_linear_ (the GEMV or the skinny kernel where it
    takes the rows), not torch's GEMM: a table built on a recording add_linear_ sees every call."""
    calls = []

    def recording_add_linear_(residual, x, weight, bias=None):
        calls.append(tuple(x.shape))
        return residual.addmm_(x, weight.t())

    table_silu_down_ = linear_ops._table_silu_down_(recording_add_linear_)
    gate_up, residual, w = torch.randn(3, 8), torch.randn(3, 5), torch.randn(5, 4)
    got = table_silu_down_(residual.clone(), gate_up, silu_mul, w)
    assert calls == [(3, 4)]
    assert torch.equal(got, silu_down_(residual.clone(), gate_up, silu_mul, w))
    assert TRITON_GEMV.silu_down_ is not silu_down_ and TRITON_SKINNY.silu_down_ is not silu_down_


def test_the_fused_table_is_torch_off_the_gpu():
    """On CPU tensors the fused table is the plain silu_mul + product, bit for bit."""
    gen = torch.Generator().manual_seed(1)
    w, b = torch.randn(7, 11, generator=gen), torch.randn(7, generator=gen)
    for table in (CUBLAS, TRITON_GEMV, TRITON_SKINNY):
        fused = table.with_silu_in_down_gemv()
        for rows in (1, 4):
            gate_up, residual = torch.randn(rows, 22, generator=gen), torch.randn(rows, 7, generator=gen)
            expected = residual + torch.nn.functional.linear(silu_mul(*gate_up.split(11, dim=-1)), w, b)
            assert torch.equal(fused.silu_down_(residual.clone(), gate_up, silu_mul, w, b),
                               silu_down_(residual.clone(), gate_up, silu_mul, w, b))
            torch.testing.assert_close(silu_down_(residual.clone(), gate_up, silu_mul, w, b), expected)


def test_gated_gemv_rejects_a_gate_up_of_the_wrong_width():
    if not triton_gemv.AVAILABLE:
        pytest.skip("triton is not installed")
    with pytest.raises(ValueError, match=r"gated_gemv takes gate_up \[1, 2 \* 8\]"):
        triton_gemv.gated_gemv(torch.zeros(1, 15), torch.zeros(4, 8))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gated_launch_fits_a_hopper_block(dtype):
    if not triton_gemv.AVAILABLE:
        pytest.skip("triton is not installed")
    pointers = {name: f"*{dtype}" for name in ("x_ptr", "norm_w_ptr", "w_ptr", "bias_ptr", "res_ptr", "y_ptr")}
    shared = hopper_shared_bytes(
        triton_gemv._gemv_kernel, {**pointers, **PRODUCT_SIZES},
        {"HAS_BIAS": True, "HAS_RESIDUAL": True, "NORM": False, "SCALE": False,
         "BLOCK_N": triton_gemv.GATED_BLOCK_N, "BLOCK_K": triton_gemv.MAX_BLOCK_K, "GATED": True},
        triton_gemv.NUM_WARPS)
    assert shared <= HOPPER_SHARED_BYTES


def test_silu_in_down_gemv_is_validated():
    with pytest.raises(EngineConfigError, match="engine.silu_in_down_gemv=true .* needs engine.linear_kernel="):
        EngineConfig(silu_in_down_gemv=True).validate()
    with pytest.raises(EngineConfigError, match="engine.silu_in_down_gemv='yes': must be true or false"):
        EngineConfig(silu_in_down_gemv="yes").validate()
