"""One native engine for a group of sweep points, in one process (`sweep.reuse_engine`, :mod:`specexp.sweep_groups`).

The group's process activates a :class:`ServerPool` of every point's RunSpec before it runs the points one after
another (each through :func:`specexp.experiment.execute`, with its own directory, record and W&B run). The first
point to open a server builds the one engine, at the group's largest k and max_model_len with every point's static
k captured (:class:`specexp.backends.native.NativeServer` ``serve=``); each later point borrows it, retargeted to its
own k, synthetic acceptance, seed and limits, counters reset (:meth:`NativeServer.retarget`). When the points
measure in rounds (:mod:`specexp.group_rounds`), a point's repeats alternate with the others': before each of its
passes the server is switched back to it (:meth:`ServerPool.activate`) with its counters, random state and
start-up clock as it left them, so each point's figures are those it would have had alone. A borrowed server's
``close`` keeps the engine; the pool closes it when the group ends. A point whose build fails records its error;
the next point tries the build again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from specexp.backends.server import BackendServer

POOL: ServerPool | None = None  # the active pool of this process (a group's), else None


class BorrowedServer(BackendServer):
    """A pool's server lent to one sweep point: everything but ``close`` goes to the engine's server, switched
    back to this point first when another point used it in between (:meth:`ServerPool.activate`)."""

    def __init__(self, pool: ServerPool) -> None:
        self.pool = pool
        self.saved: dict | None = None  # this point's state while another point is served

    @property
    def server(self):
        return self.pool.server

    def warm_up(self, prompts, max_new_tokens=None) -> None:
        def warm_up_here() -> None:
            self.pool.activate(self)
            self.server.warm_up(prompts, max_new_tokens)

        self.pool.run_on_engine_thread(warm_up_here)

    def serve(self, prompts, progress=None):
        def serve_here():
            self.pool.activate(self)
            return self.server.serve(prompts, progress)

        return self.pool.run_on_engine_thread(serve_here)

    def close(self) -> None:
        """The engine stays for the group's next point."""


class ServerPool:
    """The group's points (their RunSpecs, in run order) and, once built, the one server they share; ``active``:
    the borrower the server is set up for."""

    def __init__(self, specs: list, run_on_engine_thread: Callable[[Callable], object] | None = None) -> None:
        """run_on_engine_thread(fn): runs fn() on the thread that does all of the engine's work and returns its
        result (a group measuring in rounds: the process's main thread, `GroupPace.call`); None: here."""
        self.specs = specs
        self.server = None
        self.active: BorrowedServer | None = None
        self.run_on_engine_thread = run_on_engine_thread or (lambda fn: fn())

    def open(self, spec, progress=None) -> BorrowedServer:
        """The shared server retargeted to `spec` (built now, for every point, if no point has built it yet)."""
        return self.run_on_engine_thread(lambda: self._open(spec, progress))

    def _open(self, spec, progress=None) -> BorrowedServer:
        from specexp.backends.native import NativeServer

        self._set_aside_active()
        if self.server is None:
            self.server = NativeServer(spec, progress, serve=self.specs)
        else:
            self.server.retarget(spec)
        self.active = BorrowedServer(self)
        return self.active

    def activate(self, borrower: BorrowedServer) -> None:
        """Set the server up for `borrower` again if another point used it since (a sweep measuring in rounds):
        the other point's state is saved, this one's put back."""
        if borrower is self.active:
            return
        self._set_aside_active()
        self.server.resume(borrower.saved)
        borrower.saved, self.active = None, borrower

    def _set_aside_active(self) -> None:
        """Save the state of the point the server is set up for (if any) in its borrower."""
        if self.active is not None:
            self.active.saved = self.server.suspend()

    def close(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.close()
            self.server = None
        self.active = None


@contextlib.contextmanager
def pooled(specs: list, run_on_engine_thread: Callable[[Callable], object] | None = None):
    """Make `specs`' pool the process's for the block (native servers opened inside come from it)."""
    global POOL
    POOL = ServerPool(specs, run_on_engine_thread)
    try:
        yield POOL
    finally:
        POOL.close()
        POOL = None
