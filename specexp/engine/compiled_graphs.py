"""Step graphs on a CPU: each (size, k, key-length bucket) step function compiled by torch.compile at start-up.

On a GPU, `engine.cudagraph_mode=full` records each fixed-shape step function (`CudaGraphManager`) as a CUDA
graph, and a replay costs the host one call. A CPU has no graphs, but the same functions are just as fixed:
every shape, every metadata integer and every buffer they touch is set by their key. So under
`cudagraph_mode=full` on a CPU device, a manager's capture compiles the function once per key with
torch.compile (inductor's C++ backend: pointwise chains fused into loops, GEMMs left to torch's CPU kernels,
no Python between ops) and a "replay" calls the compiled function: one guard check and one generated function
where an eager step makes hundreds of small torch calls. At the demo pair's sizes a CPU step is bound by those
calls, not by arithmetic (a kernel costs a few µs whatever its size), which is what compiling removes.

Compilation is static (`dynamic=False`): the key fixes every size, so each key gets its own specialised code
and no guard on a size can fail at run time. The function is called on the persistent buffers it was compiled
on (`functools.partial(fn, desc)`), exactly as a CUDA graph replays its captured addresses, so everything the
engine stages between steps reaches it. What runs eagerly under CUDA graphs (prompt prefills without prompt
graphs, mixed batches, batches above the largest size) runs eagerly here too, and is counted the same way.

Random numbers: a call that takes a `torch.Generator` cannot be traced, so the samplers of a compiled engine
draw from a :class:`RandomTape`, filled from the generator before each call in the eager step's order: the step
compiles whole and samples what the eager step would (:func:`step_random_source`).

Costs and limits:
- start-up: inductor compiles each key (seconds each on a small CPU; cached on disk by inductor, so a second
  run of the same shapes mostly traces). The per-(manager, size, k) `capture_s` records it.
- numerics: fp32 results may differ from eager in the last bits (inductor's fused reductions sum in another
  order); in half precision `emulate_precision_casts` asks inductor to round where eager rounds (the tests check
  fp32 pairs only).
- dynamo caches compiled code per code object, and every key compiles the same functions again: the limit on
  compiled variants per function is raised to what the engine captures (:func:`reserve_compiled_variants`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import torch

# Compiled variants dynamo keeps beyond the engine's graphs: the compiled pointwise ops share these limits.
VARIANT_HEADROOM = 64


class StepCompileError(RuntimeError):
    """torch.compile could not compile a step function (no C++ compiler, an unsupported op, ...)."""


def reserve_compiled_variants(num_graphs: int) -> None:
    """Let dynamo keep at least num_graphs + VARIANT_HEADROOM compiled variants of one function (and in all):
    each captured key compiles the step functions once more. Raises the process-wide limits, never lowers them."""
    config = torch._dynamo.config
    needed = num_graphs + VARIANT_HEADROOM
    config.recompile_limit = max(config.recompile_limit, needed)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, needed)


def compile_step(fn: Callable[[object], None], desc) -> Callable[[], None]:
    """fn(desc) compiled for this one key, and compiled now by running it once: a zero-argument callable that runs
    what fn(desc) runs, on the same persistent buffers (fill them with an inert batch first, as before a CUDA
    graph capture). Raises StepCompileError, with the compiler's first line, when inductor fails."""
    compiled = torch.compile(functools.partial(fn, desc), dynamic=False,
                             options={"emulate_precision_casts": True})
    try:
        compiled()
    except Exception as exc:  # inductor fails in many exception types, each with a long report
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise StepCompileError(f"engine.cudagraph_mode=full on a CPU compiles each step graph with torch.compile, "
                               f"which failed ({first}); engine.cudagraph_mode=none runs the steps eagerly") from exc
    return compiled


