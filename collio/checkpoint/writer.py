"""The writing half of ``save``: the pieces (each rank its own ranges, or through the
two-phase exchange), the checksums, the index at the end, one commit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends.failures import storage_errors
from ..collective import Attempt, agree, any_flag, raise_agreed
from ..errors import BackendError, LayoutError, OverlapError
from ..file import open as _open
from ..layouts.base import Segments
from ..runs import displacements
from ..waits import sleep_until_done
from . import format
from .crc import Algo, for_version
from .save import I64, Plan
from .save import at as at_

__all__ = ["ready", "write"]


def algo() -> Algo:
    """The checksum a save plans to write (:attr:`.save.Plan.algo`): its format version's."""
    return for_version(format.VERSION)


#: Whether a save sums its extents.  Off only in the benchmark, which measures what the
#: checksums cost a save by a save without them (a file saved so fails every load).
CHECKSUMS = True


def _crc_owned(plan: Plan, rank: int) -> npt.NDArray[np.uint32]:
    """Checksums of the extents this rank's pieces cover, from its memory, in extent order
    (one library call per extent, each releasing the GIL while it sums)."""
    assert plan.extents is not None
    x = plan.extents
    mine = np.flatnonzero(x.owner == rank)
    if not CHECKSUMS:
        return np.zeros(len(mine), np.uint32)
    got = np.empty(len(mine), np.uint32)
    fn = plan.algo.fn
    views: dict[int, tuple[memoryview, int]] = {}
    rows = zip(x.aid[mine].tolist(), x.starts[mine].tolist(), x.ends[mine].tolist(), strict=True)
    for i, (k, a, b) in enumerate(rows):
        if k not in views:  # (a piece's bytes, from its first byte within its array)
            e = plan.entries[k]
            views[k] = (e.raw().data, int(plan.spans[rank, k, 0]))
        buf, lo = views[k]
        got[i] = fn(buf[a - lo : b - lo])
    return got


def _sums(comm: MPI.Comm, plan: Plan, rank: int) -> npt.NDArray[np.uint32]:
    """Collective: :func:`_crc_owned`, its errors agreed (a rank failing alone must not
    leave the others in the gather of :func:`_tail`)."""
    step = Attempt()
    got = np.zeros(0, np.uint32)
    with step:
        got = _crc_owned(plan, rank)
    if any_flag(comm, step.error is not None, patient=True):
        raise_agreed(comm, step.error, what="checkpoint.save")
    return got


def _read_back_runs(plan: Plan, rank: int) -> tuple[I64, I64]:
    """(file offsets, lengths) of the extents this rank reads back, in extent order."""
    assert plan.extents is not None
    x = plan.extents
    mine = np.flatnonzero(x.reader == rank)
    lens = x.ends[mine] - x.starts[mine]
    file, length, _, _ = plan.chunks().runs(plan.offsets[x.aid[mine]] + x.starts[mine], lens)
    return file, length


def _index(plan: Plan, crc: npt.NDArray[np.uint32], at: int | None = None, pad: int = 0) -> bytes:
    """Extent table, JSON index and trailer, as stored from ``at`` (``plan.data_end``);
    the JSON padded with spaces to ``pad`` bytes where given (a size fixed before the
    checksums, which the JSON holds one of, are known)."""
    e = plan.entries
    assert plan.extents is not None
    table = np.zeros(len(plan.extents.starts), format.EXTENT)
    table["start"] = plan.extents.starts
    table["crc"] = crc
    table["file"] = plan.files()
    held = plan.pieces >= 0
    one = np.where(held.sum(axis=0) == 1, plan.pieces.max(axis=0), -1)
    arrays = format.describe(
        [x.name for x in e],
        [x.shape for x in e],
        [x.layout.dtype for x in e],
        [x.layout.order for x in e],
        np.where(plan.whole >= 0, plan.whole, one),
        [x.replicated for x in e],
        plan.extents.counts(len(e)).tolist(),
    )
    idx = format.Index(arrays, plan.metadata, table, plan.version)
    start = plan.data_end if at is None else at
    tbytes, doc = idx.to_bytes(start)
    doc = doc.ljust(pad)  # (JSON allows the spaces after the document)
    off = start + len(tbytes)
    return tbytes + doc + format.trailer_bytes(off, len(doc), idx.algo.of(doc), idx.version)


