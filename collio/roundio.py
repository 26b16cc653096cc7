"""The I/O side of the rounds: backend requests in the I/O thread (or inline), the byte
ranges they cover, the holes they fill, and waiting for them."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from .aggregators.plan import AggregatorPlan
from .backends.base import Backend
from .backends.failures import storage_errors
from .buffers import window_of
from .collective import Attempt
from .policy import DEPTH
from .runs import Runs, merge
from .stats import Stats

__all__ = [
    "Done",
    "Future",
    "cover",
    "drain",
    "read_window",
    "reuse_buffer",
    "round_cover",
    "run_inline",
    "settle",
    "wait_io",
    "window_write",
    "write_window",
]


class Done:
    """A request run on the main thread, finished: its outcome as a Future gives it
    (``result`` raises its exception), without a Future's lock and condition."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def result(self) -> None:
        if self.error is not None:
            raise self.error


#: A round's request: in the I/O thread, or done on the main thread
Future = concurrent.futures.Future[None] | Done


def _whole(req: tuple[int, int]) -> Runs:
    one = np.array([req[0]], np.int64)
    return Runs(one, np.array([req[1]], np.int64), np.zeros(1, np.int64))


def round_cover(ap: AggregatorPlan, k: int) -> Runs:
    """The byte ranges ranks write (or need) in aggregator round k, sorted and merged."""
    groups = ap.groups_of_round(k)
    parts = [np.arange(int(ap.gstart[g]), int(ap.gstart[g + 1])) for g in groups.tolist()]
    idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    order = idx[np.argsort(ap.file[idx], kind="stable")]
    return merge(Runs(ap.file[order], ap.length[order], ap.file[order]))  # mem=file: merge by file


def cover(ap: AggregatorPlan, k: int, req: tuple[int, int]) -> Runs:
    """What the request ``req`` of round k holds from ranks: every byte, or its runs."""
    return round_cover(ap, k) if ap.rcovered[k] < req[1] else _whole(req)


def run_inline(c: Stats, fn: Callable[..., None], *args: object) -> Future:
    """Run ``fn`` here and now (its time counted as I/O); its outcome as a finished Future.

    For requests the main thread would hand to the I/O thread only to wait for them
    at once (a read's first window, an aggregator's last write, each when the I/O
    thread has nothing left to do, see :func:`settle`): waking the I/O thread
    and the main thread again costs most where it matters least, in small calls, with
    more ranks than cores busy in MPI.
    """
    error: BaseException | None = None
    t = time.perf_counter()
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - delivered through result(), as the pool does
        error = exc
    c.time_io += time.perf_counter() - t
    return Done(error)


def settle(
    pending: list[Future | None], c: Stats, error: BaseException | None
) -> BaseException | None:
    """Wait for every pending request (before one runs on the main thread: backends and
    the counters see one request at a time); the first error, ``error`` if set."""
    if pending.count(None) == len(pending):  # (a small call's one round: none)
        return error
    for i, fut in enumerate(pending):
        pending[i] = None
        step = Attempt()
        with step:
            wait_io(fut, c)
        error = error or step.error
    return error


def wait_io(fut: Future | None, c: Stats) -> None:
    """Wait for a request (its time counted as I/O); raises its error."""
    if fut is not None:
        t = time.perf_counter()
        fut.result()
        c.time_io += time.perf_counter() - t


def window_write(
    be: Backend, offset: int, buf: npt.NDArray[np.uint8], cover: Runs, more: bool
) -> int | list[int]:
    """``be.write_window``, telling the backend whether this rank writes another round of
    the call after it (:attr:`~collio.backends.base.Backend.more_rounds`)."""
    be.more_rounds = more
    try:
        return be.write_window(offset, buf, cover)
    finally:
        be.more_rounds = True


def write_window(
    be: Backend, offset: int, buf: npt.NDArray[np.uint8], cover: Runs, c: Stats,
    more: bool = True,
) -> None:  # fmt: skip
    """One round's backend write (in the I/O thread), counted; ``more``: this rank writes
    another round of the call after it."""
    with storage_errors(be):
        c.add_writes(window_write(be, offset, buf, cover, more))


def read_window(be: Backend, offset: int, buf: npt.NDArray[np.uint8], need: Runs, c: Stats) -> None:
    with storage_errors(be):
        c.add_reads(be.read_window(offset, buf, need))


def reuse_buffer(
    be: Backend,
    ap: AggregatorPlan,
    k: int,
    req: tuple[int, int],
    bufs: list[npt.NDArray[np.uint8]],
    pending: list[Future | None],
    c: Stats,
    error: BaseException | None,
) -> None:
    """Wait for the I/O of the round that last used round k's buffer (even after an
    error), then read the old bytes of the round's holes where the backend needs them."""
    b = k % DEPTH
    fut, pending[b] = pending[b], None
    wait_io(fut, c)
    if error is None and ap.rcovered[k] < req[1]:
        t = time.perf_counter()
        win = window_of(bufs[b], *req)
        with storage_errors(be):
            c.add_reads(be.fill_holes(req[0], win, round_cover(ap, k)))
        c.time_io += time.perf_counter() - t


def drain(
    pending: list[Future | None], c: Stats, error: BaseException | None
) -> BaseException | None:
    """Wait for outstanding I/O; the first error of the rounds (agreed by the caller)."""
    t = time.perf_counter()
    for fut in pending:
        if fut is None:
            continue
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - agreed by the caller
            error = error or exc
    c.time_io += time.perf_counter() - t
    return error
