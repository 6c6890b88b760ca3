"""One native engine for a group of sweep points, in one process (`sweep.reuse_engine`, :mod:`specexp.sweep_groups`).

The group's process activates a :class:`ServerPool` of every point's RunSpec before it runs the points one after
another (each through :func:`specexp.experiment.execute`, with its own directory, record and W&B run). The first
point to open a server builds the one engine, at the group's largest k and max_model_len with every point's static
k captured (:class:`specexp.backends.native.NativeServer` ``serve=``); each later point borrows it, retargeted to its
own k, synthetic acceptance, seed and limits, counters reset (:meth:`NativeServer.retarget`). A borrowed server's
``close`` keeps the engine; the pool closes it when the group ends. A point whose build fails records its error;
the next point tries the build again.
"""

from __future__ import annotations

import contextlib

from specexp.backends.server import BackendServer

POOL: ServerPool | None = None  # the active pool of this process (a group's), else None


class BorrowedServer(BackendServer):
    """A pool's server lent to one sweep point: everything but ``close`` goes to the engine's server."""

    def __init__(self, server) -> None:
        self.server = server

    def warm_up(self, prompts, max_new_tokens=None) -> None:
        self.server.warm_up(prompts, max_new_tokens)

    def serve(self, prompts, progress=None):
        return self.server.serve(prompts, progress)

    def close(self) -> None:
        """The engine stays for the group's next point."""


class ServerPool:
    """The group's points (their RunSpecs, in run order) and, once built, the one server they share."""

    def __init__(self, specs: list) -> None:
        self.specs = specs
        self.server = None

    def open(self, spec, progress=None) -> BorrowedServer:
        """The shared server retargeted to `spec` (built now, for every point, if no point has built it yet)."""
        from specexp.backends.native import NativeServer

        if self.server is None:
            self.server = NativeServer(spec, progress, serve=self.specs)
        else:
            self.server.retarget(spec)
        return BorrowedServer(self.server)

    def close(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.close()
            self.server = None


@contextlib.contextmanager
def pooled(specs: list):
    """Make `specs`' pool the process's for the block (native servers opened inside come from it)."""
    global POOL
    POOL = ServerPool(specs)
    try:
        yield POOL
    finally:
        POOL.close()
        POOL = None