class RandomTape:
    """The random numbers of a compiled step, drawn just before it runs, in the order it takes them.

    Dynamo cannot trace a call that takes a `torch.Generator`, so a step that samples (T > 0) or accepts drafts at
    a synthetic rate would be cut into pieces at every draw. Instead the samplers draw through this tape
    (:func:`specexp.engine.sampling.uniform`, :func:`specexp.engine.sampling.exponential_like`):
    - off the tape (eager steps, warm-ups) it draws from `generator` as torch.rand / exponential_ would, and
      while recording it notes each draw's kind and shape: the key's plan;
    - playing a plan (`play`) it first draws the plan's numbers from `generator`, in the same order and shapes the
      eager step would, into one preallocated float32 buffer, then hands them out as views in that order.
    The compiled step reads only the buffer, so it compiles whole, and draws the same numbers from the same
    generator state as the eager step: compiled, emulated and eager runs of one seed sample the same tokens.

    generator: the engine's CPU generator; numel: the most numbers one step draws (the buffer never grows, so
    the compiled code's guards on it always hold)."""

    def __init__(self, generator: torch.Generator, numel: int, device: torch.device) -> None:
        self.generator = generator
        self.buffer = torch.zeros(max(numel, 1), dtype=torch.float32, device=device)
        self.offset = 0  # the next number handed out while playing
        self.playing = False
        self._plan: list[tuple[str, tuple[int, ...]]] | None = None  # while recording

    def uniform(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """U[0, 1) float32 of `shape` (torch.rand's numbers for the generator's state)."""
        if self.playing:
            return self._take(shape)
        self._note("uniform", shape)
        return torch.rand(shape, device=device, generator=self.generator)

    def exponential_like(self, like: torch.Tensor) -> torch.Tensor:
        """Exp(1) float32 of like's shape (`torch.empty_like(like).exponential_()`'s numbers); like: float32."""
        if like.dtype != torch.float32:
            raise ValueError(f"a random tape draws float32 noise, not {like.dtype}")
        if self.playing:
            return self._take(tuple(like.shape))
        self._note("exponential", tuple(like.shape))
        return torch.empty_like(like).exponential_(generator=self.generator)

    def record(self) -> None:
        """Note the draws from here on (an eager warm-up of one key)."""
        self._plan = []

    def recorded(self) -> list[tuple[str, tuple[int, ...]]]:
        """The draws noted since `record`, in order (kind, shape); stops recording."""
        plan, self._plan = self._plan or [], None
        return plan

    @contextlib.contextmanager
    def play(self, plan: list[tuple[str, tuple[int, ...]]]):
        """Draw `plan` into the buffer now, then hand those numbers out until the block ends."""
        start = 0
        for kind, shape in plan:
            n = math.prod(shape)
            if start + n > self.buffer.numel():
                raise ValueError(f"a step draws more random numbers than its tape holds ({self.buffer.numel()})")
            view = self.buffer[start : start + n].view(shape)
            view.uniform_(generator=self.generator) if kind == "uniform" else view.exponential_(generator=self.generator)
            start += n
        self.offset, self.playing = 0, True
        try:
            yield
        finally:
            self.playing = False

    def _note(self, kind: str, shape) -> None:
        if self._plan is not None:
            self._plan.append((kind, tuple(shape)))

    def _take(self, shape) -> torch.Tensor:
        n = math.prod(shape)
        out = self.buffer[self.offset : self.offset + n].view(shape)
        self.offset += n
        return out


def step_random_source(generator: torch.Generator | None, compiled: bool, max_rows: int, k: int, vocab: int,
                       sampling: bool, device: torch.device) -> torch.Generator | RandomTape | None:
    """What an engine's samplers draw from: `generator`, or when its steps are compiled for a CPU a RandomTape over
    it, sized for the most numbers one step of up to max_rows rows at depth up to k draws: a synthetic verify's
    U[0, 1) per draft; when sampling (T > 0) also an Exp(1) row of `vocab` per row for the verify's last token
    and for each draft token of a draft prefill or decode graph."""
    if not compiled or generator is None:
        return generator
    per_row = k + (max(1, k - 1) * vocab if sampling else 0)  # verify k + V; draft decode (k - 1) V
    return RandomTape(generator, max_rows * per_row, device)
