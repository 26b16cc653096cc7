"""The only MPI data movement: metadata all-to-all and per-round point-to-point.

Data moves zero-copy where it can: a sender hands MPI a slice of the user's
buffer (or a derived datatype over it), and an aggregator receives straight into
its round buffer with an hindexed/hvector datatype that scatters each source's
bytes to their file positions.  Every datatype made here is freed, in ``finally``,
but the hvectors of the first 64 shapes, which the rounds of later calls send again
(the kept lane's one round makes and owns its own: :class:`collio.keptround.Round`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from .collective import Attempt, agree
from .runs import displacements

__all__ = [
    "alltoallv_i64", "alltoallv_into", "byte_view", "Messages", "Shapes", "group_shapes",
    "make_type",
]  # fmt: skip

I64 = npt.NDArray[np.int64]


def alltoallv_i64(comm: MPI.Comm, send: I64, counts: I64, *, what: str = "") -> tuple[I64, I64]:
    """Collective over `comm`: send ``counts[r]`` consecutive int64 values to rank r.

    Returns the received values (grouped by source) and the count from each source.
    A rank that cannot allocate what it receives (an aggregator gets the metadata of
    every rank's pieces in its domain) makes every rank raise the same error (``what``
    in front), instead of leaving the others in the exchange.
    """
    send = np.ascontiguousarray(send, np.int64)
    counts = np.ascontiguousarray(counts, np.int64)
    rcounts = np.empty_like(counts)
    comm.Alltoall([counts, MPI.INT64_T], [rcounts, MPI.INT64_T])
    step = Attempt()
    recv = np.zeros(0, np.int64)
    with step:
        recv = np.empty(int(rcounts.sum()), np.int64)
    agree(comm, step.error, what=what)
    alltoallv_into(comm, send, counts, recv, rcounts)
    return recv, rcounts


def alltoallv_into(comm: MPI.Comm, send: I64, counts: I64, recv: I64, rcounts: I64) -> None:
    """Collective over `comm`: ``counts[r]`` consecutive int64 values of ``send`` to rank
    r, ``rcounts[r]`` from rank r into ``recv`` (which holds them), grouped by source:
    the exchange of :func:`alltoallv_i64` once both sides know the counts."""
    sdispl, rdispl = displacements(counts), displacements(rcounts)
    # mpi4py 4 switches to MPI-4 large-count calls by itself when counts exceed int
    comm.Alltoallv([send, (counts, sdispl), MPI.INT64_T], [recv, (rcounts, rdispl), MPI.INT64_T])


def make_type(disp: I64, length: I64) -> MPI.Datatype:
    """A committed byte datatype for runs at displacements ``disp`` (relative, sorted)."""
    n = len(disp)
    uniform = bool((length == length[0]).all())
    if uniform and n > 1:
        step = np.diff(disp)
        if bool((step == step[0]).all()):
            return MPI.BYTE.Create_hvector(n, int(length[0]), int(step[0])).Commit()
    if uniform:
        return MPI.BYTE.Create_hindexed_block(int(length[0]), disp.tolist()).Commit()
    return MPI.BYTE.Create_hindexed(length.tolist(), disp.tolist()).Commit()


def byte_view(
    buf: npt.NDArray[np.uint8], offsets: I64, lengths: I64
) -> tuple[Any, MPI.Datatype | None]:
    """An mpi4py buffer spec for the bytes ``buf[o:o+n]`` of each run, in run order.

    Contiguous runs become a plain slice (no datatype); otherwise a derived
    datatype over ``buf`` starting at the first run (the caller frees it).
    """
    first = int(offsets[0])
    total = int(lengths.sum())
    end = offsets + lengths
    if len(offsets) == 1 or bool((offsets[1:] == end[:-1]).all()):
        return [buf[first : first + total], MPI.BYTE], None
    dtype = make_type(offsets - first, lengths)
    return [buf[first:], 1, dtype], dtype


#: Sends of equal runs up to this many bytes are packed with numpy (see Messages.send).
PACK_MAX_RUN = 4096

#: The three buffer shapes of a message's runs (:class:`Shapes`).
CONTIG, VECTOR, OTHER = 0, 1, 2


@dataclasses.dataclass(frozen=True, slots=True)
class Shapes:
    """The runs of each message group as a buffer shape, found once per plan.

    Group ``g`` is a slice of ``total[g]`` bytes from ``first[g]`` (``CONTIG``),
    ``count[g]`` runs of ``block[g]`` bytes every ``stride[g]`` bytes (``VECTOR``: one
    hvector), or anything else (``OTHER``: built from the run arrays per message).
    A kept plan reuses them, so a round posts its messages without a numpy pass over
    each group's runs (a block-cyclic call has thousands of runs per group).
    """

    first: I64
    total: I64
    count: I64
    block: I64
    stride: I64
    kind: I64


def _within(flags: npt.NDArray[np.bool_], lo: I64, hi: I64) -> I64:
    """How many of ``flags[lo[g]:hi[g]]`` are set, for every g (empty when hi <= lo)."""
    c = np.zeros(len(flags) + 1, np.int64)
    np.cumsum(flags, out=c[1:])
    lo = np.clip(lo, 0, len(flags))
    return c[np.clip(hi, lo, len(flags))] - c[lo]


def group_shapes(offsets: I64, lengths: I64, gstart: I64) -> Shapes:
    """:class:`Shapes` of the groups ``offsets[gstart[g]:gstart[g+1]]`` (vectorised)."""
    starts, ends = gstart[:-1], gstart[1:]
    count = ends - starts
    n = len(offsets)
    if n == 0:
        z = np.zeros(len(starts), np.int64)
        return Shapes(z, z, count, z, z, np.full(len(starts), CONTIG, np.int64))
    head = np.minimum(starts, n - 1)
    csum = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=csum[1:])
    total = csum[ends] - csum[starts]
    # pairs (i, i+1) inside a group: i in [start, end - 2]
    gaps = _within(offsets[1:] != (offsets + lengths)[:-1], starts, ends - 1)
    uneven = _within(lengths[1:] != lengths[:-1], starts, ends - 1)
    step = np.diff(offsets)
    turns = _within(step[1:] != step[:-1], starts, ends - 2)
    stride = np.zeros(len(starts), np.int64)
    two = count > 1
    stride[two] = step[head[two]]
    block = lengths[head]
    kind = np.full(len(starts), OTHER, np.int64)
    kind[(uneven == 0) & (turns == 0) & two & (stride >= block)] = VECTOR
    kind[gaps == 0] = CONTIG
    return Shapes(offsets[head], total, count, block, stride, kind)


def pack_vector(
    buf: npt.NDArray[np.uint8],
    first: int,
    count: int,
    block: int,
    stride: int,
    out: npt.NDArray[np.uint8],
) -> npt.NDArray[np.uint8]:
    """Copy ``count`` runs of ``block`` bytes every ``stride`` from ``buf[first:]`` into ``out``."""
    if first < 0 or block < 1 or stride < block or first + (count - 1) * stride + block > len(buf):
        raise ValueError(
            f"runs of {block} bytes every {stride} from {first} ({count} of them) "
            f"do not fit a buffer of {len(buf)} bytes"
        )
    stop = first + count * stride
    if stop <= len(buf):  # (whole strides in the buffer: a reshape, without as_strided's cost)
        src = buf[first:stop].reshape(count, stride)[:, :block]
    else:
        src = np.lib.stride_tricks.as_strided(
            buf[first:], shape=(count, block), strides=(stride, 1), writeable=False
        )
    dest = out[: count * block].reshape(count, block)
    np.copyto(dest, src)
    return dest.reshape(-1)


def shaped(
    buf: npt.NDArray[np.uint8], sh: Shapes, g: int, base: int
) -> tuple[Any, MPI.Datatype | None] | None:
    """The mpi4py buffer spec of group ``g`` over ``buf`` (offsets less ``base``), or
    None for an ``OTHER`` group, and a datatype for the caller to free (or None).  A
    ``VECTOR`` group gets a committed hvector (:func:`_hvector`: most often kept)."""
    kind = int(sh.kind[g])
    if kind == OTHER:
        return None
    first = int(sh.first[g]) - base
    if kind == CONTIG:
        return [buf[first : first + int(sh.total[g])], MPI.BYTE], None
    shape = (int(sh.count[g]), int(sh.block[g]), int(sh.stride[g]))
    kept = _TYPES.get(shape)  # (a kept plan's shapes: found without a call)
    if kept is not None:
        return [buf[first:], 1, kept], None
    dtype, made = _hvector(*shape)
    return [buf[first:], 1, dtype], made


#: Committed hvectors by shape, up to 64 (a kept plan sends the same shapes every call),
#: kept until the process ends: any thread's call, on any communicator, may post with one
#: it took from here, so none is ever freed (past 64 shapes, each message makes its own).
_TYPES: dict[tuple[int, int, int], MPI.Datatype] = {}
_TYPES_LOCK = threading.Lock()


def _hvector(count: int, block: int, stride: int) -> tuple[MPI.Datatype, MPI.Datatype | None]:
    """A committed ``MPI.BYTE`` hvector of this shape, and itself again when the caller
    must free it (None: kept here)."""
    got = _TYPES.get((count, block, stride))
    if got is not None:
        return got, None
    made = MPI.BYTE.Create_hvector(count, block, stride)
    made.Commit()
    with _TYPES_LOCK:
        if (count, block, stride) not in _TYPES and len(_TYPES) < 64:
            _TYPES[count, block, stride] = made
            return made, None
    return made, made


def pack_uniform(
    buf: npt.NDArray[np.uint8], offsets: I64, length: int, out: npt.NDArray[np.uint8]
) -> npt.NDArray[np.uint8]:
    """Copy the runs ``buf[o:o+length]`` one after another into ``out`` (a numpy gather)."""
    first = int(offsets.min())  # (offsets need not be sorted)
    rel = offsets - first
    dest = out[: len(offsets) * length].reshape(len(offsets), length)
    if not bool((rel % length).any()):
        rows = (len(buf) - first) // length
        mat = buf[first : first + rows * length].reshape(rows, length)
        np.take(mat, rel // length, axis=0, out=dest, mode="clip")  # (in range: no buffering)
    else:
        # (a view over only the bytes the runs reach: a batch's buffer spans every
        # item's address, and rows over all of it may hold more bytes than numpy counts)
        stop = int(offsets.max()) + length
        win = np.lib.stride_tricks.sliding_window_view(buf[first:stop], length)
        dest[...] = win[rel]
    return dest.reshape(-1)


class Messages:
    """The point-to-point messages of one round; frees its datatypes when done.

    Posting a message never raises: a message that cannot be built (a datatype MPI
    refuses, memory for its runs) is replaced by a stand-in of the same number of bytes
    from or into a buffer of its own, and the first such error is kept in ``error``.
    The peer's matching message then completes, so a rank failing here leaves nobody
    waiting; the caller hands ``error`` to the call's agreement like an I/O error (the
    stand-in's bytes are zeros for the peer, or dropped here).
    """

    __slots__ = ("comm", "requests", "types", "tag", "error", "_spare")

    def __init__(self, comm: MPI.Comm, tag: int) -> None:
        self.comm = comm
        self.requests: list[MPI.Request] = []
        self.types: list[MPI.Datatype] = []
        self.tag = tag
        self.error: BaseException | None = None
        self._spare: list[npt.NDArray[np.uint8]] = []

    def stand_in(self, start: Any, nbytes: int, peer: int, exc: BaseException) -> None:
        """Post ``nbytes`` plain bytes to or from ``peer`` in place of a failed message
        (zeros: calloc'd pages a send never writes cost nothing until touched)."""
        self.error = self.error or exc
        spare = np.zeros(nbytes, np.uint8)
        self._spare.append(spare)
        self.requests.append(start([spare, MPI.BYTE], peer, self.tag))

    def _post(self, start: Any, spec: Any, dtype: MPI.Datatype | None, peer: int) -> None:
        """Start one message (``start``: ``comm.Isend`` or ``comm.Irecv``); its datatype,
        if any, is kept first so that it is freed even if starting fails."""
        if dtype is not None:
            self.types.append(dtype)
        self.requests.append(start(spec, peer, self.tag))

    def post_fixed(self, start: Any, buf: Any, peer: int, first: int, nbytes: int,
                   dtype: MPI.Datatype | None) -> None:  # fmt: skip
        """Start one message of ``buf`` from byte ``first`` (``start``: ``comm.Isend``
        or ``comm.Irecv``): ``nbytes`` plain bytes, or one ``dtype`` (a kept type, not
        freed here); a stand-in of ``nbytes`` if it cannot be started."""
        try:
            if dtype is None:
                spec = [buf[first : first + nbytes], MPI.BYTE]
            else:
                spec = [buf[first:], 1, dtype]
            self.requests.append(start(spec, peer, self.tag))
        except Exception as exc:  # noqa: BLE001 - agreed in the completion
            self.stand_in(start, nbytes, peer, exc)

    def send(
        self,
        dest: int,
        buf: npt.NDArray[np.uint8],
        offsets: I64,
        lengths: I64,
        scratch: npt.NDArray[np.uint8] | None = None,
    ) -> int:
        """Send the runs; small equal runs are first packed into ``scratch`` (if given).

        Returns the bytes of ``scratch`` used (kept until the messages complete).

        MPICH sends a datatype of many small blocks slowly (it packs them through its
        shared-memory cells); numpy packs them at copy speed into a kept buffer and
        the packed message then goes in one copy.  Longer runs gain nothing, so only
        runs up to :data:`PACK_MAX_RUN` are packed (docs/design.md).  (A fresh buffer
        per round would cost more than it saves: page faults.)
        """
        try:
            n = len(lengths)
            if scratch is not None and n > 1 and int(lengths[0]) <= PACK_MAX_RUN:
                apart = not bool((offsets[1:] == (offsets + lengths)[:-1]).all())  # else a slice
                equal = bool((lengths == lengths[0]).all()) and int(lengths.sum()) <= len(scratch)
                if apart and equal:
                    packed = pack_uniform(buf, offsets, int(lengths[0]), scratch)
                    self._post(self.comm.Isend, [packed, MPI.BYTE], None, dest)
                    return len(packed)
            self._post(self.comm.Isend, *byte_view(buf, offsets, lengths), dest)
        except Exception as exc:  # noqa: BLE001 - kept in self.error, agreed by the caller
            self.stand_in(self.comm.Isend, int(np.sum(lengths)), dest, exc)
        return 0

    def send_group(
        self,
        dest: int,
        buf: npt.NDArray[np.uint8],
        sh: Shapes,
        g: int,
        base: int,
        runs: Callable[[], tuple[I64, I64]],
        scratch: npt.NDArray[np.uint8] | None = None,
    ) -> int:
        """:meth:`send` of group ``g`` of a plan's :class:`Shapes` (``runs()`` gives the
        group's offsets and lengths, less ``base``, when its shape is ``OTHER``)."""
        try:
            kind, block, total = int(sh.kind[g]), int(sh.block[g]), int(sh.total[g])
            if kind == VECTOR and scratch is not None and block <= PACK_MAX_RUN:
                if total <= len(scratch):
                    first, count, stride = (
                        int(sh.first[g]) - base,
                        int(sh.count[g]),
                        int(sh.stride[g]),
                    )
                    packed = pack_vector(buf, first, count, block, stride, scratch)
                    self._post(self.comm.Isend, [packed, MPI.BYTE], None, dest)
                    return total
            got = shaped(buf, sh, g, base)
            if got is None:
                offsets, lengths = runs()
                return self.send(dest, buf, offsets, lengths, scratch)  # (stands in itself)
            if got[1] is not None:  # (as _post, inline: one message per group a round)
                self.types.append(got[1])
            self.requests.append(self.comm.Isend(got[0], dest, self.tag))
            return 0
        except Exception as exc:  # noqa: BLE001 - kept in self.error, agreed by the caller
            self.stand_in(self.comm.Isend, int(sh.total[g]), dest, exc)
            return 0

    def recv_group(
        self,
        source: int,
        buf: npt.NDArray[np.uint8],
        sh: Shapes,
        g: int,
        base: int,
        runs: Callable[[], tuple[I64, I64]],
    ) -> None:
        """:meth:`recv` of group ``g`` of a plan's :class:`Shapes` (see :meth:`send_group`)."""
        try:
            got = shaped(buf, sh, g, base)
            if got is None:
                offsets, lengths = runs()
                self.recv(source, buf, offsets, lengths)  # (stands in itself)
                return
            if got[1] is not None:  # (as send_group)
                self.types.append(got[1])
            self.requests.append(self.comm.Irecv(got[0], source, self.tag))
        except Exception as exc:  # noqa: BLE001 - kept in self.error, agreed by the caller
            self.stand_in(self.comm.Irecv, int(sh.total[g]), source, exc)

    def recv(self, source: int, buf: npt.NDArray[np.uint8], offsets: I64, lengths: I64) -> None:
        """Receive the runs straight into ``buf`` (a datatype when they are apart).

        Not packed, unlike :meth:`send`: spreading packed runs with numpy made writes
        slower than MPICH filling the datatype itself (docs/design.md).
        """
        try:
            self._post(self.comm.Irecv, *byte_view(buf, offsets, lengths), source)
        except Exception as exc:  # noqa: BLE001 - kept in self.error, agreed by the caller
            self.stand_in(self.comm.Irecv, int(np.sum(lengths)), source, exc)

    def done(self) -> bool:
        """Whether every message has completed (``Testall``: MPI progresses meanwhile);
        :meth:`wait` still frees the datatypes."""
        return not self.requests or bool(MPI.Request.Testall(self.requests))

    def wait(self) -> None:
        try:
            if self.requests:
                MPI.Request.Waitall(self.requests)
        finally:
            self.free()

    def free(self) -> None:
        for t in self.types:
            t.Free()
        self.types.clear()
        self.requests.clear()
        self._spare.clear()


@contextmanager
def messages(comm: MPI.Comm, tag: int) -> Iterator[Messages]:
    """Post messages inside the block; they complete (and types are freed) on exit."""
    msgs = Messages(comm, tag)
    try:
        yield msgs
    except BaseException:
        msgs.free()
        raise
    msgs.wait()
