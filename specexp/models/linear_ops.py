"""Which kernels the models' projections (GEMMs) run on: a swappable table, as `pointwise.PointwiseOps` is.

Modules that project call their `self.linear_ops` table (class attribute :data:`CUBLAS` by default;
:func:`use_linear_ops` swaps a model's table): `linear(x, weight, bias)`, `add_linear_(residual, x, weight,
bias)` and `norm_linear(x, norm, weight, bias)` (a pre-norm projection: linear(norm(x)), which a table may fuse).

- :data:`CUBLAS`: `F.linear` and `residual.addmm_` — torch's GEMMs (cuBLAS on a GPU), for every batch, after
  the module's own RMSNorm in `norm_linear`.
- :data:`TRITON_GEMV` (`engine.linear_kernel=triton_gemv`): single-token products (a batch-1 decode step, a
  batch-1 draft step) go to the Triton GEMV of :mod:`specexp.models.triton_gemv`, which streams weights
  closer to HBM bandwidth than cuBLAS picks for one row and computes a pre-norm projection's RMSNorm in the same
  kernel (the LM head's too: the model's final norm, `norm_float_logits`); every other product stays on torch's
  kernels.
- :data:`TRITON_SKINNY` (`engine.linear_kernel=triton_skinny`): the same for products of up to
  `triton_gemv.MAX_TOKENS` rows (a batch-1 verify of k + 1 tokens, a draft prefill region of k + 2), the rows
  past the first on the GEMV's skinny-GEMM sibling, which streams each weight once for all rows.
- A gated MLP's down projection runs on the table's own `add_linear_` (the SiLU product first, on the pointwise
  ops); :meth:`LinearOps.with_silu_in_down_gemv` (`engine.silu_in_down_gemv`) computes one token's product
  inside the down projection's GEMV instead, one kernel fewer per layer of a batch-1 step. (The same in the
  skinny kernel for 2-16 rows was tried: on an H100, 2026-12-06, it made a Llama-1B-shaped verify of 2 tokens
  take 54.6 ms against 1.19 ms, and was removed.) :meth:`LinearOps.with_silu_in_gate_up`
  (`engine.silu_in_gate_up`) computes the product of 2-16 rows in the gate/up projection's skinny kernel instead
  (:func:`triton_gemv.gate_up_silu`): its epilogue holds each row's gate and up, and the down projection reads
  [T, I].
- A table's one-row GEMVs and its skinny products launch early (`pdl`, `skinny_pdl`) or in stream order each on
  their own: an early-launched kernel holds its blocks' registers and shared memory while it waits, which the
  long skinny products of a 1B target's verify pay for (`engine.skinny_early_launch`); `engine.gemv_early_launch`
  picks the same for the one-row GEMVs.
- :func:`linear_kernel_ops` with `programmatic_launch` (`engine.programmatic_launch`): a Triton table whose kernels
  are launched with programmatic dependent launch on sm_90+ GPUs (each GEMV fetches its first weight chunk while
  the kernel before it finishes; see :func:`triton_gemv.gemv`).

A pre-norm whose weight is folded into the projections (`RMSNorm.folded`, :mod:`specexp.models.norm_folding`)
reaches the Triton kernels as `rms_only`: they scale each row's products by 1/rms(x) and skip the multiply by the
norm weight, which is what made the skinny kernel lose to cuBLAS before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

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


def silu_down_(residual: torch.Tensor, gate_up: torch.Tensor, silu_mul: Callable, weight: torch.Tensor,
               bias: torch.Tensor | None = None, add_linear: Callable = add_linear_) -> torch.Tensor:
    """residual += silu_mul(gate, up) @ weight^T (+ bias), in place, and returned: a SiLU-gated MLP's down
    projection. gate_up [T, 2I] (gate, then up), weight [out, I], residual [T, out]; silu_mul(gate, up) the
    pointwise op (`pointwise.PointwiseOps.silu_mul`); the product on `add_linear` (a table's `add_linear_`)."""
    gate, up = gate_up.split(weight.shape[1], dim=-1)
    return add_linear(residual, silu_mul(gate, up), weight, bias)


class Norm(Protocol):
    """An RMSNorm module: `norm(x)` normalises the last dim of x and scales it by `weight` [d]; `eps`."""

    weight: torch.Tensor
    eps: float
    folded: bool  # weight folded into the projections that read the norm (now all ones)

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def norm_linear(x: torch.Tensor, norm: Norm | None, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(norm(x), weight, bias): a pre-norm projection (norm None: F.linear(x, ...)). x [T, in] ->
    [T, out]."""
    return F.linear(x if norm is None else norm(x), weight, bias)


def _launch_early(x: torch.Tensor, pdl: bool, skinny_pdl: bool) -> bool:
    """Whether a product of x's rows is launched early: one row (the GEMV) as `pdl`, more (the skinny kernel) as
    `skinny_pdl`."""
    return pdl if x.shape[0] == 1 else skinny_pdl


def _gemv_linear(max_tokens: int, pdl: bool, skinny_pdl: bool):
    def gemv_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """F.linear, with products of 1..max_tokens rows on the Triton GEMV. x [T, in] -> [T, out]."""
        if x.is_cuda and triton_gemv.supports(x, weight, max_tokens=max_tokens):
            return triton_gemv.gemv(x, weight, bias, pdl=_launch_early(x, pdl, skinny_pdl))
        return F.linear(x, weight, bias)

    return gemv_linear


def float_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias).float(): an LM head's logits, x [T, hidden] -> fp32[T, vocab]."""
    return F.linear(x, weight, bias).float()


def _fused_norm(norm: Norm) -> dict:
    """`triton_gemv.gemv`'s arguments that compute the RMSNorm `norm` in the kernel: 1/rms(x) alone where its weight
    is folded into the projection's (all ones here), else scaled by its weight too."""
    if norm.folded:
        return {"eps": norm.eps, "rms_only": True}
    return {"eps": norm.eps, "norm_weight": norm.weight}


def norm_float_logits(x: torch.Tensor, norm: Norm, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      float_logits: Callable = float_logits) -> torch.Tensor:
    """An LM head's logits of norm(x) (the model's final norm): x [T, hidden] -> fp32[T, vocab], the head on
    `float_logits` (a table's own)."""
    return float_logits(norm(x), weight, bias)


def _gemv_norm_float_logits(pdl: bool, float_logits: Callable):
    def gemv_norm_float_logits(x: torch.Tensor, norm: Norm, weight: torch.Tensor,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`norm_float_logits`, with one row's norm computed inside the head's GEMV (fp32 stored); more rows
        are normalised apart, then projected on `float_logits` (a norm fused into the skinny kernel's huge LM-head
        product would scale x off its pipeline, see :mod:`triton_gemv`)."""
        if x.is_cuda and x.shape[0] == 1 and triton_gemv.supports(x, weight, norm.weight):
            return triton_gemv.gemv(x, weight, bias, out_dtype=torch.float32, pdl=pdl,
                                    config=triton_gemv.head_config(x.shape[1]), **_fused_norm(norm))
        return norm_float_logits(x, norm, weight, bias, float_logits)

    return gemv_norm_float_logits


def _gemv_float_logits(max_tokens: int, pdl: bool, skinny_pdl: bool):
    def gemv_float_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`float_logits`, with products of 1..max_tokens rows on the Triton GEMV storing fp32 (the same
        values: rounded to x's dtype first), one cast kernel fewer."""
        if x.is_cuda and triton_gemv.supports(x, weight, max_tokens=max_tokens):
            return triton_gemv.gemv(x, weight, bias, out_dtype=torch.float32,
                                    pdl=_launch_early(x, pdl, skinny_pdl))
        return float_logits(x, weight, bias)

    return gemv_float_logits


def _gemv_add_linear_(max_tokens: int, pdl: bool, skinny_pdl: bool):
    def gemv_add_linear_(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`add_linear_`, with products of 1..max_tokens rows on the Triton GEMV (residual updated in
        place)."""
        if x.is_cuda and residual.is_contiguous() and triton_gemv.supports(x, weight, max_tokens=max_tokens):
            return triton_gemv.gemv(x, weight, bias, residual=residual, pdl=_launch_early(x, pdl, skinny_pdl))
        return add_linear_(residual, x, weight, bias)

    return gemv_add_linear_


def _gemv_norm_linear(max_tokens: int, pdl: bool, skinny_pdl: bool):
    linear = _gemv_linear(max_tokens, pdl, skinny_pdl)

    def gemv_norm_linear(x: torch.Tensor, norm: Norm | None, weight: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`norm_linear`, with products of 1..max_tokens rows on the Triton GEMV, the RMSNorm computed
        inside it."""
        if norm is None:
            return linear(x, weight, bias)
        if x.is_cuda and triton_gemv.supports(x, weight, norm.weight, max_tokens=max_tokens):
            return triton_gemv.gemv(x, weight, bias, pdl=_launch_early(x, pdl, skinny_pdl), **_fused_norm(norm))
        return norm_linear(x, norm, weight, bias)

    return gemv_norm_linear


def no_gate_up_silu(x: torch.Tensor, norm: Norm | None, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> None:
    """A table without a fused gate/up SiLU kernel: None for every product."""


def _skinny_gate_up_silu(max_tokens: int, pdl: bool) -> Callable:
    def skinny_gate_up_silu(x: torch.Tensor, norm: Norm | None, weight: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor | None:
        """silu(gate) * up of norm(x)'s gate/up projection (weight [2I, in], gate rows first), [T, I], in one
        skinny kernel for 2..max_tokens rows of x on the GPU without a bias, the norm absent or folded into weight;
        None for any other product (the caller then runs the projection and the SiLU product apart)."""
        if (x.is_cuda and bias is None and 2 <= x.shape[0]
                and (norm is None or norm.folded) and weight.shape[0] % 2 == 0
                and triton_gemv.supports(x, weight, max_tokens=max_tokens)):
            if norm is None:
                return triton_gemv.gate_up_silu(x, weight, pdl=pdl)
            return triton_gemv.gate_up_silu(x, weight, rms_only=True, eps=norm.eps, pdl=pdl)
        return None

    return skinny_gate_up_silu


def _table_silu_down_(add_linear: Callable) -> Callable:
    """:func:`silu_down_` with the down projection on `add_linear` (a table's own `add_linear_`)."""
    return functools.partial(silu_down_, add_linear=add_linear)


def _gated_gemv_silu_down_(fallback: Callable, pdl: bool) -> Callable:
    def gated_gemv_silu_down_(residual: torch.Tensor, gate_up: torch.Tensor, silu_mul: Callable,
                              weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`silu_down_`, with one token's SiLU product computed inside the down projection's GEMV
        (:func:`triton_gemv.gated_gemv`); other products as `fallback`."""
        if (gate_up.is_cuda and residual.is_contiguous() and gate_up.shape[-1] == 2 * weight.shape[1]
                and triton_gemv.supports(gate_up, weight)):
            return triton_gemv.gated_gemv(gate_up, weight, bias, residual=residual, pdl=pdl)
        return fallback(residual, gate_up, silu_mul, weight, bias)

    return gated_gemv_silu_down_


@dataclass(frozen=True)
class LinearOps:
    """`linear(x [T, in], weight [out, in], bias [out] | None) -> [T, out]`;
    `add_linear_(residual [T, out], x, weight, bias) -> residual` (updated in place);
    `norm_linear(x [T, in], norm, weight, bias) -> [T, out]` (linear of norm(x); `norm` an RMSNorm module or
    None); `silu_down_(residual [T, out], gate_up [T, 2I], silu_mul, weight [out, I], bias) -> residual` (a gated
    MLP's down projection, updated in place); `float_logits(x [T, hidden], weight [vocab, hidden], bias) ->
    fp32[T, vocab]` (an LM head's); `norm_float_logits(x, norm, weight, bias) -> fp32[T, vocab]` (an LM head's
    of norm(x), the model's final norm, which a table may fuse). `pdl`: its Triton kernels are launched with
    programmatic dependent launch (`triton_gemv.gemv`'s `pdl`). `gate_up_silu(x [T, in], norm, weight [2I, in],
    bias) -> [T, I] | None`: a gated MLP's gate/up projection of norm(x) and its SiLU product in one kernel, where
    the table has one for this product (None: the caller projects, then multiplies apart)."""

    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    add_linear_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    norm_linear: Callable[[torch.Tensor, Norm | None, torch.Tensor, torch.Tensor | None], torch.Tensor]
    silu_down_: Callable[..., torch.Tensor] = silu_down_
    float_logits: Callable[..., torch.Tensor] = float_logits
    pdl: bool = False
    gate_up_silu: Callable[..., torch.Tensor | None] = no_gate_up_silu
    skinny_pdl: bool = False  # products of 2..max_tokens rows (the skinny kernel) launched early
    max_tokens: int = 0  # rows of x its Triton kernels take (0: none)
    norm_float_logits: Callable[..., torch.Tensor] = norm_float_logits

    def with_silu_in_down_gemv(self) -> LinearOps:
        """This table, with one token's SiLU product computed in the down projection's GEMV
        (`engine.silu_in_down_gemv`); every other down projection as this table runs it."""
        return replace(self, silu_down_=_gated_gemv_silu_down_(self.silu_down_, self.pdl))

    def with_silu_in_gate_up(self) -> LinearOps:
        """This table, with the SiLU product of a gated MLP's gate/up projection of 2..max_tokens rows computed in
        the projection's skinny kernel (`engine.silu_in_gate_up`). Raises ValueError for a table without the
        skinny kernel."""
        if self.max_tokens < 2:
            raise ValueError("the SiLU product in the gate/up projection needs the skinny kernel's table "
                             "(engine.linear_kernel=triton_skinny)")
        return replace(self, gate_up_silu=_skinny_gate_up_silu(self.max_tokens, self.skinny_pdl))


CUBLAS = LinearOps(F.linear, add_linear_, norm_linear)


def triton_gemv_ops(max_tokens: int, pdl: bool = False, skinny_pdl: bool | None = None) -> LinearOps:
    """The table that sends products of 1..max_tokens rows of x to :func:`triton_gemv.gemv` (CUDA tensors),
    every other product to torch's GEMMs; with `pdl`, its kernels launched with programmatic dependent launch,
    those of 2..max_tokens rows (the skinny kernel) as `skinny_pdl` (None: as `pdl`)."""
    skinny_pdl = pdl if skinny_pdl is None else skinny_pdl
    add_linear = _gemv_add_linear_(max_tokens, pdl, skinny_pdl)
    logits = _gemv_float_logits(max_tokens, pdl, skinny_pdl)
    return LinearOps(_gemv_linear(max_tokens, pdl, skinny_pdl), add_linear,
                     _gemv_norm_linear(max_tokens, pdl, skinny_pdl), silu_down_=_table_silu_down_(add_linear),
                     float_logits=logits, pdl=pdl, max_tokens=max_tokens, skinny_pdl=skinny_pdl,
                     norm_float_logits=_gemv_norm_float_logits(pdl, logits))


# Rows of x each Triton table's kernels take.
TRITON_MAX_TOKENS = {"triton_gemv": 1, "triton_skinny": triton_gemv.MAX_TOKENS}
TRITON_GEMV = triton_gemv_ops(TRITON_MAX_TOKENS["triton_gemv"])
TRITON_SKINNY = triton_gemv_ops(TRITON_MAX_TOKENS["triton_skinny"])
LINEAR_KERNELS = {"cublas": CUBLAS, "triton_gemv": TRITON_GEMV, "triton_skinny": TRITON_SKINNY}


def linear_kernel_ops(name: str, programmatic_launch: bool = False, skinny_early: bool = True,
                      gemv_early: bool = True) -> LinearOps:
    """The table `engine.linear_kernel=name` runs (a key of LINEAR_KERNELS); with `programmatic_launch`
    (`engine.programmatic_launch`), a Triton table's kernels launched with programmatic dependent launch: its
    one-row GEMVs with `gemv_early` (`engine.gemv_early_launch`), its skinny kernel's (2..16 rows) with
    `skinny_early` (`engine.skinny_early_launch`)."""
    if programmatic_launch and name in TRITON_MAX_TOKENS:
        return triton_gemv_ops(TRITON_MAX_TOKENS[name], pdl=gemv_early, skinny_pdl=skinny_early)
    return LINEAR_KERNELS[name]


def use_linear_ops(model: nn.Module, ops: LinearOps) -> None:
    """Make every module of `model` that projects (those with a `linear_ops` table) call `ops`."""
    set_on_modules(model, "linear_ops", ops)