def write(
    comm: MPI.Intracomm,
    target: Any,
    plan: Plan,
    hints: Any,
    options: dict[str, Any],
    *,
    early: bool = True,
) -> None:
    """Collective over `comm`: write the plan's pieces, their checksums and the index; commit.

    The target is opened with ``atomic_commit``: until the close, the bytes go to a
    temporary (or an open multipart upload), so a failure on any rank, or a killed
    job, leaves the previous checkpoint as it was.

    Where the backend takes later partial writes (a file), the data goes first; each
    rank then starts the disk on it (:meth:`~collio.File._flush_soon`) and checksums
    its pieces from memory while the disk writes, pieces that are not one range being
    read back for theirs; the index follows, and the close's fsync waits for what is
    left (without ``early``, no flush is started before that fsync: an async save's,
    whose flush would run in a thread at the job's priority, beside its compute).
    Otherwise (S3: an object's size is fixed by its first write) the checksums come
    first and the whole checkpoint is one ``write_all_many``; where some pieces are not
    one range, the aggregators sum those extents from the windows they upload and the
    index follows in parts of its own (:func:`_uploaded`).

    The arrays :func:`direct` allows are written by each rank itself (``disjoint``:
    no exchange, where the backend lets ranks write their own ranges; S3 aggregates
    them into its parts all the same); the others go through the two-phase exchange.
    """
    rank = comm.Get_rank()
    step = Attempt()
    opened: Any = None
    with step:  # (on async_save's thread too: a rank failing alone must not strand the rest)
        ready(plan, rank)
        if plan.error is not None:
            raise plan.error
        # (hints one rank cannot parse raise here, agreed, not alone before the open;
        # without ``early`` no flush at all before the close: the rounds of two-phase
        # pieces would otherwise start fdatasyncs on the file's flush thread, at the
        # job's priority)
        opened = _atomic(hints) if early else _atomic(hints).replace(early_flush=False)
    room = None
    with step:  # (an object whose pieces are summed as uploaded: its size and parts first)
        if step.error is None and plan.reads_back:
            room = _room(plan, target, opened, options)
            if room is not None:
                options = room[2]
    if any_flag(comm, step.error is not None, patient=True):  # (before the target is touched)
        raise_agreed(comm, step.error, what="checkpoint.save")
    with _open(target, "w", comm=comm, hints=opened, **_spare(opened, target, options)) as f:
        assert plan.items is not None  # (ready() made them, or raised agreed)
        fast, slow = plan.items
        if room is not None:
            _uploaded(f, plan, fast, slow, room[0], room[1])
            return
        if plan.reads_back:  # before any byte is written
            _check_readable(f)
        if not f.backend.partial_write and not plan.reads_back:
            tail = _tail(f.comm, plan, _sums(f.comm, plan, rank))
            with _entries_named(plan):
                f.write_all_many([*fast, *slow, tail], _disjoint=not slow)
            return
        _reserve(f, plan.data_end, _holes(plan), plan)
        if early:
            f._flush_soon()  # (each rank's data to the disk as soon as it wrote it)
        f.write_all_many(fast, _disjoint=True)
        if slow:  # (the same arrays on every rank: plan.direct is agreed)
            with _entries_named(plan):
                f.write_all_many(slow)
        crcs = _sums(f.comm, plan, rank)  # (while the disk writes)
        if plan.reads_back:
            offs, lens = _read_back_runs(plan, rank)
            back = f.read_all(Segments(offs, lens))
            sums = plan.algo.of_pieces(back, lens) if CHECKSUMS else np.zeros(len(lens), np.uint32)
            crcs = np.concatenate([crcs, sums])
        f.write_all(*_tail(f.comm, plan, crcs))


def _room(
    plan: Plan, target: Any, hints: Any, options: dict[str, Any]
) -> tuple[int, int, dict[str, Any]] | None:
    """Local, alike on every rank: for a target that cannot be read while written but
    can take a second call after the data (an S3 object: ``room_after``), where the
    index goes, the JSON's padded length, and the open's options; None for others."""
    from ..backends import get_backend, infer_backend

    bcls = get_backend(options.get("backend") or infer_backend(target))
    room_after = getattr(bcls, "room_after", None)
    if bcls.partial_write or room_after is None:
        return None
    assert plan.extents is not None
    # (the JSON's length once the checksums are in: at most as long as with zeros and
    # the extent table's own checksum ten digits longer)
    table_and_doc = len(_index(plan, np.zeros(len(plan.extents.starts), np.uint32)))
    pad = table_and_doc - format.TRAILER.size - len(plan.extents.starts) * format.EXTENT.itemsize
    pad += 10 + 20  # (and the table's offset, as yet unknown, twenty digits at most)
    tail = len(plan.extents.starts) * format.EXTENT.itemsize + pad + format.TRAILER.size
    # (``backend`` is the open's own argument, not one of the backend's options)
    own = {k: v for k, v in options.items() if k != "backend"}
    at, sized = room_after(plan.data_end, tail, hints, own)
    return at, pad, {**options, **sized}


