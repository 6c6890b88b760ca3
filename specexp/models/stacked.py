"""Several projections of one input as one GEMM, with every checkpoint parameter kept where it was.

q/k/v (and gate/up) read the same activations, so one matmul against their weights stacked row-wise
computes them all: fewer, larger GEMMs (at batch 1 a decode step is a chain of weight-streaming GEMMs, each a
kernel launch with its own tail). The checkpoint still names `q_proj.weight`, `k_proj.weight`, ...: each
stays a registered Parameter of its own `nn.Linear` (loading, seeded init, parameter order and counts are
unchanged) whose storage is a row-slice of one stacked tensor.

Anything that re-allocates a parameter (`module.to(...)`, `to_empty`, `load_state_dict(assign=True)`)
breaks the sharing; :meth:`StackedLinear.weights` notices (a pointer comparison per call, no device work)
and re-stacks before the next use, so the stacked weight can never go stale. A CUDA graph captured after
the first (eager warm-up) forward replays on the stacked storage, as a step compiled for a CPU reads it; the
engine never re-allocates weights after that.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class StackedLinear:
    """The stacked weight [sum(out_i), in] (and bias [sum(out_i)] or None) of `linears`, which share one input.

    Not an nn.Module: it registers nothing, so the owning module's parameters stay exactly the Linears'.
    """

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        if len({lin.in_features for lin in linears}) != 1:
            raise ValueError("stacked projections must share their input width")
        if len({lin.bias is None for lin in linears}) != 1:
            raise ValueError("stacked projections must all have biases or none")
        self.linears = tuple(linears)
        self.sizes = [lin.out_features for lin in linears]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._ptrs: tuple[int, ...] | None = None  # each part's data_ptr right after the last restack

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight [sum(out), in], bias [sum(out)] or None), re-stacked first if a parameter was re-allocated.

        Under torch.compile the check is left out (dynamo cannot trace a pointer comparison): the compiled code reads
        the stacked tensor it was traced with, as a captured CUDA graph reads its addresses, and the eager warm-up
        before every capture has already re-stacked."""
        if not torch.compiler.is_compiling() and not self._intact():
            self.restack()
        return self.weight, self.bias

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x: [T, in] -> one [T, out_i] view per projection, from a single GEMM."""
        weight, bias = self.weights()
        return list(torch.nn.functional.linear(x, weight, bias).split(self.sizes, dim=-1))

    def _intact(self) -> bool:
        # Each part still starts where restack() put it. Sound by pointers alone: this object holds the stacked
        # storage, so no re-allocated parameter can land inside it.
        return self._ptrs is not None and self._ptrs == self._part_ptrs()

    def _part_ptrs(self) -> tuple[int, ...]:
        # one pass over the Linears' parameter dicts, past nn.Module.__getattr__ (this runs before every GEMM: at
        # batch 1 on a CPU its cost shows); a re-assigned Parameter replaces its dict entry, so it is seen too
        params = [lin._parameters for lin in self.linears]
        if params[0].get("bias") is None:
            return tuple(p["weight"].data_ptr() for p in params)
        return tuple(p[name].data_ptr() for p in params for name in ("weight", "bias"))

    def _parts(self, name: str) -> list[torch.Tensor]:
        return [getattr(lin, name) for lin in self.linears]

    def restack(self) -> None:
        """Copy the projections' current values into one stacked tensor and make each parameter a view of its
        rows (the Parameter objects stay the same; only their storage moves)."""
        with torch.inference_mode(False), torch.no_grad():
            self.weight = self._rehome(self._parts("weight"))
            self.bias = self._rehome(self._parts("bias")) if self.linears[0].bias is not None else None
        # meta tensors have no storage (every pointer 0): never "intact", re-stacked once materialised
        self._ptrs = None if self.weight.device.type == "meta" else self._part_ptrs()

    def _rehome(self, params: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.cat([p.detach() for p in params])
        start = 0
        for p, size in zip(params, self.sizes, strict=True):
            p.data = stacked[start : start + size]
            start += size
        return stacked


def restack_all(model: nn.Module) -> None:
    """Stack every StackedLinear of `model` now (after its weights are final), rather than at its first
    forward."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, StackedLinear):
                value.restack()
