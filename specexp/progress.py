"""Progress of a run on the console: a bar on a terminal, plain periodic lines in a log, or nothing.

The engine and the backends report `ProgressEvent`s (`specexp.engine.progress`) to a callback they are given;
`console_progress()` makes that callback. Two phases are shown:

- CUDA-graph capture (native backend on a GPU): graphs captured / total;
- the run: requests done / total, output tokens and tokens/s, elapsed time and an ETA (from the rate at
  which requests finish). The native backend reports as requests finish (and at least every 0.5 s while
  tokens are emitted); hf after each request (it serves one at a time); vllm at the start and the end.

Switch: the environment variable ``SPECEXP_PROGRESS``

    auto   (default) a bar when stderr is a terminal, plain lines otherwise (logs, redirected output)
    bar    always a bar (tqdm), on stderr
    lines  plain lines on stderr: when a phase starts, every ``SPECEXP_PROGRESS_INTERVAL_S`` seconds
           (default 10) while it runs, and when it ends
    off    nothing (``0``, ``false`` and ``no`` mean off too)

e.g. ``SPECEXP_PROGRESS=off python -m specexp run +exp=quickstart``. It is independent of ``tracking`` (W&B)
and not part of the run's config: it changes what the console shows, never a result. Sweeps' jobs inherit it.
A line reads:

    specexp: run 120/895 requests (13%), 15234 output tokens, 512.3 tokens/s, elapsed 0:00:30, ETA 0:03:20
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TextIO

from specexp.engine.progress import CAPTURE, ProgressCallback, ProgressEvent
from specexp.errors import ConfigError

MODE_ENV, INTERVAL_ENV = "SPECEXP_PROGRESS", "SPECEXP_PROGRESS_INTERVAL_S"
MODES = ("auto", "bar", "lines", "off")
OFF_ALIASES = ("0", "false", "no")
DEFAULT_INTERVAL_S = 10.0


def progress_mode(environ: Mapping[str, str] | None = None) -> str:
    """The display mode `SPECEXP_PROGRESS` asks for (one of MODES); ConfigError on any other value."""
    environ = os.environ if environ is None else environ
    value = environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value in OFF_ALIASES:
        return "off"
    if value not in MODES:
        raise ConfigError(f"{MODE_ENV}={environ[MODE_ENV]!r} is not valid: use one of {', '.join(MODES)}")
    return value


def progress_interval_s(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between two plain lines of one phase (`SPECEXP_PROGRESS_INTERVAL_S`, default 10)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(INTERVAL_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ConfigError(f"{INTERVAL_ENV}={raw!r} is not valid: use a number of seconds >= 0")
    return value


def _clock(seconds: float) -> str:
    """H:MM:SS."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def format_line(event: ProgressEvent) -> str:
    """One plain progress line for `event` (the module docstring shows one)."""
    share = f" ({100 * event.done // event.total}%)" if event.total else ""
    eta = "?"
    if event.done >= event.total:
        eta = _clock(0)
    elif event.done > 0:
        eta = _clock(event.elapsed_s * (event.total - event.done) / event.done)
    if event.phase == CAPTURE:
        return (f"specexp: {event.activity} {event.done}/{event.total} graphs{share}, "
                f"elapsed {_clock(event.elapsed_s)}, ETA {eta}")
    rate = event.output_tokens / event.elapsed_s if event.elapsed_s > 0 else 0.0
    return (f"specexp: run {event.done}/{event.total} requests{share}, {event.output_tokens} output tokens, "
            f"{rate:.1f} tokens/s, elapsed {_clock(event.elapsed_s)}, ETA {eta}")


class ProgressDisplay:
    """A `ProgressCallback` that draws each phase as a tqdm bar (mode "bar") or as plain lines (mode "lines")
    on `stream`. A phase starts at its first event (a new phase, a smaller `done` or another `total` than the
    last event's) and ends at done == total; `close()` ends one left open (a run that failed)."""

    def __init__(self, mode: str, stream: TextIO, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if mode not in ("bar", "lines"):
            raise ValueError(f"a progress display draws 'bar' or 'lines', not {mode!r}")
        self.mode, self.stream, self.interval_s = mode, stream, interval_s
        self._last: ProgressEvent | None = None  # the open phase's last event (None: no phase open)
        self._bar = None
        self._next_line_s = 0.0

    def __call__(self, event: ProgressEvent) -> None:
        last = self._last
        if last is None or event.phase != last.phase or event.done < last.done or event.total != last.total:
            self.close()
            self._open(event)
        self._last = event
        if self.mode == "bar":
            self._draw_bar(event)
        elif event.done >= event.total or event.elapsed_s >= self._next_line_s:
            self._print_line(event)
        if event.done >= event.total:
            self.close()

    def close(self) -> None:
        """End the open phase, if any (closes its bar)."""
        if self._bar is not None:
            self._bar.close()
        self._bar, self._last = None, None

    def _open(self, event: ProgressEvent) -> None:
        self._next_line_s = 0.0  # a phase's first event always prints
        if self.mode == "bar":
            from tqdm import tqdm

            capture = event.phase == CAPTURE
            self._bar = tqdm(total=event.total, desc=event.activity if capture else "requests",
                             unit="graph" if capture else "req", file=self.stream, leave=not capture,
                             dynamic_ncols=True, mininterval=0.5)

    def _draw_bar(self, event: ProgressEvent) -> None:
        bar = self._bar
        if event.phase == CAPTURE:
            bar.set_postfix_str(event.label, refresh=False)
        elif event.elapsed_s > 0:
            bar.set_postfix_str(f"{event.output_tokens} tok, {event.output_tokens / event.elapsed_s:.1f} tok/s",
                                refresh=False)
        bar.update(event.done - bar.n)

    def _print_line(self, event: ProgressEvent) -> None:
        print(format_line(event), file=self.stream, flush=True)
        self._next_line_s = event.elapsed_s + self.interval_s


@contextlib.contextmanager
def console_progress(environ: Mapping[str, str] | None = None,
                     stream: TextIO | None = None) -> Iterator[ProgressCallback | None]:
    """The progress callback `SPECEXP_PROGRESS` asks for, drawing on `stream` (default stderr); None when off.
    Whatever phase is still open when the block ends (a failed run) is closed. ConfigError on a bad setting."""
    mode = progress_mode(environ)
    interval_s = progress_interval_s(environ)
    stream = sys.stderr if stream is None else stream
    if mode == "auto":
        mode = "bar" if getattr(stream, "isatty", lambda: False)() else "lines"
    if mode == "off":
        yield None
        return
    display = ProgressDisplay(mode, stream, interval_s)
    try:
        yield display
    finally:
        display.close()
