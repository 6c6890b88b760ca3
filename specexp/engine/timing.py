"""Phase timers for engine steps: CUDA events on a GPU (no sync until the step's read-back), wall clock on CPU."""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """Marks phase boundaries within one step; `elapsed_ms()` after the step's device sync.

    mark(name) closes the previous phase and opens `name`; elapsed_ms() returns {phase: ms}.

    On a GPU the marks are timing events recorded on the stream that was current at `start`. The events are
    made once and reused by every step (a step reads its times before the next one starts): creating an event
    and looking up the current stream at every mark cost host time in the window where the device waits for
    the step's inputs.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._names: list[str] = []
        self._stamps: list[object] = []
        self._events: list[torch.cuda.Event] = []  # the GPU's marks, grown to the most marks one step made
        self._stream = None

    def _now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        i = len(self._stamps)
        if i == len(self._events):
            self._events.append(torch.cuda.Event(enable_timing=True))
        event = self._events[i]
        event.record(self._stream)
        return event

    def start(self, name: str) -> None:
        if self.cuda:
            self._stream = torch.cuda.current_stream()
        self._names, self._stamps = [], []
        self.mark(name)

    def mark(self, name: str) -> None:
        self._stamps.append(self._now())
        self._names.append(name)

    def elapsed_ms(self) -> dict[str, float]:
        """Per-phase milliseconds; the last mark closes the last phase (its name is ignored)."""
        out: dict[str, float] = {}
        if self.cuda and self._stamps:
            self._stamps[-1].synchronize()  # the stream's events complete in order
        for name, t0, t1 in zip(self._names, self._stamps, self._stamps[1:]):
            ms = t0.elapsed_time(t1) if self.cuda else (t1 - t0) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out
