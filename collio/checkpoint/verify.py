"""What a load checksums and how: planned before any byte is read, summed as the bytes
pass by (a local file's pieces right after each step's read, still in the cache), and
compared in one agreement."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends.failures import storage_errors
from ..collective import Attempt, raise_agreed
from ..file import File
from ..layouts.arrays import ArrayLayout
from ..layouts.base import Segments
from ..waits import sleep_until_done
from . import extents, format
from .chunks import ChunkedReads, Chunks
from .crc import Algo
from .filemap import Reader

__all__ = ["CHUNK", "Checks", "Stored", "Views", "alone", "read_checked", "segments",
           "uncut", "verify", "verify_alone"]  # fmt: skip

I64 = npt.NDArray[np.int64]


class Checks:
    """What this rank checksums at a load, planned before any byte is read: the extents
    its pieces hold whole (``own``: rows of the plan) and its parts of the extents held
    by several ranks (``mine``: rows of ``plan.part``), as (array, lo, hi) within the
    array; their checksums (by ``algo``, the file's) fill ``sums`` (``own``'s first) as
    the bytes pass by."""

    def __init__(self, plan: extents.Plan, rank: int, algo: Algo) -> None:
        self.plan = plan
        self.algo = algo
        self.own = np.flatnonzero(plan.owner == rank)
        pe, plo, phi, prk = plan.part
        self.mine = np.flatnonzero(prk == rank)
        self.aid = np.concatenate([plan.aid[self.own], plan.aid[pe[self.mine]]])
        self.lo = np.concatenate([plan.starts[self.own], plo[self.mine]])
        self.hi = np.concatenate([plan.ends[self.own], phi[self.mine]])
        self.sums = np.zeros(len(self.aid), np.uint32)
        self.done = np.zeros(len(self.aid), bool)

    def from_memory(self, views: Views) -> None:
        """The checksums of the ranges not summed yet, from this rank's pieces."""
        fn = self.algo.fn
        todo = np.flatnonzero(~self.done)
        aid = self.aid[todo]
        first = views.lo[aid]
        rows = zip(aid.tolist(), (self.lo[todo] - first).tolist(),
                   (self.hi[todo] - first).tolist(), strict=True)  # fmt: skip
        # (a memoryview's slice: a tenth of a numpy view's making)
        sums = [fn(views[k][a:b]) for k, a, b in rows]
        self.sums[todo] = sums
        self.done[todo] = True


class Views:
    """Each array's piece as flat bytes in memory order (``arrays[k]`` is contiguous in its
    layout's order: a memoryview, made when first asked for, as only the arrays that some
    check reads need one), and where each starts in its array (``lo``)."""

    __slots__ = ("arrays", "lo", "_made")

    def __init__(self, arrays: list[Any], lo: I64) -> None:
        self.arrays = arrays
        self.lo = lo
        self._made: dict[int, memoryview] = {}

    def __getitem__(self, k: int) -> memoryview:
        got = self._made.get(k)
        if got is None:
            got = self._made[k] = _flat_bytes(self.arrays[k])
        return got


def _flat_bytes(arr: Any) -> memoryview:
    """The bytes of the contiguous ``arr`` in memory order, as a flat memoryview: the
    buffer's own cast (of the transpose where only 'F'-contiguous), cheaper to make than
    numpy's byte view, which a load into a model's hundreds of arrays makes for each;
    numpy's view where the buffer protocol refuses the dtype (datetimes) or the shape
    (no elements)."""
    try:
        return memoryview(arr if arr.flags.c_contiguous else arr.T).cast("B")
    except (TypeError, ValueError, NotImplementedError, BufferError):
        return arr.ravel("K").view(np.uint8).data  # type: ignore[no-any-return]