def _uploaded(f: Any, plan: Plan, fast: list[Any], slow: list[Any], at: int, pad: int) -> None:
    """Collective: a save to a target that cannot be read back while it is written (S3),
    with pieces that are not one range: the data in one call, the aggregators summing
    the extents that need a read-back from each window they upload (every byte as the
    target will hold it, by ``f.backend.watch``); the parts' sums gathered and combined
    into each extent's on rank 0; then the index, in a second call to parts apart."""
    assert plan.extents is not None
    x = plan.extents
    back = np.flatnonzero(x.reader >= 0)
    lens = x.ends[back] - x.starts[back]
    file, length, src, within = plan.chunks().runs(plan.offsets[x.aid[back]] + x.starts[back], lens)
    order = np.argsort(file, kind="stable")
    runs = (file[order], length[order], src[order], within[order])
    seen = _Seen(runs, plan.algo)
    f.backend.watch = seen
    try:
        f.write_all_many([*fast, *slow], _disjoint=False)
    finally:
        f.backend.watch = None
    crcs = _sums(f.comm, plan, f.comm.Get_rank())
    sums = _combined(f.comm, seen, lens)
    mine = np.flatnonzero(x.reader[back] == f.comm.Get_rank())
    f.write_all(*_tail(f.comm, plan, np.concatenate([crcs, sums[mine]]), at, pad))


class _Seen:
    """``watch`` of an upload: the checksum of each part of a summed extent in each window
    (the extent, where the part starts in it, its length, its checksum), kept in order."""

    def __init__(self, runs: tuple[I64, I64, I64, I64], sums: Algo) -> None:
        self.file, self.length, self.src, self.within = runs
        self.ends = self.file + self.length
        self.rows: list[tuple[int, int, int, int]] = []
        self.error: BaseException | None = None
        self.algo = sums
        self.fn = sums.fn

    def __call__(self, offset: int, buf: npt.NDArray[np.uint8]) -> None:
        try:
            lo, hi = offset, offset + len(buf)
            first = int(np.searchsorted(self.ends, lo, side="right"))
            last = int(np.searchsorted(self.file, hi, side="left"))
            view = buf.data
            # (one sum per extent's part in the window: extents are cut at a grid of
            # megabytes, so these are few per window)
            for j in range(first, last):
                a, b = max(int(self.file[j]), lo), min(int(self.ends[j]), hi)
                if b > a:
                    w = int(self.within[j]) + a - int(self.file[j])
                    got = self.fn(view[a - lo : b - lo])
                    self.rows.append((int(self.src[j]), w, b - a, got))
        except Exception as exc:  # noqa: BLE001 - agreed after the call
            self.error = self.error or exc


def _combined(comm: MPI.Comm, seen: _Seen, lens: I64) -> npt.NDArray[np.uint32]:
    """Collective: each summed extent's checksum (every rank gets all of them), from the
    sums of its parts that every aggregator saw; a range no window held (no rank wrote
    there: zeros) summed as zeros; errors agreed.

    The windows' errors are agreed as text before anything is gathered (an exception
    that does not pickle would fail one rank's gather alone), and the others sleep
    while rank 0 folds: in an async save this runs on a thread beside the job's
    compute, which a polling wait would take a core from."""
    from ..collective import bcast_outcome
    from ..waits import quiet_barrier

    if any_flag(comm, seen.error is not None, patient=True):
        raise_agreed(comm, seen.error, what="checkpoint.save")
    every = comm.gather(np.array(seen.rows, np.int64).reshape(-1, 4), root=0) or []
    got, step = None, Attempt()
    if comm.Get_rank() == 0:
        with step:
            got = _fold(np.concatenate(every), lens, seen.algo)
    quiet_barrier(comm)
    return np.asarray(bcast_outcome(comm, got, step.error, what="checkpoint.save"), np.uint32)


