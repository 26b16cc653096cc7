"""The intra-node stage of two-level aggregation in shared memory.

Each local group (a local aggregator and the ranks that hand it their pieces, all on
one node) shares one window (``MPI.Win.Allocate_shared``) at its local aggregator:
:data:`SLOTS` staging buffers, each one round's bytes of the group.  Every rank copies
its own pieces of a round into (for reads: out of) their places in the round's slot,
so the copies run on every core of the node at once instead of one local aggregator
receiving every piece in messages, and pieces of a few hundred bytes cost a numpy
copy each instead of a datatype block; the local aggregator's messages to the
file-domain aggregators go from, and come into, the slots.

One nonblocking barrier of the group per round orders it all:

* writes: a rank enters barrier ``k`` once it copied its pieces of round ``k``; the
  local aggregator also waits for it (then sends the round), and enters it only once
  the sends of round ``k - SLOTS + 1`` completed, so a rank that passed barrier
  ``k - 1`` may fill round ``k``'s slot (:data:`SLOTS` - 1 rounds of sends in flight);
* reads: every rank enters barrier ``k`` once its messages of round ``k`` completed
  (the local aggregator's bring the round into its slot), and copies its pieces of
  round ``k`` out once it passed it, while the messages of round ``k + 1`` are in
  flight; so a rank that entered barrier ``k`` copied out round ``k - 1``, and the
  local aggregator receives round ``k`` into a slot only after barrier
  ``k - SLOTS + 1``.

The windows and the groups' communicators are kept with the communicator (an MPI
attribute, freed with it); a window only grows, at planning (an agreed step).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.nodes import LocalGroups
from .waits import sleep_until_done

__all__ = ["SLOTS", "Group", "ShmStage", "copy_runs", "group_of"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
#: Staging buffers per group: rounds in flight at once (see module doc).
SLOTS = 3
#: Run lengths up to this many distinct ones are copied with numpy, one pass each;
#: more go through MPI's datatype engine (one call whatever the runs).
NUMPY_LENGTHS = 8
_TAG = 0x2C02
_keyval: int | None = None
_lock = threading.Lock()


@dataclasses.dataclass(slots=True, eq=False)
class Group:
    """One local group's communicator (its local aggregator is rank 0) and window."""

    comm: MPI.Intracomm
    self_comm: MPI.Intracomm  # private: local copies through MPI match nobody else's
    win: MPI.Win | None = None
    nbytes: int = 0
    shared: U8 = dataclasses.field(default_factory=lambda: np.zeros(0, np.uint8))

    def ensure(self, nbytes: int) -> None:
        """Collective over the group (the same ``nbytes`` on each of its ranks): a window
        of at least ``nbytes`` at the local aggregator."""
        if nbytes <= self.nbytes:
            return
        self._free_window()
        mine = nbytes if self.comm.Get_rank() == 0 else 0
        self.win = MPI.Win.Allocate_shared(mine, 1, comm=self.comm)
        buf, _ = self.win.Shared_query(0)
        self.shared = np.asarray(buf).view(np.uint8)  # (mpi4py's buffer: numpy-readable)
        self.nbytes = nbytes

    def _free_window(self) -> None:
        if self.win is not None:
            self.win.Free()
        self.win, self.nbytes, self.shared = None, 0, np.zeros(0, np.uint8)

    def free(self) -> None:
        """Collective over the group."""
        self._free_window()
        self.self_comm.Free()
        self.comm.Free()


def _delete(comm: Any, keyval: int, value: Any) -> None:
    try:
        for group in value.values():
            group.free()
    except Exception:  # noqa: BLE001 - never raise from an MPI callback
        pass


