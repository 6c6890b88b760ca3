"""SIGINT and SIGTERM, handled alike in a run, a sweep and each sweep job's process.

The first SIGINT or SIGTERM raises :class:`RunInterrupted` (a ``KeyboardInterrupt``, so every
``except KeyboardInterrupt`` also sees SIGTERM) in the main thread; later ones are absorbed, so the code
that records the interruption is not itself interrupted. Inside :func:`deferred` (e.g. while a finished
run's record is written) the first signal waits until the block ends. The process then exits with
:func:`exit_status` (128 + the signal number: 130 for SIGINT, 143 for SIGTERM), as shells report a death
by that signal.

A child process started inside :func:`signals_blocked` begins life with both signals blocked (the mask is
inherited through ``exec``), so a signal sent while it is still starting waits, pending, until the child has
installed these handlers and called :func:`unblock`; nothing is lost and no traceback is printed.
"""

from __future__ import annotations

import contextlib
import signal
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """Raised by the handler of SIGINT/SIGTERM; ``signum`` is the signal received."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return exit_status(self.signum)


class _State:
    received: int | None = None  # the first signal received
    deferring: int = 0  # depth of deferred() blocks
    pending: bool = False  # a signal arrived inside deferred() and has not been raised yet
    installed: bool = False


_state = _State()


def exit_status(signum: int) -> int:
    """The exit status of a process stopped by signal ``signum``: 128 + signum (SIGINT 130, SIGTERM 143)."""
    return 128 + int(signum)


def received() -> int | None:
    """The first SIGINT/SIGTERM this process received since :func:`install`, None if none."""
    return _state.received


def _handler(signum, frame) -> None:
    if _state.received is not None:
        return  # already stopping: the first signal is being handled
    _state.received = signum
    if _state.deferring:
        _state.pending = True
        return
    raise RunInterrupted(signum)


def install() -> None:
    """Route SIGINT and SIGTERM of this process to :class:`RunInterrupted` (main thread only; elsewhere a
    no-op). Resets what :func:`received` reports."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state.received, _state.pending, _state.deferring = None, False, 0
    for signum in HANDLED:
        signal.signal(signum, _handler)
    _state.installed = True


def uninstall() -> None:
    """Restore the default handlers (Python's KeyboardInterrupt for SIGINT, termination for SIGTERM)."""
    if threading.current_thread() is not threading.main_thread() or not _state.installed:
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _state.installed = False


def unblock() -> None:
    """Unblock SIGINT/SIGTERM in this thread; a signal that waited while they were blocked is delivered now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)


@contextlib.contextmanager
def signals_blocked():
    """Block SIGINT/SIGTERM in this thread for the block (start a child process inside it: the child inherits
    the blocked mask). A signal arriving meanwhile is delivered when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def deferred():
    """Within the block the first SIGINT/SIGTERM is held back; it is raised as :class:`RunInterrupted` when the
    outermost block ends."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and _state.pending:
            _state.pending = False
            raise RunInterrupted(_state.received)


@contextlib.contextmanager
def interruptible():
    """Inside :func:`deferred` blocks, a block where SIGINT/SIGTERM raise at once again (one held back already is
    raised on entry): code that waits long inside code that must not be cut at an arbitrary point, e.g. a sweep
    job's run inside Hydra's job loop, whose config handling a signal would leave half done."""
    saved, _state.deferring = _state.deferring, 0
    try:
        if _state.pending:
            _state.pending = False
            raise RunInterrupted(_state.received)
        yield
    finally:
        _state.deferring = saved