def segments(plo: I64, phi: I64, clo: I64, chi: I64, chunk: int) -> tuple[I64, I64, I64, I64]:
    """Reads tiling the pieces ``[plo, phi)`` (file offsets, sorted, disjoint), cut at the
    edges of the checked ranges ``[clo, chi)`` (sorted, disjoint, each in a piece) and
    every ``chunk`` bytes within them: (start, end, piece, checked range or -1) of each,
    in file order.  A range's bytes are checksummed right after their read, still in
    the cache, instead of in a second pass over the arrays."""
    if len(plo) == 0:
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY
    n = np.maximum((chi - clo - 1) // chunk, 0)
    first = np.cumsum(n) - n
    step = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first, n) + 1
    grid = np.repeat(clo, n) + chunk * step
    cuts = np.unique(np.concatenate([plo, phi, clo, chi, grid]))
    s, e = cuts[:-1], cuts[1:]
    p = np.searchsorted(plo, s, side="right") - 1
    keep = (p >= 0) & (e <= phi[np.maximum(p, 0)])
    s, e, p = s[keep], e[keep], p[keep]
    if len(clo) == 0:
        return s, e, p, np.full(len(s), -1, np.int64)
    c = np.searchsorted(clo, s, side="right") - 1
    inside = (c >= 0) & (e <= chi[np.maximum(c, 0)])
    return s, e, p, np.where(inside, c, -1)


_EMPTY = np.zeros(0, np.int64)
#: Bytes read (then checksummed) at a time within a checked extent: a few per core's
#: cache, so the checksum reads them from the cache that the read's copy just filled.
CHUNK = 256 << 10


def read_checked(
    be: ChunkedReads, checks: Checks, views: Views, arrays: I64, offs: I64, mine: I64
) -> None:
    """Local: this rank's pieces of ``arrays`` (each one range of its array: ``mine``'s
    (lo, hi) rows, relative to the array at ``offs``), each straight into its array by
    the backend, the checked ranges in them summed as they are read."""
    fn = checks.algo.fn
    sel = arrays[mine[arrays, 1] > mine[arrays, 0]]
    plo, phi = offs[sel] + mine[sel, 0], offs[sel] + mine[sel, 1]
    order = np.argsort(plo, kind="stable")
    sel, plo, phi = sel[order], plo[order], phi[order]
    todo = np.flatnonzero(np.isin(checks.aid, sel) & ~checks.done)
    base = offs[checks.aid[todo]]
    clo, chi = base + checks.lo[todo], base + checks.hi[todo]
    by = np.argsort(clo, kind="stable")
    todo, clo, chi = todo[by], clo[by], chi[by]
    s, e, p, c = segments(plo, phi, clo, chi, CHUNK)
    slot = np.where(c >= 0, todo[np.maximum(c, 0)] if len(todo) else -1, -1)
    # (memoryviews: a slice of one costs a tenth of a numpy view's making)
    bufs = [views[k] for k in sel.tolist()]
    sums = checks.sums.tolist()
    raw = be.be
    # (a local file's reader: its preadv called here, without a method call a step;
    # a short read (the file ends first) read again by the reader, zeros past the end)
    fd = raw.fd if isinstance(raw, Reader) else -1
    preadv = os.preadv
    with storage_errors(raw):
        # (each read split at the chunks' edges here, all at once, and read where
        # stored: a piece across the saving ranks' regions is a read per region)
        off, n, r, within = be.chunks.runs(s, e - s)
        at = s[r] - plo[p[r]] + within  # (offset within the piece)
        rows = zip(off.tolist(), n.tolist(), p[r].tolist(), at.tolist(), slot[r].tolist(),
                   strict=True)  # fmt: skip
        for o, m, k, a, j in rows:
            buf = bufs[k][a : a + m]
            if fd < 0 or preadv(fd, [buf], o) < m:
                raw.read_at(o, np.frombuffer(buf, np.uint8))
            if j >= 0:
                sums[j] = fn(buf, sums[j])
    checks.sums[:] = sums
    checks.done[todo] = True