def group_of(comm: MPI.Comm, local: LocalGroups) -> Group:
    """Collective over ``comm``: this rank's local group, kept with ``comm`` (by the
    groups' leaders, so files with other local aggregators get their own)."""
    global _keyval
    with _lock:
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    groups: dict[bytes, Group] | None = comm.Get_attr(_keyval)  # type: ignore[assignment]
    if groups is None:
        groups = {}
        comm.Set_attr(_keyval, groups)
    key = local.leader.tobytes()
    got = groups.get(key)
    if got is None:
        rank = comm.Get_rank()
        sub = MPI.Intracomm(comm.Split(int(local.group[rank]), rank))
        got = Group(sub, MPI.COMM_SELF.Dup())
        groups[key] = got
    return got


def _apart(offsets: I64, lengths: I64) -> bool:
    return len(offsets) > 1 and not bool((offsets[1:] == (offsets + lengths)[:-1]).all())


def copy_runs(src: U8, soff: I64, dst: U8, doff: I64, length: I64, self_comm: MPI.Comm) -> None:
    """Copy ``src[soff[i]:soff[i]+length[i]]`` to ``dst[doff[i]:...]`` for every i.

    One slice when both sides are contiguous; runs of a few lengths with numpy (a
    gather into rows, then a scatter of them); any others with MPI's datatype engine
    (a message to itself on ``self_comm``).
    """
    n = len(length)
    if n == 0:
        return
    if not _apart(soff, length) and not _apart(doff, length):
        s, d, total = int(soff[0]), int(doff[0]), int(length.sum())
        dst[d : d + total] = src[s : s + total]
        return
    sizes = np.unique(length)
    if len(sizes) > NUMPY_LENGTHS:
        _mpi_copy(src, soff, dst, doff, length, self_comm)
        return
    for size in sizes.tolist():
        pick = np.flatnonzero(length == size) if len(sizes) > 1 else slice(None)
        _copy_equal(src, soff[pick], dst, doff[pick], int(size))


def _rows(buf: U8, size: int, stop: int, writeable: bool) -> npt.NDArray[np.uint8]:
    """``buf[o:o+size]`` for every o below ``stop`` - size + 1, as rows of one view."""
    return np.lib.stride_tricks.as_strided(
        buf[:stop], shape=(stop - size + 1, size), strides=(1, 1), writeable=writeable
    )


def _as_matrix(buf: U8, offsets: I64, size: int) -> bool:
    """Whether the runs are whole rows of ``buf`` seen as a matrix of ``size`` columns
    (a view: ``buf`` is contiguous)."""
    whole = len(buf) % size == 0 and buf.flags.c_contiguous
    return whole and not bool((offsets % size).any())


def _row_view(buf: U8, offsets: I64, size: int, writeable: bool) -> tuple[Any, I64]:
    """The runs ``buf[o:o+size]`` as rows ``idx`` of a matrix view of ``buf``: its plain
    reshape when they are whole rows (numpy copies those faster), else overlapping rows."""
    if _as_matrix(buf, offsets, size):
        return buf.reshape(-1, size), offsets // size
    return _rows(buf, size, int(offsets.max()) + size, writeable), offsets


def _span(buf: U8, offsets: I64, size: int) -> Any:
    """The runs as rows of one view when they follow each other in ``buf``, else None."""
    n = len(offsets)
    if not buf.flags.c_contiguous or (n > 1 and not bool((np.diff(offsets) == size).all())):
        return None
    first = int(offsets[0])
    return buf[first : first + n * size].reshape(n, size)


def _copy_equal(src: U8, soff: I64, dst: U8, doff: I64, size: int) -> None:
    """Runs of one length, in one pass when either side is one span (a member's pieces
    usually are, in its own buffer), else gathered into rows and scattered."""
    if len(soff) == 0:
        return
    out = _span(dst, doff, size)
    if out is not None:
        mat, idx = _row_view(src, soff, size, False)
        np.take(mat, idx, axis=0, out=out, mode="clip")  # (in range: no buffering)
        return
    rows = _span(src, soff, size)
    if rows is None:
        mat, idx = _row_view(src, soff, size, False)
        rows = mat[idx]
    mat, idx = _row_view(dst, doff, size, True)
    mat[idx] = rows


