"""collio's private communicator and node map, cached on the user's communicator.

Duplicating a communicator and discovering nodes (``COMM_TYPE_SHARED``) are
collective and cost milliseconds when ranks oversubscribe cores, so collio does
them once per user communicator and caches the result as an MPI attribute (the
way ROMIO caches its own state).  When the user frees the communicator, the
attribute's delete callback frees collio's duplicate.

Sharing one duplicate between files is safe: every collio collective call
completes all its messages before it returns, and collective calls on a
communicator happen in the same order on every rank.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.select import choose_aggregators
from .plancache import PlanCache

__all__ = ["Private", "private"]

_lock = threading.Lock()
_keyval: int | None = None


@dataclasses.dataclass(slots=True)
class Private:
    """What collio keeps per user communicator."""

    comm: MPI.Intracomm
    nodes: npt.NDArray[np.int64]  # nodes[r]: world-unique id of rank r's node
    plans: PlanCache = dataclasses.field(default_factory=PlanCache)  # kept plans
    # aggregator ranks by (cb_nodes, per_node): a pure function of ``nodes``, kept
    aggregators: dict[tuple[int | None, int | None], npt.NDArray[np.int64]] = dataclasses.field(
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

    def acquire(self) -> None:
        """A file starts using the duplicate."""
        self.users += 1

    def release(self) -> None:
        """A file is done with the duplicate: free it if the user's communicator is gone."""
        self.users -= 1
        if self.orphaned and self.users <= 0:
            self._free()

    def _free(self) -> None:
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()

    def choose(self, cb_nodes: int | None, per_node: int | None) -> npt.NDArray[np.int64]:
        """:func:`~collio.aggregators.choose_aggregators` for this communicator, kept."""
        key = (cb_nodes, per_node)
        got = self.aggregators.get(key)
        if got is None:
            got = choose_aggregators(self.nodes, cb_nodes=cb_nodes, per_node=per_node)
            got.setflags(write=False)
            self.aggregators[key] = got
        return got


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
    dup = comm.Dup()
    node = dup.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = np.array([node.bcast(dup.Get_rank(), root=0)], np.int64)
    finally:
        node.Free()
    nodes = np.empty(dup.Get_size(), np.int64)
    dup.Allgather([leader, MPI.INT64_T], [nodes, MPI.INT64_T])
    value = Private(dup, nodes)
    comm.Set_attr(keyval, value)
    return value
