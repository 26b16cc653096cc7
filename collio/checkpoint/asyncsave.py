"""``async_save``: capture the state, then write it from a background thread.

The background save makes its collective calls on a duplicate of the user's
communicator, made once and kept: MPI orders collectives per communicator, so the
user's own collectives on theirs, meanwhile, cannot meet the save's, and collio's
one-thread-per-communicator guard sees two different communicators.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from mpi4py import MPI

from .save import Plan, prepare, write
from .state import Entry

__all__ = ["SaveHandle", "async_save"]

_lock = threading.Lock()
_dups: dict[int, MPI.Intracomm] = {}
_running: dict[int, SaveHandle] = {}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


class SaveHandle:
    """A save running in the background.  ``staged`` is the bytes this rank copied."""

    def __init__(self, future: concurrent.futures.Future[None], staged: int) -> None:
        self._future = future
        self.staged = staged

    def done(self) -> bool:
        """Local, never blocks: whether :meth:`wait` would return at once."""
        return self._future.done()

    def wait(self) -> None:
        """Collective over the save's ranks: return once the checkpoint is durable and
        committed; raise the save's error, the same on every rank (it was agreed there)."""
        self._future.result()


def _background(comm: MPI.Intracomm) -> MPI.Intracomm:
    """Collective the first time per communicator: the duplicate the thread saves on."""
    key = comm.py2f()
    with _lock:
        dup = _dups.get(key)
    if dup is None:
        dup = comm.Dup()
        with _lock:
            _dups[key] = dup
    return dup


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="collio-ckpt")
        return _pool


def _stage(plan: Plan) -> int:
    """Copy this rank's pieces (the caller may change its arrays as soon as we return);
    the bytes copied: this rank's state once, no more (replicated entries other ranks
    write are not copied)."""
    total = 0
    for k, e in enumerate(plan.entries):
        if e.layout.nbytes == 0:
            continue
        copy = np.copy(e.data, order="F" if e.layout.order == "F" else "C")
        plan.entries[k] = Entry(e.name, copy, e.layout, e.replicated, e.scalar)
        total += copy.nbytes
    return total


def async_save(
    target: Any,
    state: Mapping[str, Any],
    *,
    comm: MPI.Intracomm | None = None,
    hints: Any = None,
    metadata: Mapping[str, Any] | None = None,
    **options: Any,
) -> SaveHandle:
    """Collective over `comm`: :func:`save`, returning once the state is copied.

    The entries are checked on every rank alike before this returns (the same errors
    as :func:`save`); the writing, checksums and commit run in a background thread.
    A second ``async_save`` on the same communicator first waits for the one running
    (its error stays with its handle's :meth:`~SaveHandle.wait`).
    """
    base = MPI.COMM_WORLD if comm is None else comm
    key = base.py2f()
    with _lock:
        previous = _running.get(key)
    if previous is not None:
        concurrent.futures.wait([previous._future])
    dup = _background(base)
    plan = prepare(base, state, metadata)
    staged = _stage(plan)
    future = _executor().submit(write, dup, target, plan, hints, dict(options))
    handle = SaveHandle(future, staged)
    with _lock:
        _running[key] = handle
    return handle
