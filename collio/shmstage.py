"""The intra-node stage of two-level aggregation in shared memory.

Each local group (a local aggregator and the ranks that hand it their pieces, all on
one node) shares one window (``MPI.Win.Allocate_shared``) at its local aggregator:
a few staging slots (:func:`~collio.aggregators.stage.slots`), each one round's bytes of
the group.  Every rank copies
its own pieces of a round into (for reads: out of) their places in the round's slot,
so the copies run on every core of the node at once instead of one local aggregator
receiving every piece in messages, and pieces of a few hundred bytes cost a numpy
copy each instead of a datatype block; the local aggregator's messages to the
file-domain aggregators go from, and come into, the slots.

Flags in the window order it all, one int64 per rank, each saying how far its rank got
(no MPI call needs the others' progress: a rank sees a flag the moment it is set):

* writes: a rank copies its pieces of round ``k`` into their slot once the local
  aggregator reached round ``k - 1``, then raises its flag to ``k``; the local
  aggregator reaches round ``k`` only once the sends of round ``k - slots + 1``
  completed (so a slot is filled again only after its round went out: ``slots - 1``
  rounds of sends in flight), copies its own pieces, and sends round ``k`` once every
  flag reached it; a call's first ``slots`` rounds fill without waiting;
* reads: each rank of the group receives the group's messages of some domains into
  the slot (:func:`~collio.aggregators.stage.holders`), raises its flag to ``k`` once its
  messages of round ``k`` completed, and copies its pieces of round ``k`` out once every
  flag reached ``k``, while the messages of round ``k + 1`` are in flight; so a rank at
  ``k`` copied out round ``k - 1``, and a rank receives round ``k`` into a slot only
  once every flag reached ``k - slots + 1``.

The windows and the groups' communicators are kept with the communicator (an MPI
attribute, freed with it); a window only grows, at planning (an agreed step).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .aggregators.nodes import LocalGroups
from .waits import WAIT_CAP, WAIT_FIRST, WAIT_YIELD

__all__ = ["Blocks", "Group", "ShmStage", "blocks", "copy_blocks", "copy_runs", "group_of"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
#: Run lengths up to this many distinct ones are copied with numpy, one pass each;
#: more go through MPI's datatype engine (one call whatever the runs).
NUMPY_LENGTHS = 8
#: Runs of one length copy span by span (one pass) while one side is at most this many
#: spans of runs that follow each other ...
MAX_SPANS = 64
#: ... of at least this many runs each on average; else they are gathered, then scattered.
SPAN_RUNS = 16
#: A round whose pieces make at most this many strided blocks (:func:`blocks`) copies
#: block by block; one of more goes through :func:`copy_runs`.
MAX_BLOCKS = 64
_TAG = 0x2C02
_LINE = 64  # bytes: each rank's flag on a cache line of its own
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_keyval: int | None = None
_lock = threading.Lock()


@dataclasses.dataclass(slots=True, eq=False)
class Group:
    """One local group's communicator (its local aggregator is rank 0) and window.

    The window starts with one cache line per rank of the group, whose first int64 is
    the rank's flag (see :class:`ShmStage`); the staging slots follow (``shared``).
    """

    comm: MPI.Intracomm
    self_comm: MPI.Intracomm  # private: local copies through MPI match nobody else's
    win: MPI.Win | None = None
    nbytes: int = 0
    shared: U8 = dataclasses.field(default_factory=lambda: np.zeros(0, np.uint8))
    flags: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    calls: int = 0  # the group's two-level calls so far (the same on each of its ranks)

    def ensure(self, nbytes: int) -> None:
        """Collective over the group (the same ``nbytes`` on each of its ranks): a window
        of at least ``nbytes`` of slots at the local aggregator."""
        if self.win is not None and nbytes <= self.nbytes:
            return
        self._free_window()
        size = self.comm.Get_size()
        mine = _LINE * size + nbytes if self.comm.Get_rank() == 0 else 0
        self.win = MPI.Win.Allocate_shared(mine, 1, comm=self.comm)
        # (a passive epoch for Win.Sync, the memory barrier around the flags)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        buf, _ = self.win.Shared_query(0)
        whole = np.asarray(buf).view(np.uint8)  # (mpi4py's buffer: numpy-readable)
        self.flags = whole[: _LINE * size].view(np.int64)[:: _LINE // 8]
        self.shared, self.nbytes = whole[_LINE * size :], nbytes
        # (MPI leaves new shared memory undefined: each rank zeroes its flag, and no rank
        # reads the flags before every rank has)
        self.flags[self.comm.Get_rank()] = 0
        self.win.Sync()
        self.comm.Barrier()

    def _free_window(self) -> None:
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
        self.win, self.nbytes = None, 0
        self.shared, self.flags = np.zeros(0, np.uint8), np.zeros(0, np.int64)

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


def _spans(buf: U8, offsets: I64, size: int) -> I64 | None:
    """Where the runs' maximal spans start (runs that follow each other in ``buf`` are
    one span), and their end (``n``) last; None when there are :data:`MAX_SPANS` or
    more, or several of fewer than :data:`SPAN_RUNS` runs each (a numpy call per span
    would cost more than the gather it saves)."""
    n = len(offsets)
    if not buf.flags.c_contiguous:
        return None
    breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + size) + 1
    if len(breaks) >= MAX_SPANS or (len(breaks) and (len(breaks) + 1) * SPAN_RUNS > n):
        return None
    return np.concatenate(([0], breaks, [n])).astype(np.int64)


def _rows_at(buf: U8, first: int, n: int, size: int) -> npt.NDArray[np.uint8]:
    return buf[first : first + n * size].reshape(n, size)


def _copy_equal(src: U8, soff: I64, dst: U8, doff: I64, size: int) -> None:
    """Runs of one length, in one pass: when either side is a few spans (a member's
    pieces of a round are, in its own buffer), a copy per span between those rows and
    the other side's; else gathered into rows and scattered (two passes)."""
    if len(soff) == 0:
        return
    cuts = _spans(dst, doff, size)
    if cuts is not None:
        mat, idx = _row_view(src, soff, size, False)
        # np.take first makes its input C-contiguous: on overlapping rows that is a copy
        # of every row the view has (a run's bytes at each byte of the buffer), so those
        # are picked by indexing, which reads only the rows asked for
        whole = bool(mat.flags.c_contiguous)
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):  # (few spans)
            out = _rows_at(dst, int(doff[a]), b - a, size)
            if whole:
                np.take(mat, idx[a:b], axis=0, out=out, mode="clip")  # (in range: unbuffered)
            else:
                out[...] = mat[idx[a:b]]
        return
    cuts = _spans(src, soff, size)
    mat, idx = _row_view(dst, doff, size, True)
    if cuts is None:
        smat, sidx = _row_view(src, soff, size, False)
        mat[idx] = smat[sidx]
        return
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):  # (few spans)
        mat[idx[a:b]] = _rows_at(src, int(soff[a]), b - a, size)


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


