"""The Triton gated short conv (`engine.conv_kernel=triton`) against the default paths: for uniform batches
`c * causal_conv1d_spec_update_uniform(b * x)`, for non-spec rows `c * causal_conv1d_varlen(b * x)`; outputs and
conv states, on a GPU (`pytest -m cuda`) and, where triton is installed, under Triton's CPU interpreter."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import on_triton_gpu, run_in_triton_interpreter

from specexp.models import triton_short_conv
from specexp.models.metadata import NULL_BLOCK_ID
from specexp.models.short_conv_ops import causal_conv1d_spec_update_uniform, causal_conv1d_varlen

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
        padding = torch.arange(num_tokens, device=device) >= real * q
        untouched = [s for s in range(7) if s not in slots.tolist()]
        assert_kernel_matches(label, got, expected, padding, got_state, expected_state, conv_state, untouched, tol)


def assert_kernel_matches(label: str, got, expected, padding, got_state, expected_state, initial_state,
                          untouched: list[int], tol: float) -> None:
    """The kernel's outputs `got` within tol of the default path's, zeros exactly at the `padding` tokens (bool[T]),
    its states within tol of the default path's and the `untouched` slots exactly as `initial_state` held them."""
    assert got.shape == expected.shape and got.dtype == expected.dtype, label
    # relative to the outputs' scale: in half precision the default path rounds after every tap, the kernel
    # once, so they differ by a few units in the last place of outputs of magnitude ~10
    err = (got.double() - expected.double()).abs().max().item() / (1 + expected.double().abs().max().item())
    assert err < tol, f"{label}: output error {err:.2e} (relative)"
    assert torch.equal(got[padding], torch.zeros_like(got[padding])), f"{label}: padding must give zeros"
    state_err = (got_state.double() - expected_state.double()).abs().max().item()
    assert state_err < tol, f"{label}: state error {state_err:.2e}"
    assert torch.equal(got_state[untouched], initial_state[untouched]), f"{label}: other slots must not change"



# Non-spec rows: (query lens (0 = an empty padding row), has initial state per row or None, NULL-slot rows,
# lookahead, channels, width, bias, padding tokens past the rows, gathered through a token permutation)
VARLEN_CASES = [
    ([64], [True], [], 0, 128, 4, False, 0, False),            # a prompt chunk after the first
    ([65], [False], [], 1, 200, 3, True, 15, False),           # a draft's first prompt region, padded to 80
    ([1, 7, 2, 33], None, [], 0, 96, 4, True, 3, True),        # decodes and chunks, gathered in another order
    ([17, 0, 5, 1], [True, False, False, True], [1, 3], 1, 130, 4, False, 6, True),  # empty and NULL rows
    ([2, 1], [False, True], [], 2, 64, 3, True, 0, False),     # chunks shorter than window + lookahead
    ([40, 9, 16], [True, True, False], [], 0, 64, 2, False, 4, True),  # width 2: a one-column window
]


def check_varlen_against_default(device: str, dtype: torch.dtype, tol: float) -> None:
    """Every VARLEN_CASES batch: the varlen kernel's outputs and updated states equal the default varlen path's."""
    gen = torch.Generator().manual_seed(1)
    for case, (lens, initial, null_rows, lookahead, dim, width, with_bias, pad, gather) in enumerate(VARLEN_CASES):
        rows, real_tokens = len(lens), sum(lens)
        num_tokens = real_tokens + pad
        state_len = width - 1 + max(lookahead, 3)
        bcx = torch.randn(num_tokens, 3 * dim, generator=gen)
        weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
        conv_state = torch.randn(rows + 3, dim, state_len, generator=gen)
        slots = torch.tensor([NULL_BLOCK_ID if r in null_rows else rows + 2 - r for r in range(rows)],
                             dtype=torch.int32)
        qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
        has_initial = None if initial is None else torch.tensor(initial)
        # gathered order: the rows' tokens scattered over the batch, the padding tokens gathered last
        token_indx = torch.randperm(num_tokens, generator=gen) if gather else None
        bcx, weight, bias, conv_state = (t.to(device=device, dtype=dtype) for t in (bcx, weight, bias, conv_state))
        slots, qsl = slots.to(device), qsl.to(device)
        has_initial = None if has_initial is None else has_initial.to(device)
        token_indx = None if token_indx is None else token_indx.to(device)
        b, c, x = bcx.chunk(3, dim=-1)
        expected_state = conv_state.clone()
        rows_of = token_indx if gather else torch.arange(num_tokens, device=device)
        conv = causal_conv1d_varlen((b * x)[rows_of], weight, bias if with_bias else None, expected_state, qsl, slots,
                                    has_initial, lookahead)
        expected = torch.zeros_like(c)
        expected[rows_of[:real_tokens]] = (c[rows_of] * conv)[:real_tokens]
        got_state = conv_state.clone()
        got = triton_short_conv.gated_short_conv_varlen(bcx, weight, bias if with_bias else None, got_state, qsl,
                                                        slots, has_initial, lookahead, token_indx)
        label = f"case {case} (lens {lens}, lookahead {lookahead}, D {dim}, W {width}, gather {gather}) {dtype}"
        outside = torch.ones(num_tokens, dtype=torch.bool, device=device)
        outside[rows_of[:real_tokens]] = False
        untouched = [s for s in range(rows + 3) if s not in slots.tolist() or s == NULL_BLOCK_ID]
        assert_kernel_matches(label, got, expected, outside, got_state, expected_state, conv_state, untouched, tol)


CHECKS = ["check_against_default", "check_varlen_against_default"]  # the uniform and the varlen kernel


@on_triton_gpu
@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)])
def test_triton_short_conv_matches_default_on_gpu(check, dtype, tol):
    globals()[check]("cuda", dtype, tol)


@pytest.mark.parametrize("check", CHECKS)
def test_triton_short_conv_matches_default_in_triton_interpreter(check):
    """The kernels' arithmetic on CPU tensors, in Triton's interpreter (skipped without triton)."""
    run_in_triton_interpreter('test_triton_short_conv', check, "torch.float32", "1e-6")
