"""``async_save``: capture the state, then write it from a background thread.

The background save makes its collective calls on a duplicate of the user's
communicator, made once and kept: MPI orders collectives per communicator, so the
user's own collectives on theirs, meanwhile, cannot meet the save's, and collio's
one-thread-per-communicator guard sees two different communicators.

The thread runs at the lowest CPU priority (Linux: ``nice`` 19 for that thread
alone), and does all of the save's I/O itself, its fsync included (no early flush
in a shared thread at the job's priority, as a blocking save starts).  Its work
(checksums, the copies into the page cache, MPI's polling while it waits for the
other ranks) needs cores that the job's compute wants: with more ranks than cores
every cycle it takes is one the job loses.  At the lowest priority it runs when a
core is idle, and the job's computing threads come first.  The save
then takes longer when the cores are busy: ``wait()`` gets the rest of it done.

The GIL is the one thing the thread shares with the job's own Python thread, which
takes it back after every numpy call, and a thread at the lowest priority that loses
its core while it holds the GIL makes the job's thread wait for the scheduler to run
it again.  So the thread holds it as little as it can: what the save works out in
Python (the extents, this rank's items: a few milliseconds at a time) is done before
``async_save`` returns (:func:`~.writer.ready`); what is left to the thread is mostly
C calls that release the GIL (its writes, checksums, fsync and MPI's waits) and the
calls' own bookkeeping between them.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import copy
import functools
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from mpi4py import MPI

from ..collective import Attempt, agree, any_flag
from ..errors import ModeError
from ..redact import redact_text, redact_url
from .save import maps_later, prepare
from .state import Entry
from .writer import ready, write

__all__ = ["SaveHandle", "async_save"]

_lock = threading.Lock()
_keyval: int | None = None
_pool: concurrent.futures.ThreadPoolExecutor | None = None


class _Background:
    """What a user communicator keeps for its async saves (an MPI attribute of it, not a
    table keyed by its handle: MPI reuses a freed communicator's handle, and a later
    communicator must not find the earlier one's duplicate)."""

    def __init__(self, dup: MPI.Intracomm) -> None:
        self.dup = dup
        self.running: SaveHandle | None = None
        #: the last save's copies, by entry (:class:`_Stage`), for the next save to fill
        self.staged: dict[tuple[Any, ...], np.ndarray[Any, Any]] = {}
        _ALL.add(self)


#: Every communicator's :class:`_Background` (for :func:`forget`).
_ALL: weakref.WeakSet[_Background] = weakref.WeakSet()


def forget() -> None:
    """Local: drop the copies async saves keep for the next ones (a save running keeps
    what it holds until it is done)."""
    with _lock:
        every = list(_ALL)
    for kept in every:
        kept.staged = {}


def _delete(comm: Any, keyval: int, value: Any) -> None:
    try:
        if isinstance(value, _Background):
            running = value.running
            if running is None:
                _free(value)
            else:
                # the save's thread may still make its calls on the duplicate (freed
                # here, its handle would be MPI_COMM_NULL under them): freed once the
                # save is done, by the thread that ends it (at once if it has ended)
                running._future.add_done_callback(lambda _: _free_after(value))
    except Exception:  # noqa: BLE001 - never raise from an MPI callback
        pass


def _free(value: _Background) -> None:
    if value.dup != MPI.COMM_NULL:
        value.dup.Free()


def _free_after(value: _Background) -> None:
    """:func:`_free` once its save is done; and the save let go (the future's callback
    holds ``value``, which held the save, which holds the future: a cycle until the
    next full collection, with the save's plan in it)."""
    _free(value)
    value.running = None


class SaveHandle:
    """A save running in the background.  ``staged`` is the bytes this rank copied (and
    keeps for the communicator's next async save: :func:`forget` lets them go)."""

    def __init__(
        self, future: concurrent.futures.Future[None], staged: int, target: str | None = None
    ) -> None:
        self._future = future
        self.staged = staged
        self.target = target  # (:func:`target_key` of the save's target)
        # (what the future's callback needs, apart from the handle: a callback holding
        # the handle, which holds the future, would make a reference cycle per save)
        self._said = _Said(target)
        future.add_done_callback(functools.partial(_ended, self._said))

    @property
    def _told(self) -> bool:
        return self._said.told

    def done(self) -> bool:
        """Local, never blocks: whether :meth:`wait` would return at once."""
        return self._future.done()

    def wait(self) -> None:
        """Collective over the save's ranks: return once the checkpoint is durable and
        committed; raise the save's error, the same on every rank (it was agreed there),
        also after a later save raised it (:func:`raise_untold`)."""
        self._tell()
        self._future.result()

    def _tell(self) -> None:
        with _lock:
            self._said.told = True
            _UNTOLD.pop(self._said, None)


class _Said:
    """Whether a save's error reached its caller (:meth:`SaveHandle.wait` or a later
    save), and its target."""

    __slots__ = ("told", "target")

    def __init__(self, target: str | None) -> None:
        self.told = False
        self.target = target


def _ended(said: _Said, future: concurrent.futures.Future[None]) -> None:
    """(In the save's thread, or at once if it is over:) a failed save waits in
    :data:`_UNTOLD` until its error is told, held there even if its communicator (and
    the handle) are gone, for :func:`_lost` at exit."""
    if future.exception() is not None:
        with _lock:
            if not said.told:
                _UNTOLD[said] = future


#: Failed async saves whose error no caller has been told of yet (:func:`_ended`), and
#: their futures.
_UNTOLD: dict[_Said, concurrent.futures.Future[None]] = {}


def target_key(target: Any) -> str | None:
    """What tells two saves' targets apart: a path made absolute (no file system call),
    a URL as given; None for other targets."""
    if not isinstance(target, (str, os.PathLike)):
        return None
    s = os.fspath(target)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    return s if "://" in s else os.path.abspath(s)


def settle(target: Any) -> None:
    """Local: wait for every async save of this process still writing ``target`` (on
    any communicator), so that a later save of it is the one left there, and a load of
    it reads what the async save committed.  Its error stays with its handle."""
    key = target_key(target)
    if key is None:
        return
    with _lock:
        every = list(_ALL)
    running = [h._future for h in (k.running for k in every) if h is not None and h.target == key]
    if running:
        concurrent.futures.wait(running)


def raise_untold(comm: MPI.Intracomm) -> None:
    """Local, alike on every rank of ``comm``: wait for the communicator's last async
    save (saves on a communicator run one at a time, in the order they are called),
    then raise its error if it failed and no :meth:`~SaveHandle.wait` raised it (the
    save's ranks agreed on it: every rank raises it here, in the same call), so that a
    job that never waits for its background saves still learns that one failed, at its
    next save, instead of never."""
    if _keyval is None:
        return
    kept = comm.Get_attr(_keyval)
    if not isinstance(kept, _Background) or kept.running is None:
        return
    h = kept.running
    concurrent.futures.wait([h._future])
    err = h._future.exception()
    # (the save failed on every rank alike, so every rank asks here; whether each was
    # told is its own (a rank may have called wait() after done() said so, another not):
    # raised on every rank if any was not told)
    if err is None or not any_flag(comm, not h._told):
        return
    h._tell()
    # (a copy, so that the handle's own error, which its wait() still raises, keeps
    # its message and notes)
    again = copy.copy(err)
    again.__notes__ = [
        *getattr(err, "__notes__", []),
        "(an earlier async_save's error, which its handle's wait() had not raised on "
        "every rank: this save raises it and does not run)",
    ]
    try:
        raise again from err
    finally:  # (the traceback holds this frame, and it the refused save's arrays)
        del again, err


def _lost() -> None:
    """At exit: say which async saves failed with nobody told (the interpreter waited
    for their threads first)."""
    with _lock:
        untold = list(_UNTOLD.items())
        _UNTOLD.clear()
    for said, future in untold:
        err = future.exception()
        where = redact_url(said.target) or "its target"
        text = redact_text(f"{type(err).__name__}: {err}", said.target)
        print(f"collio: an async_save to {where} failed and no wait() raised it: {text}",
              file=sys.stderr, flush=True)  # fmt: skip


atexit.register(_lost)


def _background(comm: MPI.Intracomm) -> _Background:
    """Collective the first time per communicator: the duplicate the thread saves on."""
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
        kept = comm.Get_attr(_keyval)
    if isinstance(kept, _Background):
        return kept
    _threads_agreed(comm)  # (once: MPI's thread level cannot change once it runs)
    kept = _Background(comm.Dup())
    comm.Set_attr(_keyval, kept)
    return kept


#: The save thread's niceness (the lowest priority: see the module's doc).
NICE = 19


def _lower_priority() -> None:
    """In the save's thread: give it the lowest CPU priority, on Linux, where a thread's
    id names that thread alone to ``setpriority`` (elsewhere it could name a process)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except OSError:  # (a container that forbids it: the save runs at the job's priority)
        pass


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="collio-ckpt", initializer=_lower_priority
            )
        return _pool


class _Stage:
    """Copies of this rank's pieces (the caller may change its arrays as soon as
    :func:`async_save` returns), made while the ranks agree on the save (see
    :data:`~.save.Stage`): this rank's state once, no more (replicated entries other
    ranks write are not copied).  A copy that fails (no memory) fails the save at
    :meth:`SaveHandle.wait`, on every rank: the ranks have gone on by then.

    The copies are kept for the communicator's next async save, which fills those of
    entries of the same name, shape, dtype and order again (the previous save is done
    by then: :func:`async_save` waits for it) instead of allocating new ones: a job
    saving every N steps keeps its state's copy resident, as PyTorch DCP's stager can
    keep its staging buffers.  New memory costs a page fault per page; and on a
    machine that hands freed memory back to its host, a save's copies freed after each
    save made the next blocking save's writes into the page cache take twice as long
    in about half the saves (docs/benchmarks.md).  :func:`forget` (``release_buffers``)
    lets them go."""

    def __init__(self, kept: dict[tuple[Any, ...], np.ndarray[Any, Any]]) -> None:
        self.staged = 0
        self.error: BaseException | None = None
        self.kept = kept
        self.made: dict[tuple[Any, ...], np.ndarray[Any, Any]] = {}

    def __call__(self, entries: list[Entry], replicated: bool) -> None:
        try:
            for k, e in enumerate(entries):
                if e.replicated != replicated or e.layout.nbytes == 0:
                    continue
                order: Literal["C", "F"] = "F" if e.layout.order == "F" else "C"
                key = (e.name, e.data.shape, e.data.dtype.str, order)
                copy = self.kept.get(key)
                if copy is None:
                    copy = np.copy(e.data, order=order)
                else:
                    np.copyto(copy, e.data)
                self.made[key] = copy
                entries[k] = Entry(e.name, copy, e.layout, e.replicated, e.scalar)
                self.staged += copy.nbytes
        except Exception as exc:  # noqa: BLE001 - agreed by the save's first agreement
            self.error = self.error or exc


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

    The entries, the hints and the backend's options are checked on every rank alike
    before this returns (the same errors as :func:`save`); the copies are made while
    the ranks agree on them; the opening of the target, the writing, checksums and
    commit run in a background thread, and their errors (a missing directory, ranks
    naming different targets or hints, pieces of several ranks overlapping, a full
    disk) are raised by :meth:`~SaveHandle.wait`, on every rank.  So is a copy that
    fails on some rank (no memory).
    A second ``async_save`` (or :func:`save`) on the same communicator first waits for
    the one running; its error stays with its handle's :meth:`~SaveHandle.wait`, and if
    nobody called that, the second raises it (on every rank) instead of saving, so a
    failed save is never passed over in silence.  Any save, load or
    :func:`~.load.info` of the same target in this process waits for it too.
    MPI must run threads fully (``MPI_THREAD_MULTIPLE``, mpi4py's default), or every
    rank raises :class:`~collio.ModeError`.
    """
    base = MPI.COMM_WORLD if comm is None else comm
    kept = _background(base)
    raise_untold(base)
    settle(target)  # (one of another communicator's ranks writing the same target)
    # (a path made absolute here: the thread opens it later, maybe after a chdir)
    key = target_key(target)
    where = key if key is not None and "://" not in key else target
    stage = _Stage(kept.staged)
    kept.staged = {}  # (the copies this save fills are its own until it is done)
    plan = prepare(base, state, metadata, stage, huge=maps_later(target, options),
                   check=functools.partial(_arguments, target, hints, options))  # fmt: skip
    plan.error = stage.error
    kept.staged = stage.made  # (the next save waits for this one before filling them)
    ready(plan, base.Get_rank())  # (its Python here, not holding the GIL in the thread)
    # (early=False: all of the save's I/O in its thread, at the lowest priority)
    job = functools.partial(write, early=False)
    future = _executor().submit(job, kept.dup, where, plan, hints, dict(options))
    handle = SaveHandle(future, stage.staged, key)
    kept.running = handle
    return handle


