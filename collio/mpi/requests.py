"""Requests of nonblocking calls, and the thread that runs a file's nonblocking collectives.

MPI requires ``MPI_File_iwrite_all`` and the other nonblocking collectives to be local:
a rank may start one, then send a message that another rank needs before that rank
starts its own.  Run at once, the call would wait for that rank, and never get the
message.  So each file has a :class:`Worker`, one thread that runs the file's
nonblocking and split collective calls in the order they were made (MPI matches them in
that order), on the file's own communicator (mpi4py initialises MPI with
``MPI_THREAD_MULTIPLE``).  A blocking collective call on the file first waits for the
worker to finish what it was given, so the file's collectives still run one at a time,
in the order every rank made them.  Independent nonblocking calls are done at once:
they need no other rank; so are collective ones when MPI was initialised below
``MPI_THREAD_MULTIPLE`` (a program that needs them local then waits, as it would on an
MPI that makes progress only inside ``Wait``).

A :class:`Request` is an MPI generalized request (``MPI.Grequest``), so ``Wait``,
``Test``, ``MPI.Request.Waitall`` and the other completion calls take it like any other
request.  Its own ``Wait`` and ``Test`` raise the call's error (a
:class:`~collio.mpi.errors.FileError`, agreed for collective calls) through the file's
error handler; completed by ``MPI.Request.Waitall`` and friends, a failed call raises
MPI's ``MPI.Exception`` with its class.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Literal

from mpi4py import MPI

from .errors import FileError

__all__ = ["Outcome", "Request", "Worker", "completed"]


class Outcome:
    """What one call did: set by whichever thread runs it, read by :class:`Request`."""

    __slots__ = ("done", "nbytes", "error", "reported", "greq", "raiser")

    def __init__(self, raiser: Callable[[FileError], None]) -> None:
        self.done = threading.Event()
        self.nbytes = 0
        self.error: FileError | None = None
        self.reported = False  # the error was raised by Request.Wait / Test
        self.greq: MPI.Grequest | None = None
        self.raiser = raiser  # the file's error handler

    def finish(self, nbytes: int, error: FileError | None) -> None:
        """The call is over (any thread): complete the MPI request, then wake its waiters."""
        self.nbytes, self.error = nbytes, error
        assert self.greq is not None
        self.greq.Complete()
        self.done.set()

    def query(self, status: MPI.Status) -> None:
        """MPI's query function: the bytes moved, or the error for MPI's own completion calls."""
        status.Set_elements(MPI.BYTE, self.nbytes)
        if self.error is not None and not self.reported:
            self.reported = True
            raise self.error  # (mpi4py prints it, and MPI's Waitall then raises its class)


class Request(MPI.Grequest):  # type: ignore[misc]
    """The request of a :mod:`collio.mpi` nonblocking call; an ``MPI.Request``."""

    _outcome: Outcome

    @classmethod
    def start(cls, outcome: Outcome) -> Request:
        """A new request for ``outcome``'s call (the call completes it)."""
        greq = MPI.Grequest.Start(outcome.query, None, None)
        outcome.greq = greq
        req = cls(greq)  # (the same MPI handle, with this class's Wait and Test)
        req._outcome = outcome
        return req

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        """Wait (sleeping, not polling MPI) for the call; raise its error, if any."""
        out = getattr(self, "_outcome", None)
        if out is None:
            return super().Wait(status)  # type: ignore[no-any-return]
        out.done.wait()
        self._report(out)
        super().Wait(status)
        if out.error is not None:
            out.raiser(out.error)
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        """Whether the call is complete (then as :meth:`Wait`)."""
        out = getattr(self, "_outcome", None)
        if out is None:
            return bool(super().Test(status))
        if not out.done.is_set():
            return False
        self.Wait(status)
        return True

    def _report(self, out: Outcome) -> None:
        first = not out.reported
        out.reported = True
        if not first:
            out.error = None  # (raised once, as an MPI request's error is returned once)


def completed(raiser: Callable[[FileError], None], nbytes: int, error: FileError | None) -> Request:
    """The request of a call already done (an independent nonblocking call)."""
    out = Outcome(raiser)
    req = Request.start(out)
    out.finish(nbytes, error)
    return req


class Worker:
    """A thread running a file's nonblocking collective calls in the order they came."""

    __slots__ = ("_queue", "_thread", "_last", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last: Outcome | None = None

    def submit(self, run: Callable[[], int], outcome: Outcome, convert: Any) -> None:
        """Local: run ``run`` (returning the bytes moved) after the calls submitted
        before; its error, through ``convert``, goes to ``outcome``."""

        def task() -> None:
            nbytes, error = 0, None
            try:
                nbytes = run()
            except BaseException as exc:  # (reported by the request, on the caller's thread)
                error = convert(exc)
            outcome.finish(nbytes, error)

        self._last = outcome
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:  # (no thread may call MPI: run it now)
            task()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put(task)

    def _loop(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            task()

    def drain(self) -> None:
        """Local: wait (sleeping) until every call submitted so far has run."""
        if self._last is not None:
            self._last.done.wait()

    def stop(self) -> None:
        """Local: end the thread once it has run what it was given."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
