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

Costs and limits:
- start-up: inductor compiles each key (seconds each on a small CPU; cached on disk by inductor, so a second
  run of the same shapes mostly traces). The per-(manager, size, k) `capture_s` records it.
- numerics: fp32 results may differ from eager in the last bits (inductor's fused reductions sum in another
  order); half precision keeps eager's roundings (`emulate_precision_casts`).
- dynamo caches compiled code per code object, and every key compiles the same functions again: the limit on
  compiled variants per function is raised to what the engine captures (:func:`reserve_compiled_variants`).
"""

from __future__ import annotations

import functools
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