def _arguments(target: Any, hints: Any, options: Mapping[str, Any]) -> None:
    """Local: the save's hints and its backend's options, checked as its open in the
    background will check them, so that bad ones are raised by ``async_save`` itself."""
    from ..backends import get_backend, infer_backend
    from ..hints import Hints

    Hints.coerce(hints, warn=False)
    kept = {k: v for k, v in options.items() if k != "backend"}
    get_backend(options.get("backend") or infer_backend(target)).check_options("w", kept)


def _threads_agreed(comm: MPI.Intracomm) -> None:
    """Collective: raise the same :class:`~collio.ModeError` on every rank unless MPI
    runs threads fully on every rank (``MPI_THREAD_MULTIPLE``, mpi4py's default): the
    save's thread makes collective calls while the job's thread makes its own, which a
    lower level forbids (MPI may crash or corrupt memory)."""
    step = Attempt()
    with step:
        got = MPI.Query_thread()
        if got < MPI.THREAD_MULTIPLE:
            names = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                     MPI.THREAD_SERIALIZED: "serialized"}  # fmt: skip
            raise ModeError(
                f"async_save needs MPI_THREAD_MULTIPLE (its thread makes MPI calls beside "
                f"the job's); rank {comm.Get_rank()} runs MPI at thread level "
                f"{names.get(got, got)} (mpi4py.rc.thread_level): use save()"
            )
    agree(comm, step.error, what="async_save")
