"""A forward's rotary tables, made only when something reads them."""

from __future__ import annotations

from collections.abc import Callable

import torch


class RopeTables:
    """The rotary tables of one forward's flat batch of positions, made on first use: a uniform-batch attention
    kernel computes each token's angles itself from `positions` and `inv_freq` (the same values), so a forward
    whose attention layers all take it launches no table kernels.

    positions int64[T]; inv_freq fp32[D/2]; `tables` = (cos, signed_sin), each [T, D] in `dtype`
    (:func:`specexp.models.pointwise.rope_tables` on `make`), computed once and shared by the forward's layers;
    iterating yields them."""

    def __init__(self, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, make: Callable,
                 parent: tuple[RopeTables, int, int] | None = None):
        self.positions, self.inv_freq, self.dtype, self.make = positions, inv_freq, dtype, make
        self._parent = parent
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tables is None:
            if self._parent is None:
                self._tables = self.make(self.positions, self.inv_freq, self.dtype)
            else:
                parent, start, stop = self._parent
                self._tables = tuple(t[start:stop] for t in parent.tables)
        return self._tables

    def __iter__(self):
        return iter(self.tables)

    def rows(self, start: int, stop: int) -> RopeTables:
        """The tables of tokens [start, stop), sliced from this forward's (made once) when first used."""
        return RopeTables(self.positions[start:stop], self.inv_freq, self.dtype, self.make, (self, start, stop))
