"""Fold each pre-norm's weight into the projections that read it: (rms_norm(x) * g) @ W^T = rms_norm(x) @ (W g)^T,
where W g scales column j of W [out, in] by g[j].

A decoder layer applies RMSNorm with weight g [hidden] to the residual stream before its q/k/v (or LFM2's conv
in_proj) and gate/up projections. After folding, the norm's weight is all ones (`RMSNorm.folded` is set) and
each of those projections' weights holds W g. The model computes the same function, up to one rounding of W g
to the weights' dtype (in bf16 at most 2^-8 relative per weight, the size of the rounding eager already applies
to rms_norm(x) * g). Biases are unchanged: b does not see the norm.

Why: a kernel that fuses the norm into the projection (`triton_gemv.gemv`) then only scales each row's dot
products by 1/rms(x) at the end. The skinny kernel (2..16 rows of x on the tensor cores) otherwise multiplies
each x tile by g in registers, which takes x off its shared-memory pipeline: on the H200 that scaling alone cost
15-25% of a GEMM chain at 2 rows (2026-11-30; experiments/2026-11-29-cudagraphs-h200/).

Folding is idempotent (a folded norm's weight is ones) and changes the model in place; the final norm before
the LM head is never folded (the head may be tied to the embeddings). Each decoder layer lists its pairs in
`pre_norm_projections()`.
"""

from __future__ import annotations

import torch
from torch import nn


def pre_norm_pairs(model: nn.Module) -> list[tuple[nn.Module, list[nn.Linear]]]:
    """Every (pre-norm, projections reading it) pair of `model`'s decoder layers, in layer order."""
    return [pair for module in model.modules() if hasattr(module, "pre_norm_projections")
            for pair in module.pre_norm_projections()]


@torch.no_grad()
def fold_norm_weights(model: nn.Module) -> int:
    """Fold every pre-norm weight of `model` into its projections (see the module docstring), in place.
    Returns how many norms were folded now (0 on a model already folded). Raises ValueError when the model's
    layers declare no pre-norm projections (nothing to fold: an unsupported architecture)."""
    pairs = pre_norm_pairs(model)
    if not pairs:
        raise ValueError(f"{type(model).__name__} declares no pre-norm projections (pre_norm_projections()); "
                         "norm folding supports the native Llama and LFM2 models")
    folded = 0
    for norm, projections in pairs:
        if norm.folded:
            continue
        g = norm.weight.detach().float()
        for linear in projections:
            if linear.weight.shape[1] != g.numel():
                raise ValueError(f"{type(linear).__name__} of input width {linear.weight.shape[1]} cannot fold a "
                                 f"norm of width {g.numel()}")
            # In place: a stacked q/k/v (gate/up) weight shares these parameters' storage.
            linear.weight.copy_((linear.weight.float() * g).to(linear.weight.dtype))
        norm.weight.fill_(1.0)
        norm.folded = True
        folded += 1
    return folded
