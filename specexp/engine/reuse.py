"""One engine for several sweep points: switch a built engine's static depth, acceptance and seed between runs,
with clean counters and the graph figures of the depth it serves.

A sweep over k (and over synthetic acceptance, sampling seed, workload or concurrency) spends most of its wall
time building engines: loading the pair, warming up, compiling and capturing graphs, once per point. An engine
built at K = the largest k of the points with `serve_depths` = their ks captures every graph those depths replay
at start-up (`NativeEngine(serve_depths=...)`); between runs `use_static_depth(k)` makes every later step run at
k, as an engine built at K = k would. Only the buffers stay sized for K: the tokens (greedy) and the acceptance
are those of the engine built at k. At k = 0 the draft does not run at all (an engine built at K = 0 has none).

What is per run: the step records and requests (each `generate` returns its own), the graph replay and
eager-fallback counters (`reset_counters`; `counter_state` / `restore_counters` pause and resume them), the random
state (`reseed`; `rng_state` / `set_rng_state` pause and resume it) and the capture figures `graph_summary`
reports: with serve_depths set, only the graphs a static-k engine would have captured (per (manager, size, k)
records of that k, and every k-independent manager's), their capture bytes and seconds (each key's first run and
capture, of which `graph_compile_s` compiling) summed from those records (the whole capture's free-memory delta,
which also holds the warm-ups' allocations, is kept as `engine_graph_capture_bytes`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from specexp.engine.config import EngineConfigError
from specexp.engine.cudagraph import record_compile_s
from specexp.engine.depth import StaticDepth


def check_serve_depths(depths: Sequence[int], max_k: int) -> frozenset[int]:
    """The static depths an engine of K = max_k may be switched to; EngineConfigError naming a bad one."""
    for k in depths:
        if not isinstance(k, int) or not 0 <= k <= max_k:
            raise EngineConfigError(f"serve_depths: k={k!r} is not in 0..{max_k} (the engine's K)")
    return frozenset(depths)


def with_depths(step_depths: Callable[[int], frozenset[int]], extra: frozenset[int]
                ) -> Callable[[int], frozenset[int]]:
    """step_depths(n) with `extra` added at every batch size (the graph keys then cover those static depths)."""
    if not extra:
        return step_depths
    return lambda num_reqs: step_depths(num_reqs) | extra


def depth_graph_summary(summary: dict, k: int) -> dict:
    """`graph_summary()` cut to what a static-k engine captures: per-k managers' records of k, every
    k-independent manager's (see the module docstring)."""
    managers = {}
    for name, manager in summary["managers"].items():
        records = [r for r in manager["per_size"] if not manager["per_k"] or r["num_speculative_tokens"] == k]
        managers[name] = {**manager, "per_size": records,
                          "capture_bytes": sum(r["capture_bytes"] for r in records),
                          "capture_s": sum(r["capture_s"] for r in records),
                          "compile_s": sum(record_compile_s(r) for r in records)}
    out = {**summary, "managers": managers, "served_depth": k,
           "engine_graph_capture_bytes": summary["graph_capture_bytes"]}
    # the allocator's share is measured for the whole engine only
    out["engine_graph_capture_reserved_bytes"] = out.pop("graph_capture_reserved_bytes", None)
    if summary["graph_capture_bytes"] is not None:
        out["graph_capture_bytes"] = sum(m["capture_bytes"] for m in managers.values())
        # a phase's seconds as a whole engine reports them: its keys' first runs, compiles and captures
        out["graph_compile_s"] = sum(m["compile_s"] for m in managers.values())
        out["graph_capture_s"] = sum(r["capture_s"] + r.get("first_run_s", 0.0)
                                     for m in managers.values() for r in m["per_size"])
    return out


MANAGER_COUNTERS = ("num_replays", "num_eager", "replays_per_graph", "num_eager_uncaptured")
MIXED_COUNTERS = ("num_mixed_joined", "num_mixed_in_parts", "num_prompt_batches_graphed")


