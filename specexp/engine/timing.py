"""Phase timers for engine steps: CUDA events on a GPU (no sync until the step's times are read), wall clock on
CPU."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class PhaseStamps:
    """One step's marks: `names[i]` opens at `stamps[i]` and closes at `stamps[i + 1]` (CUDA events on a GPU,
    perf_counter seconds on CPU)."""

    names: list[str]
    stamps: list
    cuda: bool

    def elapsed_ms(self) -> dict[str, float]:
        """Per-phase milliseconds (repeated names add up); the last mark closes the last phase (its name is
        ignored). On a GPU this waits for the last mark's event."""
        out: dict[str, float] = {}
        if self.cuda and self.stamps:
            self.stamps[-1].synchronize()  # the stream's events complete in order
        for name, t0, t1 in zip(self.names, self.stamps, self.stamps[1:]):
            ms = t0.elapsed_time(t1) if self.cuda else (t1 - t0) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out


class PhaseTimer:
    """Marks phase boundaries within one step: mark(name) closes the previous phase and opens `name`.

    `stamps()` hands out the step's marks, readable until the step after next starts: the engine reads a step's
    times one step late, once its draft (still running on the device when the step returns) has finished.

    On a GPU the marks are timing events recorded on the stream that was current at `start`. Two banks of
    events, made once and used by alternate steps: creating an event and looking up the current stream at every
    mark cost host time in the window where the device waits for the step's inputs.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._banks: tuple[list, list] = ([], [])  # the GPU's events, each grown to the most marks a step made
        self._bank = 0
        self._names: list[str] = []
        self._stamps: list = []
        self._stream = None

    def _now(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        events, i = self._banks[self._bank], len(self._stamps)
        if i == len(events):
            events.append(torch.cuda.Event(enable_timing=True))
        events[i].record(self._stream)
        return events[i]

    def start(self, name: str) -> None:
        if self.cuda:
            self._stream = torch.cuda.current_stream()
        self._bank ^= 1
        self._names, self._stamps = [], []
        self.mark(name)

    def mark(self, name: str) -> None:
        self._stamps.append(self._now())
        self._names.append(name)

    def stamps(self) -> PhaseStamps:
        """The current step's marks so far."""
        return PhaseStamps(self._names, self._stamps, self.cuda)

    def elapsed_ms(self) -> dict[str, float]:
        """Per-phase milliseconds of the current step (see PhaseStamps.elapsed_ms)."""
        return self.stamps().elapsed_ms()