def verify(
    comm: MPI.Comm,
    f: File | None,
    be: Any,
    checks: Checks,
    crcs: npt.NDArray[np.uint32],
    offs: I64,
    narrays: int,
    error: BaseException | None,
    chunks: Chunks,
) -> npt.NDArray[np.bool_]:
    """Collective: every checksum compared; which arrays differ (the same on every rank).
    Raises ``error`` (this rank's, of its reads) agreed on every rank first.

    The extents a rank's piece held whole were summed by it, those several ranks held
    are combined from their parts' sums; any other extent one rank reads once more.
    All of it agreed in one reduction, waited for sleeping (a rank done early leaves
    the core to those still reading).  The extents read once more are read by ``f``'s
    collective read, or without a file open (None) by this rank alone from ``be``."""
    x = checks.plan
    bad = np.zeros(narrays, bool)
    n_own = len(checks.own)
    bad[x.aid[checks.own[checks.sums[:n_own] != crcs[checks.own]]]] = True
    rank = comm.Get_rank()
    if bool((x.reader >= 0).any()):  # (the same on every rank: every rank plans alike)
        step = Attempt()  # (this rank's own reads fail alone: agreed below)
        with step:
            _check_back(f, be, checks, np.flatnonzero(x.reader == rank), crcs, offs, bad, chunks)
        error = error or step.error
    pe = x.part[0]
    vec = np.zeros(len(pe) + narrays + 1, np.uint32)
    vec[checks.mine] = checks.sums[n_own:]  # (each part's rank alone gives it)
    vec[len(pe) : len(pe) + narrays] = bad
    vec[-1] = error is not None
    sleep_until_done(comm.Iallreduce(MPI.IN_PLACE, [vec, MPI.UINT32_T], op=MPI.BOR))
    if vec[-1]:
        raise_agreed(comm, error, what="checkpoint.load")
    bad = vec[len(pe) : len(pe) + narrays].astype(bool)
    if len(x.joined):
        _check_joined(checks, vec[: len(pe)], crcs, bad)
    return bad


def _check_back(
    f: File | None, be: Any, checks: Checks, rd: I64, crcs: npt.NDArray[np.uint32], offs: I64,
    bad: npt.NDArray[np.bool_], chunks: Chunks,
) -> None:  # fmt: skip
    """The extents ``rd`` of the checks' plan read back (:func:`_read_back`) and their
    checksums compared: the arrays of those that differ marked in ``bad``."""
    x = checks.plan
    lens = x.ends[rd] - x.starts[rd]
    got = _read_back(f, be, offs[x.aid[rd]] + x.starts[rd], lens, chunks)
    bad[x.aid[rd[checks.algo.of_pieces(got, lens) != crcs[rd]]]] = True


def _read_back(
    f: File | None, be: Any, at: I64, lens: I64, chunks: Chunks
) -> npt.NDArray[np.uint8]:
    """The bytes of the ranges ``(at, lens)`` (virtual offsets) this rank reads back, one
    after another (``be`` takes virtual offsets: a :class:`~.chunks.ChunkedReads`)."""
    if f is not None:
        file, length, _, _ = chunks.runs(at, lens)  # (in the ranges' order: as packed)
        back: npt.NDArray[np.uint8] = f.read_all(Segments(file, length))
        return back
    got = np.empty(int(lens.sum()), np.uint8)
    cuts = np.concatenate([[0], np.cumsum(lens)]).tolist()
    with storage_errors(be):
        for i, off in enumerate(at.tolist()):
            be.read_at(off, got[cuts[i] : cuts[i + 1]])
    return got


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    """What a load's checks take from the index, whatever the ranks' pieces: the stored
    extents of the arrays read (every array's at once, ``starts`` within their array
    ``aid``), their checksums, the arrays' sizes and virtual offsets, and the map of
    those to the file.  Taken once per load: a load planned first from this rank's
    pieces alone and then from every rank's plans twice from it."""

    starts: I64
    crcs: npt.NDArray[np.uint32]
    aid: I64
    nbytes: I64
    offs: I64
    chunks: Chunks
    #: the file's checksum
    algo: Algo

    @classmethod
    def of(cls, index: format.Index, wanted: list[tuple[str, ArrayLayout]]) -> Stored:
        # (the index's sizes: each array's shape and dtype were checked against it)
        return cls(*index.stored([name for name, _ in wanted]), index.algo)

    def plan(self, every: I64, *, join: bool = True) -> extents.Plan:
        """Who checks each extent, from the pieces' spans ``every`` ``(rank, array)``;
        without ``join``, no extent checked from several ranks' parts (see
        :func:`~.extents.assign`)."""
        return extents.assign(self.starts, self.aid, self.nbytes, self.offs, every, join=join)