def _fold(rows: I64, lens: I64, sums: Algo) -> npt.NDArray[np.uint32]:
    """Each extent's checksum (by ``sums``) from its parts' ``(extent, start, length,
    crc)``, the gaps between them zeros, folded in order (:func:`~.crc.fold`)."""
    rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
    ext, start, n = rows[:, 0], rows[:, 1], rows[:, 2]
    # (the gaps: before each part, after its extent's previous part or the extent's start)
    prev_end = np.where(np.r_[True, ext[1:] != ext[:-1]], 0, np.r_[0, start[:-1] + n[:-1]])
    if bool((start < prev_end).any()):  # (a range summed twice: its sum would be wrong)
        k = int(np.flatnonzero(start < prev_end)[0])
        raise BackendError(
            f"checkpoint.save: extent {int(ext[k])} was summed twice around byte "
            f"{int(start[k])} of it; nothing is committed"
        )
    last = np.zeros(len(lens), np.int64)
    np.maximum.at(last, ext, start + n)
    tail = np.flatnonzero(last < lens)
    hole = start > prev_end
    gaps = list(zip(
        np.r_[ext[hole], tail].tolist(), np.r_[prev_end[hole], last[tail]].tolist(),
        np.r_[(start - prev_end)[hole], (lens - last)[tail]].tolist(), strict=True,
    ))  # fmt: skip
    if gaps:  # (rare: a range of an extent no rank wrote; a sum of zeros each)
        zero = [(e, s, m, sums.of(bytes(m))) for e, s, m in gaps]
        rows = np.concatenate([rows, np.array(zero, np.int64).reshape(-1, 4)])
        rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]
        ext, start, n = rows[:, 0], rows[:, 1], rows[:, 2]
    first = np.searchsorted(ext, np.arange(len(lens)))
    count = np.diff(np.append(first, len(ext)))
    return sums.fold(rows[:, 3].astype(np.uint32), n, first, count)


def ready(plan: Plan, rank: int) -> None:
    """Local: what :func:`write` works out before its first byte (the extents, this rank's
    items), unless done already; an error is kept in ``plan.error``, which ``write``
    raises agreed at its first agreement.  :func:`~.asyncsave.async_save` calls it
    before it returns: this is Python from end to end, and in the save's thread it
    would hold the GIL against the job's own thread (see :mod:`.asyncsave`)."""
    if plan.error is not None:
        return
    try:
        # (the checksum's library imported here: a missing one is an agreed error before
        # any byte is written, and an async save's thread imports nothing)
        plan.algo.fn  # noqa: B018
        if plan.extents is None:
            plan.plan_extents()
        if plan.items is None:
            plan.items = _items(plan, rank)
    except Exception as exc:  # noqa: BLE001 - agreed by write's first agreement
        plan.error = exc


def _items(plan: Plan, rank: int) -> tuple[list[Any], list[Any]]:
    """This rank's writes: the header (rank 0) and its pieces of the arrays :func:`direct`
    allows, as raw bytes, one after another in its region of the file (from the plan's
    spans: no layout flattened again), the gaps of less than a page between them zeros,
    so the region is one range written front to back but at the holes before large
    pieces (:data:`.format.PLACE_MIN`); the others through their layouts, stored whole.  Every
    rank has as many items (a call's count is agreed): per direct array its piece and
    the gap after it, either empty where it has none."""
    head = np.frombuffer(
        bytearray(format.header_bytes(plan.version) if rank == 0 else b""), np.uint8
    )
    fast: list[Any] = [(head, Segments([0], [len(head)]))]
    slow: list[Any] = []
    direct = np.flatnonzero(np.array(plan.direct, bool))
    at = plan.pieces[rank, direct]
    sizes = np.where(at >= 0, plan.spans[rank, direct, 1] - plan.spans[rank, direct, 0], 0)
    held = np.flatnonzero(at >= 0)
    # (the zeros from each piece to this rank's next one; none after its last, and none
    # where the gap holds whole pages, before a piece placed for huge pages: a hole, the
    # region's pwritev split there)
    gaps = np.zeros(len(direct), np.int64)
    gaps[held[:-1]] = at[held[1:]] - (at[held[:-1]] + sizes[held[:-1]])
    gaps[gaps >= format.ALIGN] = 0
    pad = np.zeros(int(gaps.sum()), np.uint8)  # (one allocation, never touched: zero pages)
    cut = displacements(gaps).tolist()
    none = np.zeros(0, np.int64)
    none.flags.writeable = False
    rows = zip(direct.tolist(), at.tolist(), sizes.tolist(), gaps.tolist(), cut, strict=True)
    for k, off, n, gap, c in rows:
        fast.append((plan.entries[k].raw(), Segments.trusted(*_one(off, n)) if n else
                     Segments.trusted(none, none)))  # fmt: skip
        fast.append((pad[c : c + gap], Segments.trusted(*_one(off + n, gap)) if gap else
                     Segments.trusted(none, none)))  # fmt: skip
    for k in np.flatnonzero(~np.array(plan.direct, bool)).tolist():
        e = plan.entries[k]  # (an empty array has no place: its empty piece writes nothing)
        slow.append((e.data, at_(e.layout, max(int(plan.whole[k]), format.DATA_START))))
    return fast, slow


