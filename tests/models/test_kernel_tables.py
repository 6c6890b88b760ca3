"""Every model family with the engine's fast kernel tables (`engine.linear_kernel=triton_gemv` or `triton_skinny`,
`attention_kernel=triton`, `conv_kernel=triton`) against the default tables: through prefills, chunked
continuations, uniform multi-row decodes and single-token (GEMV) decodes. On the CPU the fast tables fall back
to the eager ops; on a GPU (`pytest -m cuda`) they run their Triton kernels, with the fused pre-norms, per-head
q/k norms and RoPE, and must match the CPU's logits."""

from __future__ import annotations

import torch
from harness import PagedRunner
from triton_interpreter import on_triton_gpu

from specexp.models import load_model
from specexp.models.attention import TRITON, use_attention_kernel
from specexp.models.linear_ops import TRITON_GEMV, TRITON_SKINNY, use_linear_ops
from specexp.models.short_conv_ops import TRITON_CONV, use_conv_kernel

STEPS = [  # (request, new tokens) per step
    [("a", list(range(10, 19))), ("b", list(range(40, 45)))],  # prefills
    [("a", [7]), ("b", list(range(50, 56))), ("c", list(range(60, 72)))],  # decode + chunk + prefill
    [("a", [8]), ("b", [9]), ("c", [11])],  # uniform decode: the attention and conv kernels
    [("b", [21]), ("c", [22])],
    [("a", [31])],  # one token: the GEMV with its fused pre-norm
    [("c", [32])],
    [("a", [33, 34, 35]), ("c", [36, 37, 38])],  # uniform verify-shaped rows of 3
]


def fast_tables(model, linear=TRITON_GEMV):
    use_linear_ops(model, linear)
    use_attention_kernel(model, TRITON)
    use_conv_kernel(model, TRITON_CONV)
    return model


def check_against_default(case, device: str, tol: float, linear=TRITON_GEMV) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    reference = PagedRunner(load_model(case.path))
    fast = PagedRunner(fast_tables(load_model(case.path, device=device), linear), device=device)
    for step, batch in enumerate(STEPS):
        expected, got = reference.step(batch), fast.step(batch)
        for rid in expected:
            err = (got[rid].cpu().double() - expected[rid].double()).abs().max().item()
            assert err <= tol, f"{case.path.name} step {step} request {rid}: error {err:.2e}"


def test_fast_tables_fall_back_to_the_eager_ops_on_cpu(case):
    check_against_default(case, "cpu", 1e-6)


@on_triton_gpu
def test_fast_tables_on_gpu_match_the_cpu(case):
    check_against_default(case, "cuda", 2e-4)


@on_triton_gpu
def test_skinny_linear_table_on_gpu_matches_the_cpu(case):
    """`linear_kernel=triton_skinny`: the 14-token prefill step, the uniform decodes and the verify-shaped rows run
    their projections on the skinny GEMM (the 19-token step stays on cuBLAS)."""
    check_against_default(case, "cuda", 2e-4, TRITON_SKINNY)
