"""collio's private communicator and node map, cached on the user's communicator.

Duplicating a communicator and discovering nodes (``COMM_TYPE_SHARED``) are
collective and cost milliseconds when ranks oversubscribe cores, so collio does
them once per user communicator and caches the result as an MPI attribute (the
way ROMIO caches its own state).  When the user frees the communicator, the
attribute's delete callback frees collio's duplicate.

Sharing one duplicate between files is safe: every collio collective call
completes all its messages before it returns, and collective calls on a
communicator happen in the same order on every rank.  Calls from two threads at
once on one communicator break that order (MPI forbids concurrent collectives on a
communicator): :func:`exclusive` refuses the second at once, in its own thread.

A file whose collective calls may run on a thread of their own (``collio.mpi``'s
nonblocking collectives) cannot share it: it runs on a :class:`Lane`, another duplicate
with kept plans of its own, lent to one open file at a time and kept for the next, so
that opening and closing such files in a loop duplicates once, not at every open.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from threading import get_ident
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.nodes import consecutive_nodes, node_shape, ranks_per_node_from_env
from .aggregators.select import choose_aggregators
from .collective import Attempt, agree, drop_head_op, keep_head_op
from .errors import ConcurrentCallError
from .plancache import PlanCache

__all__ = ["Lane", "Private", "clear", "exclusive", "node_map", "one_thread", "private"]

_lock = threading.Lock()
_lanes_lock = threading.Lock()  # (a Close on one thread may give a lane back during an Open)
_keyval: int | None = None
#: Communicators in a collective call of collio, by handle: (thread, the call, calls in
#: progress on that thread: a call may make another, e.g. close after a failure).
_busy: dict[int, tuple[int, str, int]] = {}
#: Plan caches :func:`clear` found in a call, by their communicator's handle: cleared
#: by that call's thread when the call ends (:func:`_exit`).
_stale: dict[int, weakref.ref[PlanCache]] = {}
#: What :func:`clear` enters a communicator's entry of :data:`_busy` as (for microseconds:
#: a call starting meanwhile waits for it, see :func:`_enter`).
_CLEARING = "clearing the kept plans"
F = TypeVar("F", bound=Callable[..., Any])


class exclusive:  # noqa: N801 - used as a function: ``with exclusive(comm, call):``
    """Local: mark ``comm`` as in collio's collective ``call`` on this thread; raise
    :class:`~collio.errors.ConcurrentCallError` at once if another thread is in one.

    The other thread's call goes on undisturbed.  The check is per process: it sees
    two threads of one rank, which is how concurrent collectives on one communicator
    happen (a rank whose threads take turns in a different order than another rank's
    still mismatches, and is then reported by the call's first agreement).
    """

    __slots__ = ("key", "call")

    def __init__(self, comm: MPI.Comm, call: str) -> None:
        self.key = comm.py2f()
        self.call = call

    def __enter__(self) -> None:
        _enter(self.key, self.call)

    def __exit__(self, *exc: object) -> None:
        _exit(self.key)


def _enter(key: int, call: str) -> None:
    """Local: :class:`exclusive`'s entry for the communicator ``key`` (every collective
    call enters it, small ones too: no lock, and the threads' names only for the error).

    ``dict.setdefault`` is atomic, so of two threads entering at once one's entry
    stands and the other finds it; an entry is changed and removed only by its own
    thread (:func:`_exit`), so no other step needs a lock.
    """
    me = get_ident()
    mine = (me, call, 1)
    held = _busy.setdefault(key, mine)
    while held[1] is _CLEARING:  # (another thread's clear: a few statements, then gone)
        time.sleep(0)
        held = _busy.setdefault(key, mine)
    if held is mine:
        return
    if held[0] == me:  # (a call this thread makes within its own, e.g. close)
        _busy[key] = (me, held[1], held[2] + 1)
        return
    raise ConcurrentCallError(
        f"{call} in thread {threading.current_thread().name!r} while thread "
        f"{_thread_name(held[0])!r} is in {held[1]} on the same communicator: MPI forbids "
        "concurrent collective calls on one communicator; make collio's calls on it from "
        "one thread at a time, or give each thread its own communicator (comm.Dup())"
    )


def _exit(key: int) -> None:
    me, first, depth = _busy[key]
    if depth <= 1:
        if _stale:  # (a clear on another thread during the call, done now: it has ended)
            _clear_kept(key)
        del _busy[key]
    else:
        _busy[key] = (me, first, depth - 1)


def clear(plans: PlanCache) -> None:
    """Local: drop the kept plans of ``plans`` now if no call is using them, else when
    the call using them ends (on its own thread, before another call can start).

    A call agrees with the other ranks on a kept plan, then takes it from the cache (and
    a kept lane checks its entry is still the latest); cleared meanwhile from another
    thread, this rank alone would plan anew while the others go on with the kept plan.
    The communicator's entry in :data:`_busy` is held while clearing, so that no call
    starts in between.
    """
    key = plans.key
    if key is None:  # (a cache of no communicator's calls)
        plans.clear()
        return
    _stale[key] = weakref.ref(plans)  # first: a call ending now clears it (_exit)
    mine = (get_ident(), _CLEARING, 1)
    if _busy.setdefault(key, mine) is mine:
        try:
            _clear_kept(key)
        finally:
            del _busy[key]


def _clear_kept(key: int) -> None:
    """Local: clear the cache :func:`clear` left for the communicator ``key``."""
    ref = _stale.pop(key, None)
    plans = None if ref is None else ref()
    if plans is not None:
        plans.clear()


def _thread_name(ident: int) -> str:
    """The name of the live thread ``ident`` (one that ended: its number)."""
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return f"#{ident}"


def one_thread(method: F) -> F:
    """A method of an object with a ``comm`` property, run under :func:`exclusive`."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = self.comm.py2f()
        _enter(key, name)
        try:
            return method(self, *args, **kwargs)
        finally:
            _exit(key)

    return wrapper  # type: ignore[return-value]


@dataclasses.dataclass(slots=True, eq=False)
class Lane:
    """A duplicate of a :class:`Private`'s communicator, with kept plans of its own, lent
    to one open file at a time that must have a communicator of its own (a
    :mod:`collio.mpi` file, whose nonblocking collectives run on a thread of their own).

    Lent again after that file is closed (its calls completed every message), so a
    program that opens and closes files in a loop pays one ``MPI_Comm_dup`` and plans
    each layout once, as ``collio.File`` does on the shared duplicate.
    """

    comm: MPI.Intracomm
    plans: PlanCache = dataclasses.field(default_factory=PlanCache)
    busy: bool = False
    kept: bool = True  # in Private.lanes, lent again (False: freed when given back)

    def __post_init__(self) -> None:
        self.plans.key = self.comm.py2f()  # (its calls' key in _busy: see clear)


@dataclasses.dataclass(slots=True)
class Private:
    """What collio keeps per user communicator."""

    comm: MPI.Intracomm
    nodes: npt.NDArray[np.int64]  # nodes[r]: world-unique id of rank r's node
    plans: PlanCache = dataclasses.field(default_factory=PlanCache)  # kept plans
    # aggregator ranks by (cb_nodes, per_node, stripes): a pure function of ``nodes``, kept
    aggregators: dict[tuple[int | None, ...], npt.NDArray[np.int64]] = dataclasses.field(
        default_factory=dict
    )
    # files open on ``comm``; a user communicator freed meanwhile (legal with MPI-IO, whose
    # files keep their own) leaves the duplicate to the last of them to close
    users: int = 0
    orphaned: bool = False
    # files opened on ``comm`` so far (by collective calls, so equal on every rank), by
    # collio.open and collio.h5 alike: each file's serial number, which the first
    # agreement of its calls carries (call_head)
    files: int = 0
    # a random number rank 0 drew, the same on every rank: names what the ranks make
    # together (a shared file pointer's file) without another message
    token: int = 0
    # duplicates of ``comm`` lent to files that need their own (Lane), by index
    lanes: list[Lane] = dataclasses.field(default_factory=list)
    # (number of nodes, ranks on the fullest) of ``nodes``: asked at every open, kept
    shape: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.plans.key = self.comm.py2f()  # (its calls' key in _busy: see clear)

    def acquire(self) -> None:
        """A file starts using the duplicate."""
        self.users += 1

    def release(self) -> None:
        """A file is done with the duplicate: free it if the user's communicator is gone."""
        self.users -= 1
        if self.orphaned and self.users <= 0:
            self._free()

    def reserve(self) -> int:
        """Local: the index of an idle lane, now held for this rank's open, or
        ``len(lanes)`` when every lane is lent.  The open's first agreement compares
        it (:meth:`lend`): ranks agree on it unless their lanes differ."""
        with _lanes_lock:
            for k, lane in enumerate(self.lanes):
                if not lane.busy:
                    lane.busy = True
                    return k
            return len(self.lanes)

    def unreserve(self, k: int) -> None:
        """Local: the open that reserved lane ``k`` failed before :meth:`lend`."""
        with _lanes_lock:
            if k < len(self.lanes):
                self.lanes[k].busy = False

    def lend(self, k: int, same: bool) -> Lane:
        """Collective over ``comm`` (``same`` alike on every rank: every rank reserved
        ``k``): lane ``k``, a new one when ``k`` is past the last, kept for later opens.
        When the ranks reserved different lanes (their lanes differ: opens and closes
        on threads of their own raced), every rank makes a duplicate that is freed
        when given back, so no two ranks' calls meet on different communicators."""
        if same and k < len(self.lanes):
            return self.lanes[k]
        if not same:
            self.unreserve(k)
        lane = Lane(_dup(self.comm), busy=True, kept=same)
        if same:
            with _lanes_lock:
                self.lanes.append(lane)
        return lane

    def give_back(self, lane: Lane) -> None:
        """Local: the file ``lane`` was lent to is closed (its calls completed); free it
        when it is not kept or the communicator is gone."""
        with _lanes_lock:
            lane.busy = False
            if lane.kept and self.comm != MPI.COMM_NULL:
                return
            if lane in self.lanes:
                self.lanes.remove(lane)
        _free_dup(lane.comm)

    def _free(self) -> None:
        _free_dup(self.comm)
        with _lanes_lock:  # (a lane still lent is freed when its file gives it back)
            idle = [lane for lane in self.lanes if not lane.busy]
            self.lanes = [lane for lane in self.lanes if lane.busy]
        for lane in idle:
            _free_dup(lane.comm)

    def node_shape(self) -> tuple[int, int]:
        """:func:`~collio.aggregators.nodes.node_shape` of :attr:`nodes`, kept."""
        if self.shape is None:
            self.shape = node_shape(self.nodes)
        return self.shape

    def choose(
        self, cb_nodes: int | None, per_node: int | None, stripes: int | None = None
    ) -> npt.NDArray[np.int64]:
        """:func:`~collio.aggregators.choose_aggregators` for this communicator, kept."""
        key = (cb_nodes, per_node, stripes)
        got = self.aggregators.get(key)
        if got is None:
            got = choose_aggregators(
                self.nodes, cb_nodes=cb_nodes, per_node=per_node, stripes=stripes
            )
            got.setflags(write=False)
            self.aggregators[key] = got
        return got


def _dup(comm: MPI.Intracomm) -> MPI.Intracomm:
    """Collective over `comm`: a duplicate of collio's, with its head operation
    (:func:`~collio.collective.keep_head_op`)."""
    dup = comm.Dup()
    if not keep_head_op(dup):  # (one taken anew: see keep_head_op)
        dup.Free()
        dup = comm.Dup()
    return dup


def _free_dup(comm: MPI.Intracomm) -> None:
    """Local: free a duplicate of collio's (and its head operation), unless already freed."""
    if comm != MPI.COMM_NULL:
        drop_head_op(comm)
        comm.Free()


def _delete(comm: Any, keyval: int, value: Any) -> None:
    try:
        if isinstance(value, Private):
            value.orphaned = True
            if value.users <= 0:  # else the last open file frees it at close
                value._free()
    except Exception:  # noqa: BLE001 - never raise from an MPI callback
        pass


def _get_keyval() -> int:
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
        return _keyval


def node_map(comm: MPI.Intracomm) -> npt.NDArray[np.int64]:
    """Collective over `comm`: ``nodes[r]``, the lowest rank on rank r's node.

    Nodes are MPI's (``COMM_TYPE_SHARED``), or consecutive groups of
    ``COLLIO_RANKS_PER_NODE`` ranks when that is set (the same on every rank: it is
    read on each, and a rank whose value is not a count raises, agreed).  An emulated
    node never spans two of MPI's: the groups are cut where MPI's nodes are, so that
    what a node shares (two-level aggregation's staging window) is on one machine.
    """
    step = Attempt()
    k: int | None = None
    with step:
        k = ranks_per_node_from_env()
    agree(comm, step.error, what="node map")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = np.array([node.bcast(comm.Get_rank(), root=0)], np.int64)
    finally:
        node.Free()
    nodes = np.empty(comm.Get_size(), np.int64)
    comm.Allgather([leader, MPI.INT64_T], [nodes, MPI.INT64_T])
    if k is None:
        return nodes
    return both_nodes(nodes, consecutive_nodes(comm.Get_size(), k) * k)


def both_nodes(
    real: npt.NDArray[np.int64], emulated: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Local, pure: the nodes that are both an MPI node and an emulated one, each named
    by its lowest rank (``real`` and ``emulated`` name theirs so)."""
    pairs = real * len(real) + emulated
    _, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    named: npt.NDArray[np.int64] = first[inverse].astype(np.int64)
    return named


def private(comm: MPI.Intracomm) -> Private:
    """Collective over `comm` the first time, local afterwards: collio's duplicate.

    Every rank of ``comm`` must call this at the same point the first time
    (``collio.open`` does).  Whether the cache is hit is the same on every rank,
    because attributes are set on all ranks by the same collective call.
    """
    keyval = _get_keyval()
    cached = comm.Get_attr(keyval)
    if isinstance(cached, Private):
        return cached
    dup = _dup(comm)
    # rank 0's random number on every rank: once per communicator, at its first open
    value = Private(dup, node_map(dup), token=int(dup.bcast(secrets.randbits(62), root=0)))
    comm.Set_attr(keyval, value)
    return value
