"""A group of sweep jobs that share one engine (:mod:`specexp.sweep_groups`) measuring their repeats in rounds
with the rest of the sweep (:mod:`specexp.sweep_rounds`): the group's side, in its one process.

Each job runs :func:`specexp.experiment.execute` in a thread of its own, on the group's server pool
(:mod:`specexp.backends.reuse`), paced by a :class:`MemberPace`. Only one job's thread ever runs at a time:
the jobs start one after another (a job starts once the one before has built or borrowed the engine, warmed up
and reported ``repeat 0``, or has ended), and afterwards a job runs only between a ``go`` from the sweep and its
next report. Its server is switched back to it before each pass (:meth:`ServerPool.activate`), so its figures
are those it would have had alone.

Everything that touches the engine (building it, warming up, serving a pass) runs on the process's main thread,
handed over by the job's thread (:meth:`GroupPace.call`), as in a job's own process: on the CPU, torch's OpenMP
threads serve the one thread that starts parallel work. With two such threads in one process (each with its own
OpenMP team) a 2-core machine ran the demo pair's steps about 2.4x slower.

On the pipe to the sweep every line names its job by its index in the group: the group reports ``<i> repeat
<r>``, ``<i> finish`` (as a lone job's process reports ``repeat <r>`` and ``finish``) and ``<i> ended`` when job
i's thread is done (its record written); the sweep sends ``go <i> [slot]``. An interruption of the process
(SIGINT/SIGTERM, delivered to its main thread) makes every waiting job raise
:class:`specexp.interrupts.RunInterrupted` from its pace, so each records itself ``interrupted``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable

from specexp import interrupts

GO, ENDED = "go", "ended"

log = logging.getLogger(__name__)


class MemberPace:
    """One job's pace (:class:`specexp.measure.loop.Pace`) inside the group."""

    def __init__(self, group: GroupPace, index: int) -> None:
        self.group, self.index = group, index
        self.inbox: queue.Queue = queue.Queue()  # ("go", slot) or ("stop", signum)

    def wait(self, label: str) -> int | None:
        """Report ``label`` and block until the sweep says go; returns the slot."""
        self.group.report(self.index, label)
        kind, value = self.inbox.get()
        if kind == "stop":
            raise interrupts.RunInterrupted(value)
        self.group.on_resume(self.index)
        return value


class GroupPace:
    """The group's end of the pipe pair and its jobs' paces. ``on_resume(i)`` runs in job i's thread before
    it goes on (the group points its log at job i's directory)."""

    def __init__(self, read_fd: int, write_fd: int, num_jobs: int, on_resume: Callable[[int], None]) -> None:
        self._in = os.fdopen(read_fd, "r")
        self._out = os.fdopen(write_fd, "w")
        self.members = [MemberPace(self, i) for i in range(num_jobs)]
        self.on_resume = on_resume
        self._events: queue.Queue = queue.Queue()  # from the running job: ("call", fn, reply) or ("yield",)
        self.stopped_by: int | None = None  # the signal that stopped the group (its main thread serves no more)

    def report(self, index: int, label: str) -> None:
        try:
            self._out.write(f"{index} {label}\n")
            self._out.flush()
        except (BrokenPipeError, OSError):  # the sweep went away; the job's record is what counts
            pass
        self._events.put(("yield",))

    def call(self, fn: Callable[[], object]) -> object:
        """fn() run on the main thread (see the module docstring), from the running job's thread; its result, or
        its exception raised here."""
        if threading.current_thread() is threading.main_thread():
            return fn()
        if self.stopped_by is not None:
            raise interrupts.RunInterrupted(self.stopped_by)
        reply: queue.Queue = queue.Queue(maxsize=1)
        self._events.put(("call", fn, reply))
        while True:
            try:
                ok, value = reply.get(timeout=0.2)
                break
            except queue.Empty:
                if self.stopped_by is not None:  # the main thread stopped before it took the call
                    raise interrupts.RunInterrupted(self.stopped_by) from None
        if ok:
            return value
        raise value

    def wait_for_yield(self) -> None:
        """Run the running job's calls on this (main) thread until it reports or ends. A signal still interrupts
        the wait; one that arrives inside a call is handed to the job as well (it records itself)."""
        while True:
            try:
                event = self._events.get(timeout=0.2)
            except queue.Empty:
                continue
            if event[0] == "yield":
                return
            _, fn, reply = event
            try:
                result = fn()
            except BaseException as e:  # the job gets it; an interruption stops the group too
                reply.put((False, e))
                if isinstance(e, KeyboardInterrupt):
                    raise
            else:
                reply.put((True, result))

    def next_go(self) -> tuple[int, int | None] | None:
        """The sweep's next ``go <i> [slot]``; None when the sweep closed the pipe."""
        line = self._in.readline()
        if not line:
            return None
        parts = line.split()
        if len(parts) < 2 or parts[0] != GO:
            raise RuntimeError(f"the sweep sent {line.strip()!r}: expected 'go <job> [slot]'")
        return int(parts[1]), int(parts[2]) if len(parts) > 2 else None

    def stop_all(self, signum: int) -> None:
        """Every job waiting in its pace, or for a call, raises RunInterrupted(signum)."""
        self.stopped_by = int(signum)
        for member in self.members:
            member.inbox.put(("stop", signum))


def run_group_in_rounds(num_jobs: int, run_job: Callable[[int, MemberPace], None], group: GroupPace) -> None:
    """Run the group's jobs (``run_job(i, pace)`` runs job i and records it) as the sweep paces them; returns
    when every job's thread is done. Call in the process's main thread."""
    threads: list[threading.Thread] = []
    alive: set[int] = set()

    def member(index: int) -> None:
        try:
            run_job(index, group.members[index])
        except BaseException as e:  # noqa: BLE001 - the job recorded itself; its thread just ends
            log.info("job %d of the group stopped: %s", index, type(e).__name__)
        finally:
            alive.discard(index)
            group.report(index, ENDED)

    try:
        for index in range(num_jobs):  # one after another: each builds or borrows the engine and warms up
            alive.add(index)
            thread = threading.Thread(target=member, args=(index,), name=f"sweep-job-{index}", daemon=True)
            threads.append(thread)
            thread.start()
            group.wait_for_yield()
        while alive:
            go = group.next_go()
            if go is None:  # the sweep went away: stop every job still waiting
                group.stop_all(interrupts.received() or signal.SIGTERM)
                break
            index, slot = go
            if index not in alive:
                continue
            group.members[index].inbox.put((GO, slot))
            group.wait_for_yield()
    except BaseException as e:  # an interruption, or a sweep gone wrong: no job may wait forever
        group.stop_all(e.signum if isinstance(e, interrupts.RunInterrupted) else signal.SIGTERM)
        raise
    finally:
        deadline = time.monotonic() + 10  # a job mid-pass gets this long to reach its pace and record itself
        for thread in threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0.01))