@dataclasses.dataclass(frozen=True, slots=True)
class Blocks:
    """A rank's pieces of each round of a two-level call as strided blocks, made once
    with its plan: block ``b`` is ``count[b]`` pieces of ``size[b]`` bytes, the i-th at
    ``mem[b] + i * mstep[b]`` in the rank's buffer and ``pos[b] + i * pstep[b]`` in the
    round's slot.  Round ``k``'s blocks are ``first[k]:first[k+1]``; a round of more than
    :data:`MAX_BLOCKS` has none (:attr:`whole` False: its pieces go run by run)."""

    mem: I64
    pos: I64
    count: I64
    size: I64
    mstep: I64
    pstep: I64
    first: I64
    whole: npt.NDArray[np.bool_]

    @property
    def nbytes(self) -> int:
        parts = (self.mem, self.pos, self.count, self.size, self.mstep, self.pstep, self.first)
        return sum(a.nbytes for a in parts) + self.whole.nbytes


def blocks(mem: I64, pos: I64, length: I64, starts: I64) -> Blocks:
    """Pieces (in the order a rank copies them, round ``k``'s at ``starts[k]:starts[k+1]``)
    cut into blocks of equal pieces at equal steps on both sides.

    A rank's pieces of a round are a few such progressions in the common layouts (a
    column block's rows of one domain: one step in its buffer, another in the slot), so a
    round copies in a few strided numpy assignments of whole rows, where a copy run by
    run first finds its spans and gathers rows by index every call.  Piece ``i + 1``
    starts a block when its length differs from piece ``i``'s, when the step into it
    differs from the step into piece ``i`` (so a block's steps are all its first one's),
    when the step into it would overlap (less than a piece, either side), or when it
    starts a round.
    """
    n = len(mem)
    nr = len(starts) - 1
    cut = np.zeros(n + 1, bool)
    cut[0] = cut[n] = True
    cut[starts] = True
    if n > 1:
        dm, dp = np.diff(mem), np.diff(pos)
        cut[1:n] |= (length[1:] != length[:-1]) | (dm < length[:-1]) | (dp < length[:-1])
        cut[2:n] |= (dm[1:] != dm[:-1]) | (dp[1:] != dp[:-1])
    at = np.flatnonzero(cut).astype(np.int64)
    a, count = at[:-1], np.diff(at)
    single = count == 1
    nxt = np.minimum(a + 1, max(n - 1, 0))
    size = length[a] if n else np.zeros(0, np.int64)
    mstep = np.where(single, size, mem[nxt] - mem[a]) if n else size
    pstep = np.where(single, size, pos[nxt] - pos[a]) if n else size
    first = np.searchsorted(a, starts[:nr], side="left").astype(np.int64)
    first = np.concatenate((first, [len(a)])).astype(np.int64)
    whole = np.diff(first) <= MAX_BLOCKS
    return Blocks(
        mem[a] if n else size, pos[a] if n else size, count, size, mstep, pstep, first, whole
    )


