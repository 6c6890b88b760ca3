"""Which kernels the models' projections (GEMMs) run on: a swappable table, as `pointwise.PointwiseOps` is.

Modules that project call `self.linear_ops.linear(x, weight, bias)` and `self.linear_ops.add_linear_(residual,
x, weight, bias)` (class attribute :data:`CUBLAS` by default; :func:`use_linear_ops` swaps a model's table).

- :data:`CUBLAS`: `F.linear` and `residual.addmm_` — torch's GEMMs (cuBLAS on a GPU), for every batch.
- :data:`TRITON_GEMV` (`engine.linear_kernel=triton_gemv`): single-token products (a batch-1 decode step, a
  batch-1 draft step) go to the Triton GEMV of :mod:`specexp.models.triton_gemv`, which streams weights
  closer to HBM bandwidth than cuBLAS picks for one row; every other product stays on torch's GEMMs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specexp.models import triton_gemv
from specexp.models.kernels import set_on_modules


def add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """residual += x @ weight^T (+ bias), in place, and returned: the GEMM accumulates into the residual stream
    (beta = 1), one kernel where `residual + linear(x)` takes a GEMM and an add. residual [T, out], x [T, in],
    weight [out, in].

    Rounding: the product is added to the residual before it is rounded to the residual's dtype (fp32: the
    same up to summation order; half precision: one rounding fewer than transformers' `h + proj(x)`).
    """
    if bias is not None:
        residual.add_(bias)
    return residual.addmm_(x, weight.t())


def gemv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, with single-token products on the Triton GEMV. x [T, in] -> [T, out]."""
    if x.is_cuda and triton_gemv.supports(x, weight):
        return triton_gemv.gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def gemv_add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`add_linear_`, with single-token products on the Triton GEMV (residual updated in place)."""
    if x.is_cuda and residual.is_contiguous() and triton_gemv.supports(x, weight):
        return triton_gemv.gemv(x, weight, bias, residual=residual)
    return add_linear_(residual, x, weight, bias)


@dataclass(frozen=True)
class LinearOps:
    """`linear(x [T, in], weight [out, in], bias [out] | None) -> [T, out]` and
    `add_linear_(residual [T, out], x, weight, bias) -> residual` (updated in place)."""

    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    add_linear_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


CUBLAS = LinearOps(F.linear, add_linear_)
TRITON_GEMV = LinearOps(gemv_linear, gemv_add_linear_)
LINEAR_KERNELS = {"cublas": CUBLAS, "triton_gemv": TRITON_GEMV}


def use_linear_ops(model: nn.Module, ops: LinearOps) -> None:
    """Make every module of `model` that projects (those with a `linear_ops` table) call `ops`."""
    set_on_modules(model, "linear_ops", ops)
