"""The Triton gated short conv for uniform batches (`engine.conv_kernel=triton`) against the default path
(`c * causal_conv1d_spec_update_uniform(b * x)`): outputs and conv states, on a GPU (`pytest -m cuda`) and, where
triton is installed, under Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import on_triton_gpu, run_in_triton_interpreter

from specexp.models import triton_short_conv
from specexp.models.metadata import NULL_BLOCK_ID
from specexp.models.short_conv_ops import causal_conv1d_spec_update_uniform

# (rows, real rows (the rest: NULL-slot padding), q tokens per row, channels, width, bias, extra tokens past R*q)
CASES = [(1, 1, 1, 64, 3, False, 0), (3, 2, 5, 200, 4, True, 0), (4, 4, 3, 130, 3, True, 2), (2, 1, 9, 96, 4, False, 0)]


def check_against_default(device: str, dtype: torch.dtype, tol: float) -> None:
    """Every CASES layer: the kernel's outputs and updated states equal the default uniform path's."""
    gen = torch.Generator().manual_seed(0)
    for case, (rows, real, q, dim, width, with_bias, extra) in enumerate(CASES):
        k = 8  # drafts the state is sized for: S = W - 1 + k >= W - 2 + q
        state_len = width - 1 + k
        num_tokens = rows * q + extra
        bcx = torch.randn(num_tokens, 3 * dim, generator=gen)
        weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
        conv_state = torch.randn(7, dim, state_len, generator=gen)
        slots = torch.tensor([6 - r for r in range(real)] + [NULL_BLOCK_ID] * (rows - real), dtype=torch.int32)
        accepted = torch.randint(1, q + 1, (rows,), generator=gen, dtype=torch.int32)
        bcx, weight, bias, conv_state = (t.to(device=device, dtype=dtype) for t in (bcx, weight, bias, conv_state))
        slots, accepted = slots.to(device), accepted.to(device)
        b, c, x = bcx.chunk(3, dim=-1)
        expected_state = conv_state.clone()
        expected = c * causal_conv1d_spec_update_uniform(b * x, weight, bias if with_bias else None, expected_state,
                                                         slots, accepted, q, rows)
        got_state = conv_state.clone()
        assert triton_short_conv.supports(bcx, got_state)
        got = triton_short_conv.gated_short_conv_uniform(bcx, weight, bias if with_bias else None, got_state, slots,
                                                         accepted, q, rows)
        label = f"case {case} (rows {rows}, real {real}, q {q}, D {dim}, W {width}) {dtype}"
        assert got.shape == expected.shape and got.dtype == dtype, label
        # relative to the outputs' scale: in half precision the default path rounds after every tap, the kernel
        # once, so they differ by a few units in the last place of outputs of magnitude ~10
        err = (got.double() - expected.double()).abs().max().item() / (1 + expected.double().abs().max().item())
        assert err < tol, f"{label}: output error {err:.2e} (relative)"
        assert torch.equal(got[real * q:], torch.zeros_like(got[real * q:])), f"{label}: padding must give zeros"
        state_err = (got_state.double() - expected_state.double()).abs().max().item()
        assert state_err < tol, f"{label}: state error {state_err:.2e}"
        untouched = [s for s in range(7) if s not in slots.tolist()]
        assert torch.equal(got_state[untouched], conv_state[untouched]), f"{label}: other slots must not change"


@on_triton_gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)])
def test_triton_short_conv_matches_default_on_gpu(dtype, tol):
    check_against_default("cuda", dtype, tol)


def test_triton_short_conv_matches_default_in_triton_interpreter():
    """The kernel's arithmetic on CPU tensors, in Triton's interpreter (skipped without triton)."""
    run_in_triton_interpreter('test_triton_short_conv', 'check_against_default', "torch.float32", "1e-6")