@contextlib.contextmanager
def _entries_named(plan: Plan) -> Iterator[None]:
    """An :class:`~collio.OverlapError` of the arrays written whole (pieces of several
    ranks that overlap) raised naming the save's entries those bytes belong to, not
    file offsets alone (alike on every rank: from the ranges every rank agreed on)."""
    try:
        yield
    except OverlapError as exc:
        lo, hi = (np.array([r[i] for r in exc.regions], np.int64).reshape(-1, 1) for i in (0, 1))
        start = plan.whole
        end = start + np.array([e.layout.global_nbytes for e in plan.entries], np.int64)
        hit = ((start >= 0) & (lo < end) & (start < hi)).any(axis=0)  # (regions x entries)
        names = [plan.entries[k].name for k in np.flatnonzero(hit).tolist()]
        if not names:
            raise
        which = ", ".join(repr(n) for n in names[:4]) + (" ..." if len(names) > 4 else "")
        raise OverlapError(
            f"checkpoint.save: entr{'y' if len(names) == 1 else 'ies'} {which}: the ranks' "
            f"pieces overlap ({exc})", ranks=exc.ranks,
        ) from exc  # fmt: skip


def _one(off: int, n: int) -> tuple[I64, I64]:
    """One run, as read-only arrays (:meth:`Segments.trusted`)."""
    a, b = np.array([off], np.int64), np.array([n], np.int64)
    a.flags.writeable = b.flags.writeable = False
    return a, b


