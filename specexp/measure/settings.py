"""The ``measure`` keys of a run config (conf/config.yaml, docs/configuration.md) as one plain dataclass."""

from __future__ import annotations

from dataclasses import dataclass, fields

from specexp.measure.intervals import DEFAULT_RESAMPLES


@dataclass(frozen=True)
class MeasureSettings:
    """``repeats``: measured passes over the workload (one engine, built once); ``warmup_requests``: requests
    served and discarded before the first, each to ``warmup_new_tokens`` (``None``: ``sampling.max_new_tokens``);
    ``interleave``: let a sweep run its jobs' repeats in rounds;
    ``busy_load_per_core``: the load per core above which the machine counts as busy;
    ``max_relative_std``: the spread of a figure over repeats above which they disagree;
    ``bootstrap_resamples``, ``bootstrap_seed``: the acceptance intervals' bootstrap."""

    repeats: int = 1
    warmup_requests: int = 1
    warmup_new_tokens: int | None = 16
    interleave: bool = True
    busy_load_per_core: float = 1.0
    max_relative_std: float = 0.05
    bootstrap_resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = 0

    @classmethod
    def from_config(cls, cfg: dict) -> MeasureSettings:
        """The settings of a resolved run config (defaults for keys it leaves out)."""
        given = cfg.get("measure") or {}
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given
                      and (given[f.name] is not None or f.name == "warmup_new_tokens")})
