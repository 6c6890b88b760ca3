"""Phase timers for engine steps: CUDA events on a GPU (no sync until the step's read-back), wall clock on CPU."""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """Marks phase boundaries within one step; `elapsed_ms()` after the step's device sync.

    mark(name) closes the previous phase and opens `name`; elapsed_ms() returns {phase: ms}.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def _now(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self, name: str) -> None:
        self._marks = [(name, self._now())]

    def mark(self, name: str) -> None:
        self._marks.append((name, self._now()))

    def elapsed_ms(self) -> dict[str, float]:
        """Per-phase milliseconds; the last mark closes the last phase (its name is ignored)."""
        out: dict[str, float] = {}
        for (name, t0), (_, t1) in zip(self._marks, self._marks[1:]):
            if self.cuda:
                t1.synchronize()
                out[name] = out.get(name, 0.0) + t0.elapsed_time(t1)
            else:
                out[name] = out.get(name, 0.0) + (t1 - t0) * 1e3
        return out