def _strided(buf: U8, at: int, count: int, size: int, step: int, writeable: bool) -> Any:
    if step == size:
        return buf[at : at + count * size].reshape(count, size)
    return np.lib.stride_tricks.as_strided(
        buf[at:], shape=(count, size), strides=(step, 1), writeable=writeable
    )


def copy_blocks(bl: Blocks, k: int, buf: U8, slot: U8, *, into_slot: bool) -> None:
    """Copy round ``k``'s blocks between ``buf`` (contiguous) and ``slot``: a strided
    numpy assignment each (at most :data:`MAX_BLOCKS`)."""
    lo, hi = int(bl.first[k]), int(bl.first[k + 1])
    cols = (bl.mem, bl.pos, bl.count, bl.size, bl.mstep, bl.pstep)
    for m, p, c, z, ms, ps in zip(*(x[lo:hi].tolist() for x in cols), strict=True):
        if into_slot:
            _strided(slot, p, c, z, ps, True)[...] = _strided(buf, m, c, z, ms, False)
        else:
            _strided(buf, m, c, z, ms, True)[...] = _strided(slot, p, c, z, ps, False)


@dataclasses.dataclass(slots=True)
class ShmStage:
    """A :class:`~collio.rounds.Stage` over a group's window for one call.

    ``order``/``starts``: this rank's pieces by round; ``spos``: each piece's place in
    its round's slot of ``size`` bytes.  Errors of its copies are kept (the rounds go on:
    every flag is still raised) and returned by :meth:`finish`.

    Each rank of the group tells how far it got in its flag in the window, ``call``
    (this call's number) times 2**32 plus the round plus one, so that a flag from an
    earlier call is below every value this call waits for; a rank waits for another's
    flag yielding the core, then sleeping, as :func:`~collio.waits.sleep_until_done`
    does for MPI.
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
    slots: int
    direct: npt.NDArray[np.bool_] | None = None  # (:class:`~collio.rounds.Stage`)
    blocks: Blocks | None = None  # (None: every round run by run)
    call: int = 0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.group.calls += 1
        self.call = self.group.calls << 32

    def slot(self, k: int) -> U8:
        at = (k % self.slots) * self.size
        return self.group.shared[at : at + self.size]

    def _pieces(self, k: int) -> npt.NDArray[np.int64]:
        if k + 1 >= len(self.starts):
            return np.zeros(0, np.int64)
        return self.order[self.starts[k] : self.starts[k + 1]]

    def _copy(self, k: int, *, into_slot: bool) -> None:
        try:
            bl = self.blocks
            if bl is not None and k < len(bl.whole) and bool(bl.whole[k]):
                copy_blocks(bl, k, self.buf, self.slot(k), into_slot=into_slot)
                return
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

    def _raise(self, k: int) -> None:
        """Tell the group this rank reached point ``k`` (its copies before are visible)."""
        group = self.group
        assert group.win is not None
        group.win.Sync()
        group.flags[group.comm.Get_rank()] = self.call + k + 1

    def _wait(self, k: int, *, everyone: bool) -> None:
        """Wait until the local aggregator (or every rank of the group) reached ``k``."""
        if k < 0:
            return
        group, want = self.group, self.call + k + 1
        flags = group.flags if everyone else group.flags[:1]
        assert group.win is not None
        end, delay = time.perf_counter() + WAIT_YIELD, WAIT_FIRST
        while not bool((flags >= want).all()):
            group.comm.Iprobe()  # (MPI's progress for this rank's messages meanwhile)
            if time.perf_counter() < end:
                _yield()
            else:
                time.sleep(delay)
                delay = min(2 * delay, WAIT_CAP)
        group.win.Sync()

    def gather(self, k: int) -> U8:
        """Write round ``k``: copy this rank's pieces into the slot once the local
        aggregator reached round ``k - 1`` (the slot's earlier round was sent); the local
        aggregator returns the slot once every rank copied."""
        if not self.lead and k >= self.slots:  # (the call's first rounds find their slots free)
            self._wait(k - 1, everyone=False)
        self._copy(k, into_slot=True)
        self._raise(k)
        if self.lead:
            self._wait(k, everyone=True)
        return self.slot(k)

    def landing(self, k: int) -> U8:
        """Read round ``k``: the slot its pieces arrive in (free: every rank reached
        ``k - slots + 1``, so copied out round ``k - slots``).  Every rank of the group
        may receive a part of a read round (:func:`~collio.aggregators.stage.holders`)."""
        self._wait(k - self.slots + 1, everyone=True)
        return self.slot(k)

    def arrived(self, k: int) -> None:
        """Read round ``k`` arrived (at the local aggregator: in the slot; elsewhere
        this rank copied out round ``k - 1`` before)."""
        self._raise(k)

    def scatter(self, k: int) -> None:
        """Every rank copies its pieces of read round ``k`` out, once every rank of the
        group has its part of the round in the slot."""
        self._wait(k, everyone=True)
        self._copy(k, into_slot=False)

    def finish(self) -> BaseException | None:
        """This rank's first error in the stage (its flags need no completing: the
        call's completion orders the next call's copies after this one's messages)."""
        return self.error
