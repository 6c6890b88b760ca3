"""When each request reaches the engine: at its arrival offset (open loop), when a concurrency slot frees
(closed loop), or the later of the two.

`ArrivalGate` holds the requests that have not arrived yet. Before each step the engine asks it to
`release(now_s)` whatever has arrived by then and hands those to the scheduler, which runs them in the next
step it can (a request that arrives while a step runs joins the step after: admission is per step, as in
vLLM). A request's `arrival_s` is

    max(its offset, the finish time of the request whose concurrency slot it takes)

so latencies count from the moment it would have reached a server, not from the step that first saw it:
the wait for that step is part of `queue_ms`. A request holds its slot from its arrival until its last token
is known (`Request.finish_s`); with plain-decoding lookahead that is one step after the scheduler freed its
cache, as it is for a client waiting for the token.

Offsets are seconds after the run's start (`generate`'s clock); the gate never reads a clock itself.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from specexp.engine.config import EngineConfigError
from specexp.engine.request import Request


class ArrivalGate:
    """Requests not yet handed to the scheduler, in arrival order.

    arrival_s: per request (same order as `requests`), its offset in seconds after the run starts; None =
    every request at 0 (a burst). max_concurrency: requests in flight at most (arrived, last token not out
    yet); None = no cap. Ties in arrival keep the requests' order.
    """

    def __init__(self, requests: Sequence[Request], arrival_s: Sequence[float] | None = None,
                 max_concurrency: int | None = None) -> None:
        offsets = [0.0] * len(requests) if arrival_s is None else [float(t) for t in arrival_s]
        if len(offsets) != len(requests):
            raise EngineConfigError(f"{len(offsets)} arrival times for {len(requests)} requests: give one per request")
        bad = [t for t in offsets if not (math.isfinite(t) and t >= 0.0)]
        if bad:
            raise EngineConfigError(f"arrival time {bad[0]!r} s is not valid: use a finite number of seconds >= 0")
        if max_concurrency is not None and max_concurrency < 1:
            raise EngineConfigError(f"max_concurrency={max_concurrency}: must be >= 1 (or None for no cap)")
        order = sorted(range(len(requests)), key=lambda i: (offsets[i], i))
        self._pending: deque[tuple[float, Request]] = deque((offsets[i], requests[i]) for i in order)
        # Times (s) at which a concurrency slot became free; a min-heap. None: no cap.
        self._free_slots: list[float] | None = [0.0] * max_concurrency if max_concurrency is not None else None
        self._in_flight: list[Request] = []

    @property
    def num_pending(self) -> int:
        """Requests not released yet."""
        return len(self._pending)

    @property
    def num_in_flight(self) -> int:
        """Requests released whose last token is not known yet (as of the last `release`)."""
        return len(self._in_flight)

    def next_arrival_s(self) -> float | None:
        """When the next request arrives if a slot is free for it; None when none is pending, or when it
        waits for a request in flight to finish."""
        if not self._pending:
            return None
        if self._free_slots is not None and not self._free_slots:
            return None
        slot_s = self._free_slots[0] if self._free_slots else 0.0
        return max(self._pending[0][0], slot_s)

    def release(self, now_s: float) -> list[Request]:
        """Requests that have arrived by `now_s` (seconds since the run started), in arrival order, with their
        `arrival_s` set; frees the slots of requests that finished before."""
        self._reap()
        released = []
        while self._pending and self._pending[0][0] <= now_s:
            if self._free_slots is not None and not self._free_slots:
                break
            offset, request = self._pending.popleft()
            slot_s = heapq.heappop(self._free_slots) if self._free_slots is not None else 0.0
            request.arrival_s = max(offset, slot_s)
            self._in_flight.append(request)
            released.append(request)
        return released

    def _reap(self) -> None:
        still = []
        for request in self._in_flight:
            if request.finish_s is None:
                still.append(request)
            elif self._free_slots is not None:
                heapq.heappush(self._free_slots, request.finish_s)
        self._in_flight = still