class EngineReuse:
    """The between-runs half of `NativeEngine` (a mixin): what a sweep changes on a built engine."""

    serve_depths: frozenset[int] = frozenset()

    def use_static_depth(self, k: int) -> None:
        """Run every later step at depth k, one of `serve_depths` (or K itself): what an engine built at K = k runs.
        EngineConfigError naming k when it is not one of them. At k = 0 that is an engine without a draft: the
        draft does not run (`draft_off`), plain decoding queues each step before the last is read back
        (`engine.plain_decode_lookahead`), and the graph and buffer figures are the target's. Called between runs
        (no step in flight)."""
        if k != self.k and k not in self.serve_depths:
            served = sorted(self.serve_depths | {self.k})
            raise EngineConfigError(f"use_static_depth({k}): this engine captured graphs for k in {served} only "
                                    "(NativeEngine(serve_depths=...))")
        self.depth = StaticDepth(k)
        self.scheduler.step_depth = self.depth.step_k
        self.draft_off = k == 0 and self.speculator is not None

    def reset_counters(self) -> None:
        """Zero every graph manager's replay and eager counts and the mixed-step counts (a new run's figures)."""
        for manager in self.graph_managers():
            manager.num_replays = manager.num_eager = 0
            manager.replays_per_graph.clear()
            manager.num_eager_uncaptured.clear()
        self.reset_graphed_step_counts()
        if self.speculator is not None:
            self.speculator.reset_graphed_step_counts()

    def counter_state(self) -> list:
        """A copy of every counter `reset_counters` zeroes (graph managers', then the mixed-step counts), for
        `restore_counters`: a run paused while other runs use the engine resumes with its own counts."""
        managers = [{name: copy.copy(getattr(m, name)) for name in MANAGER_COUNTERS} for m in self.graph_managers()]
        return [managers, [{name: getattr(o, name) for name in MIXED_COUNTERS} for o in self._counted()]]

    def restore_counters(self, state: list) -> None:
        """Put back counters saved by `counter_state`."""
        managers, mixed = state
        for manager, saved in zip(self.graph_managers(), managers, strict=True):
            for name, value in saved.items():
                setattr(manager, name, copy.copy(value))
        for owner, saved in zip(self._counted(), mixed, strict=True):
            for name, value in saved.items():
                setattr(owner, name, value)

    def _counted(self) -> list:
        return [self] + ([self.speculator] if self.speculator is not None else [])

    def rng_state(self) -> torch.Tensor:
        """The sampling's random state now (uint8 tensor), for `set_rng_state`."""
        if self.device.type == "cuda":
            return torch.cuda.get_rng_state(self.device)
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Put back a random state from `rng_state`: a run paused while other runs sampled goes on with the
        numbers it would have drawn alone."""
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            self.generator.set_state(state)

    def reseed(self, seed: int) -> None:
        """Restart the sampling's random state from `seed` (what `engine.seed` does at start-up)."""
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            self.generator.manual_seed(seed)

    def set_synthetic_acceptance(self, rate: float = 0.7, rates: Sequence[float] | None = None,
                                 length: float | None = None) -> None:
        """Change a synthetic-rejection engine's acceptance between runs, without a rebuild (its captured graphs
        read the new rates): `rate`, `rates` or `length` as the `speculator.synthetic_acceptance_*` keys
        (`specexp.engine.synthetic`). Raises EngineConfigError with one line when the engine does not run
        `speculator.rejection=synthetic` or a value is out of range."""
        if self.k == 0 or self.spec_cfg.rejection != "synthetic":
            raise EngineConfigError(f"synthetic acceptance needs speculator.rejection=synthetic and k > 0 (this "
                                    f"engine: rejection={self.spec_cfg.rejection}, k={self.k})")
        spec = replace(self.spec_cfg, synthetic_acceptance_rate=rate,
                       synthetic_acceptance_rates=tuple(rates) if rates is not None else None,
                       synthetic_acceptance_length=length)
        spec.synthetic_rates()  # validates
        self.rejection.set_conditional_rates(spec.synthetic_conditional_rates())
        self.spec_cfg = spec
