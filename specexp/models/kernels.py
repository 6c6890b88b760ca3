"""Kernel choices the engine sets on a model's modules: the per-layer fast paths for uniform batches
(`engine.attention_kernel`, `engine.conv_kernel`), and the one setter every module table goes through (these,
`linear_ops.LinearOps`, `pointwise.PointwiseOps`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn


@dataclass(frozen=True)
class UniformKernel:
    """`uniform` runs a layer's uniform batches (every decode and verify step: each row the same number of
    tokens, row after row) when it supports them; `varlen`, where a layer kind has one, its batches of non-spec
    rows of any lengths (prompt chunks). None, or any batch a kernel does not take, runs the default path."""

    name: str
    uniform: Callable[..., torch.Tensor] | None
    varlen: Callable[..., torch.Tensor] | None = None

    def launched_early(self) -> UniformKernel:
        """This kernel with its uniform batches launched with programmatic dependent launch where the GPU can
        (`engine.programmatic_launch`: the `uniform` function's `pdl`); varlen batches (prompt chunks) as they
        were."""
        if self.uniform is None:
            return self
        return replace(self, uniform=functools.partial(self.uniform, pdl=True))


def set_on_modules(model: nn.Module, attr: str, value: object) -> None:
    """Set `attr` to `value` on every module of `model` whose `attr` already holds a value of its type (the
    modules that declare that table; a class attribute is the default, this sets an instance attribute)."""
    for module in model.modules():
        if isinstance(getattr(module, attr, None), type(value)):
            setattr(module, attr, value)