def _check_joined(
    checks: Checks,
    got: npt.NDArray[np.uint32],
    crcs: npt.NDArray[np.uint32],
    bad: npt.NDArray[np.bool_],
) -> None:
    """The extents held by several ranks' pieces, from their parts' checksums (``got``,
    every rank's, combined on every rank alike); marks ``bad``."""
    x = checks.plan
    pe, plo, phi, _ = x.part
    first = np.searchsorted(pe, x.joined)
    count = np.diff(np.append(first, len(pe)))
    crc = checks.algo.fold(got, phi - plo, first, count)
    bad[x.aid[x.joined[crc != crcs[x.joined]]]] = True


def alone(x: extents.Plan, spans: I64, rank: int) -> tuple[extents.Plan, bool]:
    """The checks of a plan made from this rank's spans alone (``x``, planned with
    ``spans[None]``): this rank checks the extents its pieces hold whole; and whether
    its pieces are each one range holding whole extents only (the load at the
    decomposition that saved: no extent is cut by a piece's edge, so no rank needs
    another's part).  Extents no rank holds are read back (:func:`verify_alone`)."""
    mine = x.owner == 0
    lo, hi = spans[x.aid, 0], spans[x.aid, 1]
    cut = (x.starts < hi) & (x.ends > lo) & ~mine  # (within a piece, not whole in it)
    whole_ones = bool(spans[:, 2].all()) and not bool(cut.any())
    none = np.full(len(x.starts), -1, np.int64)
    return extents.Plan(x.starts, x.ends, x.aid, np.where(mine, rank, -1), none), whole_ones


def uncut(st: Stored, spans: I64) -> bool:
    """Whether this rank's pieces (``spans``, a row per array) are each one range and no
    edge of one lies strictly inside a stored extent: :func:`alone`'s answer without its
    plan (a search of the pieces' edges among the extents instead of the owner of every
    extent), so that a rank loading another decomposition than the save's makes no plan
    of its own that the agreement would then drop."""
    if not bool(spans[:, 2].all()):
        return False
    if not len(st.starts):
        return True
    # (the extents in virtual order: each array's, sorted, at its ascending offset)
    base = st.offs[st.aid]
    firsts = base + st.starts
    lasts = base + extents.ends_of(st.starts, st.aid, st.nbytes)
    edges = st.offs[:, None] + spans[:, :2]
    k = np.searchsorted(firsts, edges, side="right") - 1
    kk = np.maximum(k, 0)
    inside = (k >= 0) & (firsts[kk] < edges) & (edges < lasts[kk])
    return not bool(inside.any())


def verify_alone(
    comm: MPI.Comm, be: Any, checks: Checks, crcs: npt.NDArray[np.uint32], offs: I64,
    narrays: int, error: BaseException | None, chunks: Chunks,
) -> npt.NDArray[np.bool_]:  # fmt: skip
    """Collective: :func:`verify` where every rank planned its checks alone (:func:`alone`),
    in one reduction of the errors, the arrays that differ and the extents checked; the
    extents no rank checked (none held them whole: a load of part of an array) are then
    read back, dealt over the ranks in turn, and agreed in a second one."""
    x = checks.plan
    n_own = len(checks.own)
    vec = np.zeros(1 + narrays + len(x.starts), np.uint32)
    vec[0] = error is not None
    vec[1 + x.aid[checks.own[checks.sums[:n_own] != crcs[checks.own]]]] = 1
    vec[1 + narrays + checks.own] = 1
    sleep_until_done(comm.Iallreduce(MPI.IN_PLACE, [vec, MPI.UINT32_T], op=MPI.BOR))
    if vec[0]:
        raise_agreed(comm, error, what="checkpoint.load")
    bad = vec[1 : 1 + narrays].astype(bool)
    left = vec[1 + narrays :] == 0
    if not left.any():  # (the same on every rank)
        return bad
    rd = np.flatnonzero(extents.deal_all(left, comm.Get_size()) == comm.Get_rank())
    step = Attempt()
    with step:
        _check_back(None, be, checks, rd, crcs, offs, bad, chunks)
    more = np.concatenate([[step.error is not None], bad]).astype(np.uint32)
    sleep_until_done(comm.Iallreduce(MPI.IN_PLACE, [more, MPI.UINT32_T], op=MPI.BOR))
    if more[0]:
        raise_agreed(comm, step.error, what="checkpoint.load")
    out: npt.NDArray[np.bool_] = more[1:].astype(bool)
    return out
