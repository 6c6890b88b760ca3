"""Progress of the engine's two long phases, handed to a callback the caller supplies.

The engine draws nothing: it calls `progress(ProgressEvent)` and the app layer (`specexp.progress`) decides
how to show it (a bar on a terminal, periodic lines in a log, nothing).

- CAPTURE: CUDA graphs captured at start-up (on a CPU: step graphs compiled). One event before the first graph
  (done 0), then one per graph; `label` names the graph just captured ("target_verify size 4 keys 256"),
  `activity` says what capturing is ("capturing CUDA graphs", "compiling CPU step graphs").
- RUN: requests served by one `generate` call. One event at the start (done 0), one whenever a request
  finishes, one at most every `RUN_EVENT_INTERVAL_S` while tokens are emitted, and a last one with
  done == total. `done` never decreases; `output_tokens` counts the tokens emitted so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

CAPTURE, RUN = "capture", "run"
CAPTURING, COMPILING = "capturing CUDA graphs", "compiling CPU step graphs"  # what a CAPTURE phase does
# Between two RUN events when no request finishes (the host's cost: one clock read per step).
RUN_EVENT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class ProgressEvent:
    """Where a phase stands. phase: CAPTURE (done/total graphs) or RUN (done/total requests); elapsed_s:
    seconds since the phase began; output_tokens: tokens emitted so far (RUN); label: the graph just
    captured (CAPTURE); activity: what a CAPTURE phase does."""

    phase: str
    done: int
    total: int
    elapsed_s: float
    output_tokens: int = 0
    label: str = ""
    activity: str = CAPTURING


ProgressCallback = Callable[[ProgressEvent], None]


def capture_reporter(progress: ProgressCallback | None, total: int, activity: str = CAPTURING
                     ) -> Callable[[str], None] | None:
    """A per-graph callback (`CudaGraphManager.capture`'s `progress(label)`) that reports CAPTURE events of
    `total` graphs, doing `activity`, to `progress`; sends the done-0 event now. None when progress is None."""
    if progress is None:
        return None
    start = time.perf_counter()
    done = 0
    progress(ProgressEvent(CAPTURE, 0, total, 0.0, activity=activity))

    def graph_captured(label: str) -> None:
        nonlocal done
        done += 1
        progress(ProgressEvent(CAPTURE, done, total, time.perf_counter() - start, label=label, activity=activity))

    return graph_captured


class RunReporter:
    """Sends RUN events of one `generate` call of `total` requests to `progress`, throttled as the module
    docstring says. t0: the run's start (perf_counter seconds)."""

    def __init__(self, progress: ProgressCallback, total: int, t0: float,
                 interval_s: float = RUN_EVENT_INTERVAL_S) -> None:
        self.progress, self.total, self.t0, self.interval_s = progress, total, t0, interval_s
        self.last: tuple[int, int] | None = None  # (done, output_tokens) of the last event sent
        self.next_s = t0

    def update(self, done: int, output_tokens: int, now: float | None = None) -> None:
        """Report `done` finished requests and `output_tokens` emitted, if a request finished since the last
        event or `interval_s` has passed with new tokens."""
        now = time.perf_counter() if now is None else now
        last = self.last
        if last is not None and (done == last[0] and (now < self.next_s or output_tokens == last[1])):
            return
        self._send(done, output_tokens, now)

    def finish(self, output_tokens: int) -> None:
        """The last event: every request done (sent unless the last event already said so)."""
        if self.last != (self.total, output_tokens):
            self._send(self.total, output_tokens, time.perf_counter())

    def _send(self, done: int, output_tokens: int, now: float) -> None:
        self.last, self.next_s = (done, output_tokens), now + self.interval_s
        self.progress(ProgressEvent(RUN, done, self.total, now - self.t0, output_tokens))
