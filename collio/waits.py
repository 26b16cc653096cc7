"""How a rank waits for its peers when the wait may last: yield the core, then sleep.

MPI's own waits poll, keeping a core busy.  With more ranks than cores, or an I/O
thread, or a server on the node, a rank done early must leave the core to the work
still running; these waits do, at the cost of waking a little later.
"""

from __future__ import annotations

import os
import time

from mpi4py import MPI

__all__ = ["WAIT_CAP", "WAIT_FIRST", "WAIT_YIELD", "quiet_barrier", "sleep_until_done"]

#: How long :func:`sleep_until_done` tests yielding the core between tests (seconds):
#: peers that arrive within it (every agreement of a small call) are met without a sleep,
#: whose wake-up would delay every step of a nonblocking allreduce.
WAIT_YIELD = 1e-3
#: Its first sleep, doubled after each test ...
WAIT_FIRST = 1e-5
#: ... up to this one: longer sleeps leave a finished wait unnoticed for too long.
WAIT_CAP = 2e-4
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def sleep_until_done(req: MPI.Request | list[MPI.Request], *, cap: float = WAIT_CAP) -> None:
    """Complete a request (or all of a list): test, yielding the core between tests, for
    up to :data:`WAIT_YIELD`, then with growing sleeps (10 us to ``cap``, 200 us).

    For waits that may last: a rank done early must not keep a core that another
    rank's I/O, its I/O thread, or a server on the node needs.  Yielding gives the core
    to whatever else is runnable on it and catches peers that arrive within a
    millisecond (every agreement of a small call); sleeping leaves it idle, so the
    scheduler can move waiting work onto it.
    """
    if isinstance(req, list):
        reqs = req

        def test() -> bool:
            return bool(MPI.Request.Testall(reqs))
    else:
        test = req.Test
    end = time.perf_counter() + WAIT_YIELD
    while not test():
        if time.perf_counter() >= end:
            break
        _yield()
    else:
        return
    delay = WAIT_FIRST
    while not test():
        time.sleep(delay)
        delay = min(2 * delay, cap)


def quiet_barrier(comm: MPI.Comm, *, cap: float = WAIT_CAP) -> None:
    """Collective over `comm`: a barrier that sleeps while it waits (its sleeps up to
    ``cap``, as :func:`sleep_until_done`'s).

    For where one rank works (talks to a server, runs a baseline) while the others
    wait: MPI's blocking calls keep a core busy polling, a core that the working
    rank, or a server on the same node, needs.
    """
    sleep_until_done(comm.Ibarrier(), cap=cap)
