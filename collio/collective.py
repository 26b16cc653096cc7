"""Agreement on errors: no rank raises alone inside a collective call.

The pattern (habit 5 of the house style): run the local step inside
:class:`Attempt`, then call :func:`agree`.  ``agree`` is an allreduce of one flag
(cheap, O(log p)); only when some rank failed are the messages gathered, and then
every rank raises the same :class:`~collio.errors.CollioError` subclass naming
the failing ranks.  Because every rank makes the same sequence of collective
calls whatever happened locally, nothing hangs and the communicator stays usable.
"""

from __future__ import annotations

import hashlib
import time
import types
from typing import Any

import numpy as np
from mpi4py import MPI

from .errors import classify, make_error

__all__ = [
    "Attempt",
    "agree",
    "agree_same",
    "any_flag",
    "bcast_outcome",
    "digest",
    "quiet_barrier",
    "raise_agreed",
    "sleep_until_done",
]


class Attempt:
    """Context manager that records (instead of raising) an exception on this rank.

    >>> with Attempt() as step:
    ...     risky()
    >>> agree(comm, step.error)
    """

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __enter__(self) -> Attempt:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return False
        if self.error is None:
            self.error = exc
        return True

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` unless an earlier error is already recorded."""
        if self.error is None:
            self.error = exc


def agree(comm: MPI.Comm, error: BaseException | None, *, what: str = "") -> None:
    """Collective over `comm`: raise the same error on every rank if any rank failed.

    Parameters
    ----------
    comm
        The communicator all ranks of the call share.
    error
        This rank's exception, or None.
    what
        A short phrase naming the step, put in front of the message.
    """
    failed = comm.allreduce(1 if error is not None else 0, op=MPI.SUM)
    if failed:
        raise_agreed(comm, error, what=what)


_NONE = np.int64(-(2**62))


def digest(value: Any) -> int:
    """A 56-bit hash of ``repr(value)`` (the same on every rank for equal values); -1 for None."""
    if value is None:
        return -1
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=7).digest(), "little")


def agree_same(
    comm: MPI.Comm, error: BaseException | None, value: Any, *, what: str, describe: Any = repr
) -> None:
    """Collective over `comm`: one allreduce agrees on errors and on ``value`` being equal.

    Ranks passing ``value`` None (they failed) are not compared.  On a mismatch
    (rare: then rank 0's value is broadcast) every rank raises the same
    :class:`~collio.errors.MismatchError`, naming the ranks whose value differs
    from rank 0's.
    """
    h = digest(value)
    vec = np.array([1 if error is not None else 0, h if h >= 0 else _NONE, -h if h >= 0 else _NONE])
    out = np.empty_like(vec)
    comm.Allreduce([vec, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX)
    if out[0]:
        raise_agreed(comm, error, what=what)
    if out[1] == _NONE or out[1] == -out[2]:
        return
    ref = comm.bcast(value, root=0)
    mine = None
    if value is not None and ref is not None and value != ref:
        mine = make_error(
            "MismatchError", f"{describe(value)} differs from rank 0's {describe(ref)}"
        )
    # equal values may print differently (np.int64(2) and 2): then nobody differs
    agree(comm, mine, what=what)


def bcast_outcome(
    comm: MPI.Comm, value: Any, error: BaseException | None, *, root: int = 0, what: str = ""
) -> Any:
    """Collective over `comm`: broadcast the root's result, or raise its error everywhere.

    For steps only the root performs (create a file, start an upload): one
    broadcast replaces a broadcast plus an agreement.
    """
    packed = comm.bcast(("ok", value) if error is None else ("error", classify(error)), root=root)
    if packed[0] == "ok":
        return packed[1]
    name, msg, errno = packed[1]
    text = f"rank {root}: {msg}"
    if what:
        text = f"{what}: {text}"
    raise make_error(name, text, ranks=(root,), errno=errno) from error


def raise_agreed(comm: MPI.Comm, error: BaseException | None, *, what: str = "") -> None:
    """Collective over `comm`: gather every rank's error and raise the combined one.

    Call only when every rank knows that some rank failed (e.g. after a flag
    allreduce).  The class is the one of the lowest failing rank.
    """
    mine: tuple[str, str, int | None] | None = None
    if error is not None:
        mine = classify(error)
    infos: list[Any] = comm.allgather(mine)
    failed = [(rank, info) for rank, info in enumerate(infos) if info is not None]
    if not failed:  # pragma: no cover - caller promised a failure
        failed = [(-1, ("CollioError", "unknown failure on another rank", None))]
    first_name, _, first_errno = failed[0][1]
    shown = failed[:8]
    text = "; ".join(f"rank {rank}: {msg}" for rank, (_, msg, _) in shown)
    if len(failed) > len(shown):
        text += f"; and {len(failed) - len(shown)} more ranks"
    if what:
        text = f"{what}: {text}"
    exc = make_error(first_name, text, ranks=tuple(r for r, _ in failed), errno=first_errno)
    raise exc from error


def any_flag(comm: MPI.Comm, flag: bool, *, patient: bool = False) -> bool:
    """Collective over `comm`: True when any rank passes a true ``flag``.

    With ``patient`` the ranks wait for each other in a sleeping ``Iallreduce``/
    ``Test`` loop instead of MPI's polling: for backends whose requests take
    milliseconds (object stores), where a polling rank would take a core from the
    ranks still doing I/O, or from a server on the same node.
    """
    if not patient:
        return bool(comm.allreduce(1 if flag else 0, op=MPI.MAX))
    mine = np.array([1 if flag else 0], np.int64)
    out = np.zeros(1, np.int64)
    sleep_until_done(comm.Iallreduce([mine, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.MAX))
    return bool(out[0])


#: sleep_until_done: tests before the first sleep, first sleep, longest sleep (seconds).
#: A 1 ms cap made every sleeping agreement cost ~4 ms even with all ranks present
#: (a nonblocking allreduce needs several tests per step); 200 us: ~0.7 ms, and the
#: 128 MiB writes got 3-10% faster (same job, alternating, 13 iterations).
WAIT_SPIN, WAIT_FIRST, WAIT_CAP = 0, 1e-5, 2e-4


def sleep_until_done(req: MPI.Request | list[MPI.Request]) -> None:
    """Complete a request (or all of a list) by testing with growing sleeps (10 us to 200 us)."""
    if isinstance(req, list):
        reqs = req

        def test() -> bool:
            return bool(MPI.Request.Testall(reqs))
    else:
        test = req.Test
    for _ in range(WAIT_SPIN):
        if test():
            return
    delay = WAIT_FIRST
    while not test():
        time.sleep(delay)
        delay = min(2 * delay, WAIT_CAP)


def quiet_barrier(comm: MPI.Comm) -> None:
    """Collective over `comm`: a barrier that sleeps while it waits.

    For where one rank works (talks to a server, runs a baseline) while the others
    wait: MPI's blocking calls keep a core busy polling, a core that the working
    rank, or a server on the same node, needs.
    """
    sleep_until_done(comm.Ibarrier())
