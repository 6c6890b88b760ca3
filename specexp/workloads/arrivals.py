"""How a workload's requests arrive: ``workload.arrival`` and its settings, as per-request offsets and a cap.

- ``burst`` (default): every request at t = 0, the engine's own queue deciding who runs first.
- ``poisson``: a Poisson process of ``workload.request_rate`` requests/s (``vllm bench serve``'s
  ``--request-rate``): exponential gaps drawn from ``workload.seed``, the first request at t = 0.
- ``concurrency``: a closed loop keeping ``workload.max_concurrency`` requests in flight, a new one arriving
  when one finishes (``vllm bench serve --max-concurrency`` with an infinite rate).
- ``trace``: the offsets in ``workload.arrival_path``, a JSON-lines file whose line i is request i's arrival
  in seconds after the first (a number, or an object with ``arrival_s``); it needs a line per request.

``workload.max_concurrency`` also caps the open-loop processes ``poisson`` and ``trace``, as vLLM's benchmark
does: a request then arrives at the later of its offset and the moment a slot frees (``burst`` with a cap is
``concurrency``). The same seed gives the same arrival times on every machine and for every backend that
supports the process.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from specexp.errors import ConfigError

ARRIVALS = ("burst", "poisson", "concurrency", "trace")
OPEN_LOOP = ("burst", "poisson", "trace")


@dataclass(frozen=True)
class ArrivalSchedule:
    """When a run's requests arrive. ``kind``: one of :data:`ARRIVALS`. ``offsets_s``: per request, seconds
    after the run starts (``None``: all at 0). ``max_concurrency``: requests in flight at most (``None``: no
    cap). ``request_rate``: the Poisson rate in requests/s (``None`` for the other processes)."""

    kind: str = "burst"
    offsets_s: tuple[float, ...] | None = None
    max_concurrency: int | None = None
    request_rate: float | None = None

    @property
    def is_burst(self) -> bool:
        """Every request at t = 0 with no cap: today's single ``generate`` call of every backend."""
        return self.offsets_s is None and self.max_concurrency is None


def poisson_offsets(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Arrival offsets (s) of ``num_requests`` requests of a Poisson process of ``request_rate`` requests/s:
    the first at 0, then exponential gaps of mean ``1 / request_rate`` drawn from ``random.Random(seed)``
    (the same on every platform). Non-decreasing; length ``num_requests``."""
    if not (math.isfinite(request_rate) and request_rate > 0):
        raise ConfigError(f"workload.request_rate={request_rate!r} is not valid: use a number of requests/s > 0")
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(num_requests):
        if i:
            t += rng.expovariate(request_rate)
        offsets.append(t)
    return offsets


def read_trace_offsets(path: str | Path, num_requests: int) -> list[float]:
    """Request i's arrival offset (s) from line i of the JSON-lines file ``path`` (a number, or an object
    with ``arrival_s``); blank lines are skipped. The first ``num_requests`` lines are used and must be
    finite numbers >= 0; a file with fewer lines, or a bad line, is a one-line :class:`ConfigError`."""
    name = f"workload.arrival_path={path}"
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as e:
        raise ConfigError(f"{name} cannot be read ({e.strerror or type(e).__name__}): give a JSON-lines file of"
                          " arrival offsets in seconds") from None
    if len(lines) < num_requests:
        raise ConfigError(f"{name} has {len(lines)} arrival offsets for {num_requests} requests: give one line per"
                          " request (or lower workload.num_prompts)")
    offsets = []
    for number, line in enumerate(lines[:num_requests], start=1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            value = value.get("arrival_s")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} line {number} is {line.strip()[:60]!r}: each line must be an arrival offset"
                              ' in seconds >= 0, a number or {"arrival_s": ...}')
        offsets.append(float(value))
    return offsets


def arrival_schedule(workload, num_requests: int) -> ArrivalSchedule:
    """The :class:`ArrivalSchedule` of ``workload`` (a :class:`specexp.specs.WorkloadSpec`) for
    ``num_requests`` requests; a one-line :class:`ConfigError` for a missing or bad setting."""
    kind, rate, cap, path = workload.arrival, workload.request_rate, workload.max_concurrency, workload.arrival_path
    if kind not in ARRIVALS:
        raise ConfigError(f"workload.arrival={kind!r} is not valid: use one of {', '.join(ARRIVALS)}")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(f"workload.max_concurrency={cap!r} is not valid: use an integer >= 1 (or null: no cap)")
    if rate is not None and kind != "poisson":
        raise ConfigError(f"workload.request_rate={rate} is set but workload.arrival={kind}: use"
                          " workload.arrival=poisson, or leave request_rate null")
    if path is not None and kind != "trace":
        raise ConfigError(f"workload.arrival_path={path} is set but workload.arrival={kind}: use"
                          " workload.arrival=trace, or leave arrival_path null")
    if kind == "burst" and cap is None:
        return ArrivalSchedule("burst")
    if kind in ("burst", "concurrency"):
        if cap is None:
            raise ConfigError("workload.arrival=concurrency needs workload.max_concurrency (requests kept in flight)")
        return ArrivalSchedule("concurrency", None, cap)
    if kind == "poisson":
        if rate is None:
            raise ConfigError("workload.arrival=poisson needs workload.request_rate (requests/s)")
        return ArrivalSchedule("poisson", tuple(poisson_offsets(num_requests, float(rate), int(workload.seed))),
                               cap, float(rate))
    if path is None:
        raise ConfigError("workload.arrival=trace needs workload.arrival_path (a JSON-lines file of offsets in s)")
    from specexp.workloads import resolve_workload_path

    return ArrivalSchedule("trace", tuple(read_trace_offsets(resolve_workload_path(str(path)), num_requests)), cap)


def check_backend_arrivals(backend: str, schedule: ArrivalSchedule, supported: tuple[str, ...]) -> None:
    """One-line :class:`ConfigError` unless ``backend`` serves ``schedule``'s process (``supported``: the
    kinds of :data:`ARRIVALS` it implements)."""
    if schedule.kind not in supported:
        raise ConfigError(f"workload.arrival={schedule.kind} is not supported by backend {backend}: it serves"
                          f" workload.arrival={', '.join(supported)}")