def _holes(plan: Plan) -> tuple[I64, I64]:
    """The whole pages of the gaps before pieces placed for huge pages, which no rank
    writes (:func:`_items`): ``(starts, lengths)``, sorted."""
    at = plan.pieces[plan.pieces >= 0]
    held = plan.pieces >= 0
    n = (plan.spans[:, :, 1] - plan.spans[:, :, 0])[held]
    order = np.argsort(at, kind="stable")
    at, n = at[order], n[order]
    lo = -(-np.r_[format.HEADER.size, at + n][:-1] // format.ALIGN) * format.ALIGN
    hi = at // format.ALIGN * format.ALIGN
    gap = np.flatnonzero(hi > lo)
    return lo[gap], hi[gap] - lo[gap]


def _unwritten(plan: Plan) -> tuple[I64, I64]:
    """The ranges of the file's data (``[0, data_end)``) no rank writes
    (:func:`_items`): after the header, between pieces but for the zeros between one
    rank's consecutive pieces, after the last piece, and after each array stored whole
    up to the next's boundary. ``(starts, lengths)``, sorted."""
    direct = np.array(plan.direct, bool)[None, :]
    sizes = np.where(direct, plan.spans[:, :, 1] - plan.spans[:, :, 0], 0)
    held = (plan.pieces >= 0) & (sizes > 0)
    rank = np.nonzero(held)[0]  # (rank-major, as the pieces lie in the file)
    at, n = plan.pieces[held], sizes[held]
    order = np.argsort(at, kind="stable")
    rank, at, n = rank[order], at[order], n[order]
    after = format.aligned(int(at[-1] + n[-1])) if len(at) else format.DATA_START
    lo = np.r_[format.HEADER.size, at + n]
    hi = np.r_[at, after]
    padded = np.r_[False, (rank[1:] == rank[:-1]) & (hi[1:-1] - lo[1:-1] < format.ALIGN)]
    keep = ~np.r_[padded, False] if len(at) else np.ones(1, bool)
    nbytes = np.array([e.layout.global_nbytes for e in plan.entries], np.int64)
    whole = plan.whole >= 0
    wlo = plan.whole[whole] + nbytes[whole]
    whi = plan.whole[whole] + -(-nbytes[whole] // format.ALIGN) * format.ALIGN
    starts = np.r_[lo[keep], wlo]
    ends = np.r_[hi[keep], whi]
    gap = np.flatnonzero(ends > starts)
    return starts[gap], ends[gap] - starts[gap]


def _reserve(
    f: Any, size: int, holes: tuple[I64, I64] | None = None, plan: Plan | None = None
) -> None:
    """Collective: rank 0 has the file system allocate the data's blocks in one request
    (:meth:`~collio.backends.base.Backend.reserve`) before the ranks write them.  Else
    each rank's writeback allocates blocks for its pieces while the others still write
    theirs into the same file, and a write that meets one waiting on the disk waits
    with the inode's lock held: every rank stalls behind it.  Its error (a full disk)
    is agreed before any byte is written.  Every rank first gives back its share of the
    memory caching the checkpoint this one replaces
    (:meth:`~collio.backends.base.Backend.release_replaced`)."""
    step = Attempt()
    with step, storage_errors(f.backend):
        f.backend.release_replaced(f.comm.Get_rank(), f.comm.Get_size())
        if f.comm.Get_rank() == 0:
            f.backend.reserve(size, holes, None if plan is None else lambda: _unwritten(plan))
    agree(f.comm, step.error, what="checkpoint.save")


def _check_readable(f: Any) -> None:
    """Collective: pieces that are not one range are checksummed by reading them back."""
    step = Attempt()
    with step:
        if not f.backend.readable:
            raise LayoutError(
                f"{f.backend.name}: a piece that is not one contiguous range of its "
                "array is checksummed by reading it back, which this backend cannot "
                "while writing; save row-contiguous pieces"
            )
    agree(f.comm, step.error, what="checkpoint.save")


def _tail(
    comm: MPI.Comm, plan: Plan, crcs: npt.NDArray[np.uint32], at: int | None = None,
    pad: int = 0,
) -> tuple[npt.NDArray[np.uint8], Segments]:  # fmt: skip
    """Collective: every rank's checksums to rank 0, which makes the index; rank 0's item.

    ``crcs`` are this rank's: of the extents it owns, then of those it read back, each
    in extent order; every rank knows every rank's extents from the plan, so the sums
    travel as one gather of numbers (waited for sleeping: the others leave the cores to
    rank 0's index and the disk's work)."""
    assert plan.extents is not None
    x = plan.extents
    who = np.where(x.owner >= 0, x.owner, x.reader)
    order = np.lexsort((x.owner < 0, who))  # (by rank; its own first, each in extent order)
    counts = np.bincount(who, minlength=comm.Get_size()).astype(np.int64)
    displs = displacements(counts)
    root = comm.Get_rank() == 0
    got = np.empty(len(who) if root else 0, np.uint32)
    recv = [got, (counts, displs), MPI.UINT32_T] if root else None
    sleep_until_done(comm.Igatherv([crcs, MPI.UINT32_T], recv, root=0))
    if not root:
        return np.zeros(0, np.uint8), Segments([], [])
    crc = np.empty(len(who), np.uint32)
    crc[order] = got
    tail = np.frombuffer(bytearray(_index(plan, crc, at, pad)), np.uint8)
    return tail, Segments([plan.data_end if at is None else at], [len(tail)])


def _spare(hints: Any, target: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The open's options, with the posix backend told to reuse the spare of the file it
    replaces where the hint ``free_replaced`` is ``reuse`` or ``automatic`` (the writer
    zeroes what it leaves unwritten in it: :func:`_reserve`)."""
    from ..backends import infer_backend
    from ..backends.fileopen import SPARE

    backend = options.get("backend") or infer_backend(target)
    if hints.free_replaced not in ("reuse", "automatic") or backend != "posix":
        return options
    return {**options, "_spare": SPARE}


def _atomic(hints: Any) -> Any:
    """The user's hints with ``atomic_commit`` on: a checkpoint commits as a whole."""
    from ..hints import Hints

    return Hints.coerce(hints).replace(atomic_commit=True)