def _byte_type(offsets: I64, lengths: I64) -> MPI.Datatype:
    return MPI.BYTE.Create_hindexed(lengths.tolist(), offsets.tolist()).Commit()


def _mpi_copy(src: U8, soff: I64, dst: U8, doff: I64, length: I64, comm: MPI.Comm) -> None:
    types: list[MPI.Datatype] = []
    try:
        types.append(_byte_type(soff, length))
        types.append(_byte_type(doff, length))
        comm.Sendrecv([src, 1, types[0]], 0, _TAG, [dst, 1, types[1]], 0, _TAG)
    finally:
        for t in types:
            t.Free()


@dataclasses.dataclass(slots=True)
class ShmStage:
    """A :class:`~collio.rounds.Stage` over a group's window for one call.

    ``order``/``starts``: this rank's pieces by round; ``spos``: each piece's place in
    its round's slot of ``size`` bytes.  Errors of its copies are kept (the rounds go on:
    every barrier is still entered) and returned by :meth:`finish`.
    """

    group: Group
    buf: U8  # the user's buffer
    mem: I64
    length: I64
    spos: I64
    order: I64
    starts: I64
    size: int
    lead: bool
    slots: int = SLOTS
    barriers: dict[int, MPI.Request] = dataclasses.field(default_factory=dict)
    error: BaseException | None = None

    def slot(self, k: int) -> U8:
        at = (k % self.slots) * self.size
        return self.group.shared[at : at + self.size]

    def _pieces(self, k: int) -> npt.NDArray[np.int64]:
        if k + 1 >= len(self.starts):
            return np.zeros(0, np.int64)
        return self.order[self.starts[k] : self.starts[k + 1]]

    def _copy(self, k: int, *, into_slot: bool) -> None:
        try:
            idx = self._pieces(k)
            if not len(idx):
                return
            mem, ln, pos = self.mem[idx], self.length[idx], self.spos[idx]
            slot, comm = self.slot(k), self.group.self_comm
            if into_slot:
                copy_runs(self.buf, mem, slot, pos, ln, comm)
            else:
                copy_runs(slot, pos, self.buf, mem, ln, comm)
        except Exception as exc:  # noqa: BLE001 - returned by finish, agreed by the call
            self.error = self.error or exc

    def _enter(self, k: int) -> None:
        self.barriers[k] = self.group.comm.Ibarrier()

    def _passed(self, k: int) -> None:
        req = self.barriers.pop(k, None)
        if req is not None:
            sleep_until_done(req)

    def gather(self, k: int) -> U8:
        """Write round ``k``: copy this rank's pieces into the slot (after barrier
        ``k - 1``); the local aggregator returns the slot once every rank did."""
        self._passed(k - 1)
        self._copy(k, into_slot=True)
        self._enter(k)
        if self.lead:
            self._passed(k)
        return self.slot(k)

    def landing(self, k: int) -> U8:
        """Read round ``k``: the slot its pieces arrive in (free: barrier
        ``k - slots + 1`` passed, every rank copied out round ``k - slots``)."""
        if self.lead:
            self._passed(k - self.slots + 1)
        return self.slot(k)

    def arrived(self, k: int) -> None:
        """Read round ``k`` arrived at the local aggregator (it enters barrier ``k``); the
        others enter it too (they copied out round ``k - 1`` before)."""
        self._enter(k)

    def scatter(self, k: int) -> None:
        """Every rank copies its pieces of read round ``k`` out (after barrier ``k``)."""
        self._passed(k)
        self._copy(k, into_slot=False)

    def finish(self) -> BaseException | None:
        """Complete every barrier entered (a rank leaves only with its copies done)."""
        for k in sorted(self.barriers):
            self._passed(k)
        return self.error
