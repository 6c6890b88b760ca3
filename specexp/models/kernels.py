"""Per-layer kernel choices that the engine sets on a model's modules (`engine.attention_kernel`,
`engine.conv_kernel`): a named fast path for uniform batches, or None for the default torch path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class UniformKernel:
    """`uniform` runs a layer's uniform batches (every decode and verify step: each row the same number of
    tokens, row after row) when it supports them; None, or any batch it does not take, runs the default path."""

    name: str
    uniform: Callable[..., torch.Tensor] | None


def use_uniform_kernel(model: nn.Module, attr: str, kernel: UniformKernel) -> None:
    """Set `kernel` on every module of `model` that has a UniformKernel attribute `attr`."""
    for module in model.modules():
        if isinstance(getattr(module, attr, None), UniformKernel):
            setattr(module, attr, kernel)
