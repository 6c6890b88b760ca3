"""A batch-1 GEMV in Triton: y[1, N] = x[1, K] @ W[N, K]^T (+ bias) (+ residual), fp32 accumulation, optionally
with the RMSNorm before it (a pre-norm projection) fused in; and its skinny-GEMM sibling for a few rows of x
(M = 2..MAX_TOKENS: a batch-1 verify of k+1 tokens, a draft prefill region of k+2), which streams each weight
once for all M rows.

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

The skinny kernel keeps the GEMV's structure with a row axis added: each program streams BLOCK_N weight rows once
and multiplies every chunk by all M rows of x (masked to M), so its weight traffic is the GEMV's and its x traffic
M times the GEMV's (x is small and stays in L2). cuBLAS's GEMMs at M = 2..16 read the same weights; what the
kernel can win is the GEMV's better streaming of them. benchmarks/gemv_bandwidth.py measures both.

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
# Rows of x the skinny kernel takes (a verify of k + 1 <= 16 tokens, a draft prefill region of k + 2); more go to
# torch's GEMMs.
MAX_TOKENS = 16
SKINNY_ACCUMULATOR = 8192  # fp32 values per program: 64 registers a thread at 4 warps


def skinny_config(num_tokens: int, k: int, norm: bool) -> tuple[int, int, int]:
    """The skinny kernel's default (BLOCK_N, BLOCK_K, num_warps) for `num_tokens` rows of x and reduction length
    `k`: chunks narrow as rows grow, and weight rows per program (NORM_BLOCK_N with a fused norm, else BLOCK_N)
    shrink until the [rows of x, weight rows, chunk] accumulator fits SKINNY_ACCUMULATOR."""
    block_m = triton.next_power_of_2(num_tokens)
    block_k = min(1024 if num_tokens <= 2 else 512 if num_tokens <= 4 else 256, triton.next_power_of_2(k))
    block_n = NORM_BLOCK_N if norm else BLOCK_N
    while block_n > 1 and block_m * block_n * block_k > SKINNY_ACCUMULATOR:
        block_n //= 2
    return block_n, block_k, NUM_WARPS


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


    @triton.jit
    def _skinny_kernel(x_ptr, norm_w_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                       eps, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        tokens = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < N
        token_ok = tokens < M
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        if NORM:
            squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + cols
            k_ok = k < K
            x = tl.load(x_ptr + tokens[:, None] * stride_x + k[None, :], mask=token_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            if NORM:  # each token's 1/rms scale is applied to its dot products at the end
                squares += x * x
                x = x * tl.load(norm_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_ptr + rows[:, None] * stride_w + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
        y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
        if NORM:
            y = y / tl.sqrt(tl.sum(squares, axis=1) / K + eps)[:, None]
        out_offsets = tokens[:, None] * stride_y + rows[None, :]
        out_ok = token_ok[:, None] & row_ok[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + out_offsets, mask=out_ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + out_offsets, y.to(y_ptr.dtype.element_ty), mask=out_ok)


def supports(x: torch.Tensor, weight: torch.Tensor, *same_dtype: torch.Tensor, max_tokens: int = 1) -> bool:
    """Whether :func:`gemv` takes this product: 1..max_tokens (<= MAX_TOKENS) rows of x, Triton present, weight
    rows contiguous, and one dtype for x, weight and `same_dtype` (e.g. a norm weight)."""
    return (AVAILABLE and x.dim() == 2 and 1 <= x.shape[0] <= min(max_tokens, MAX_TOKENS)
            and weight.stride(1) == 1 and all(t.dtype == x.dtype for t in (weight, *same_dtype)))


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, config: tuple[int, int, int] | None = None, *,
         norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """x [M, K] (1 <= M <= MAX_TOKENS), weight [N, K] (rows contiguous), bias [N] or None -> a @ weight^T + bias,
    [M, N] in x's dtype, where a = x, or rms_norm(x) * norm_weight row by row with `norm_weight` [K] (and `eps`).

    M = 1 runs the GEMV kernel, M >= 2 the skinny kernel (module docstring). With `residual` ([M, N], contiguous)
    the sum is added to it in place and residual is returned: one rounding of (residual + product + bias), as
    `residual.addmm_` rounds. config: (BLOCK_N, BLOCK_K, num_warps), for tuning (None: for M = 1, BLOCK_N rows per
    program, NORM_BLOCK_N with a norm, min(MAX_BLOCK_K, K rounded up to a power of 2) and NUM_WARPS; for M >= 2,
    :func:`skinny_config`).
    """
    n, k = weight.shape
    m = x.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"triton_gemv.gemv takes 1..{MAX_TOKENS} rows of x, got x of shape {tuple(x.shape)}")
    if config is None and m == 1:
        config = (BLOCK_N if norm_weight is None else NORM_BLOCK_N, min(MAX_BLOCK_K, triton.next_power_of_2(k)),
                  NUM_WARPS)
    block_n, block_k, warps = config or skinny_config(m, k, norm_weight is not None)
    x = x.contiguous()
    out = residual if residual is not None else torch.empty(m, n, device=x.device, dtype=x.dtype)
    flags = dict(HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, NORM=norm_weight is not None,
                 BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    operands = (x, norm_weight if norm_weight is not None else x, weight, bias if bias is not None else x, out, out)
    if m == 1:
        _gemv_kernel[(triton.cdiv(n, block_n),)](*operands, n, k, weight.stride(0), eps, **flags)
    else:
        _skinny_kernel[(triton.cdiv(n, block_n),)](*operands, m, n, k, x.stride(0), weight.stride(0),
                                                   out.stride(0), eps, BLOCK_M=triton.next_power_of_2(m), **flags)
    return out
