"""A batch-1 GEMV in Triton: y[1, N] = x[1, K] @ W[N, K]^T (+ bias) (+ residual), fp32 accumulation, optionally
with the RMSNorm before it (a pre-norm projection) fused in.

At batch 1 every projection of a decode step streams its whole weight once for one row of activations, so the
step is bound by how close each GEMV gets to HBM bandwidth. On an H200 (benchmarks/gemv_bandwidth.py, bf16,
the GEMVs of a Llama-3.2-1B-shaped target in one CUDA graph) cuBLAS reaches 64-70% of the copy bandwidth,
this kernel 84%: each program streams BLOCK_N whole weight rows in BLOCK_K chunks and reduces once at the end.

Each output element is one dot product over K in a fixed order (per-lane partial sums over the chunks, then a
tree over the lanes), whatever N is: the result does not depend on which other rows are computed.

The RMSNorm before a pre-norm projection (`norm_weight`, `eps`) is fused in: each program sums the squares
of x as it streams it and scales its dot products by 1/rms(x) at the end, (W (x * g)) / rms(x), which is
W (rms_norm(x) * g) up to rounding. In half precision that skips eager's two roundings of the normalised input
(fp32 throughout: one rounding fewer), so fused and eager agree to rounding, not bit for bit.

Importable without Triton (`AVAILABLE` is then False); the kernel itself needs a CUDA device, or Triton's
interpreter (`TRITON_INTERPRET=1`) for CPU tensors.
"""

from __future__ import annotations

import torch

from specexp.models.triton_support import AVAILABLE, tl, triton

# Tuned on the H200 over (BLOCK_N, BLOCK_K, warps) in {4, 8, 16, 32} x {256, 512, 1024} x {4, 8} and (2, 1024, 4)
# for every weight shape of both 1B-class targets: (2, 1024, 4) won on all of them.
BLOCK_N = 2
MAX_BLOCK_K = 1024
NUM_WARPS = 4
# Rows per program with the RMSNorm fused: each program re-reads x and the norm weight, which more rows amortise.
# Measured on the H200 in a Llama-3.2-1B-shaped step over 1, 2, 4, 8, 16 (the q/k/v and gate/up products): 8 won.
NORM_BLOCK_N = 8

if AVAILABLE:

    @triton.jit
    def _gemv_kernel(x_ptr, norm_w_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, N, K, stride_w, eps,
                     HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < N
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        if NORM:
            squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            k_ok = k < K
            x = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            if NORM:  # the 1/rms scale is applied to the dot products at the end
                squares += x * x
                x = x * tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None] * stride_w + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, axis=1)
        if NORM:
            y = y / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def supports(x: torch.Tensor, weight: torch.Tensor, *same_dtype: torch.Tensor) -> bool:
    """Whether :func:`gemv` takes this product: one row of x, Triton present, weight rows contiguous, and one
    dtype for x, weight and `same_dtype` (e.g. a norm weight)."""
    return (AVAILABLE and x.dim() == 2 and x.shape[0] == 1 and weight.stride(1) == 1
            and all(t.dtype == x.dtype for t in (weight, *same_dtype)))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, config: tuple[int, int, int] | None = None, *,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """x [1, K], weight [N, K] (rows contiguous), bias [N] or None -> a @ weight^T + bias, [1, N] in x's dtype,
    where a = x, or rms_norm(x) * norm_weight with `norm_weight` [K] (and `eps`).

    With `residual` ([1, N], contiguous) the sum is added to it in place and residual is returned: one rounding
    of (residual + product + bias), as `residual.addmm_` rounds. config: (BLOCK_N, BLOCK_K, num_warps), for
    tuning (None = BLOCK_N rows per program, NORM_BLOCK_N with a norm; min(MAX_BLOCK_K, K rounded up to a power
    of 2); NUM_WARPS).
    """
    n, k = weight.shape
    rows_per_program = BLOCK_N if norm_weight is None else NORM_BLOCK_N
    block_n, block_k, warps = config or (rows_per_program, min(MAX_BLOCK_K, triton.next_power_of_2(k)), NUM_WARPS)
    x = x.contiguous()
    out = residual if residual is not None else torch.empty(1, n, device=x.device, dtype=x.dtype)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, norm_weight if norm_weight is not None else x, weight, bias if bias is not None else x, out, out,
        n, k, weight.stride(0), eps,
        HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, NORM=norm_weight is not None,
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )
    return out
