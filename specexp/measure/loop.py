"""One measurement: build the backend's engine once, serve warm-up requests and discard them, then serve the
workload once per repeat, reading the machine's state around each repeat.

``pace`` (a sweep measuring in rounds, :mod:`specexp.sweep_rounds`) is asked before each repeat and once
after the last (``wait("repeat 0")``, ..., ``wait("finish")``); it returns when this job may go on, with the
repeat's slot in the sweep's order. Without it the repeats run back to back.

Each pass runs with the garbage collector's view of the heap frozen
(:func:`specexp.engine.frozen_heap.frozen_gc`): collections inside it walk only what the pass allocates, so the
collector's share of a pass does not grow with what else its process holds (one job's engine, or a reused sweep's
engine and every earlier job's results).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from specexp.engine.frozen_heap import frozen_gc
from specexp.measure import machine
from specexp.measure.settings import MeasureSettings

log = logging.getLogger(__name__)


class Pace(Protocol):
    """Says when a job may measure: blocks in :meth:`wait` until it may, returns the slot it got (or None)."""

    def wait(self, label: str) -> int | None: ...


@dataclass
class Measurement:
    """What :func:`measure` gathered. ``results``: one RunResult per repeat; ``repeats``: per repeat
    ``repeat``, ``sweep_slot``, ``started_at``, ``wall_s`` (the pass's wall time), ``process_cpu_s`` (this
    process's CPU seconds in it) and ``machine`` (``before``/``after`` readings); ``machine``: the readings
    before the first repeat (after warm-up) and after the last; ``engine_builds``: 1 with a backend server,
    one per repeat for a backend that has only ``run``."""

    results: list = field(default_factory=list)
    repeats: list[dict] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    warmup_requests: int | None = 0
    engine_builds: int = 1


def warmup_prompts(prompts: list, count: int) -> list:
    """The first ``count`` prompts of the workload (from the start again when it has fewer)."""
    return [prompts[i % len(prompts)] for i in range(count)] if prompts else []


def _repeat(number: int, slot: int | None, device: str, before: dict, serve) -> tuple[object, dict]:
    started_at = dt.datetime.now().isoformat(timespec="milliseconds")
    with frozen_gc():  # a collection inside the pass walks what the pass allocates, not the whole process
        cpu0, t0 = time.process_time(), time.perf_counter()
        result = serve()
        wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    record = {"repeat": number, "sweep_slot": slot, "started_at": started_at, "wall_s": wall_s,
              "process_cpu_s": cpu_s, "machine": {"before": before, "after": machine.snapshot(device)}}
    return result, record


def measure(module, spec, settings: MeasureSettings, progress=None, pace: Pace | None = None) -> Measurement:
    """Warm-up and ``settings.repeats`` measured passes of ``spec`` on backend ``module`` (see the module
    docstring). A backend without servers is run once per repeat instead (its engine built each time, its
    own warm-up inside)."""
    from specexp.backends import open_server, run_backend

    device = spec.engine.device
    out = Measurement(warmup_requests=settings.warmup_requests)
    server = open_server(module, spec, progress)
    if server is None:
        out.engine_builds, out.warmup_requests = settings.repeats, None
        log.info("serving %d prompts, %d repeats (the backend is built for each)", len(spec.prompts), settings.repeats)
        out.machine["before"] = machine.snapshot(device)
        for r in range(settings.repeats):
            slot = pace.wait(f"repeat {r}") if pace is not None else None
            result, record = _repeat(r, slot, device, machine.snapshot(device),
                                     lambda: run_backend(module, spec, progress))
            out.results.append(result)
            out.repeats.append(record)
        if pace is not None:
            pace.wait("finish")
    else:
        with server:
            server.warm_up(warmup_prompts(spec.prompts, settings.warmup_requests), settings.warmup_new_tokens)
            log.info("models loaded and warmed up (%d requests): serving %d prompts, %d repeats",
                     settings.warmup_requests, len(spec.prompts), settings.repeats)
            out.machine["before"] = before = machine.snapshot(device)
            for r in range(settings.repeats):
                slot = pace.wait(f"repeat {r}") if pace is not None else None
                if r or pace is not None:
                    before = machine.snapshot(device)
                result, record = _repeat(r, slot, device, before, lambda: server.serve(spec.prompts, progress))
                out.results.append(result)
                out.repeats.append(record)
            if pace is not None:
                pace.wait("finish")
    out.machine["after"] = out.repeats[-1]["machine"]["after"] if out.repeats else machine.snapshot(device)
    return out
