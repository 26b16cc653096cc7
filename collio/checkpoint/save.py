"""``save``: every rank's pieces in one two-phase call, checksums, the index, one commit."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends.base import storage_errors
from ..collective import Attempt, agree, any_flag, digest, raise_agreed
from ..errors import LayoutError, MismatchError
from ..facts import Facts, How, fact, record
from ..file import open as _open
from ..layouts.arrays import ArrayLayout, Subarray
from ..layouts.base import Segments
from ..waits import sleep_until_done
from . import extents, format
from .crc import of_pieces
from .state import Entry, flatten_state, writers

__all__ = ["Plan", "prepare", "write"]

I64 = npt.NDArray[np.int64]


def at(layout: ArrayLayout, offset: int) -> ArrayLayout:
    """The same piece with the array's first element at byte ``offset``."""
    return ArrayLayout(layout.global_shape, layout.dims, layout.dtype, layout.order, offset)


def spans(layouts: list[ArrayLayout]) -> I64:
    """(lo, hi, contiguous, bytes) of each piece, relative to its array (a row per array)."""
    # (math.prod: np.prod costs more than the rest here)
    rows = [(*span_of(lay), math.prod(lay.local_shape) * lay.dtype.itemsize) for lay in layouts]
    return np.array(rows, np.int64).reshape(len(layouts), 4)


def span_of(lay: ArrayLayout) -> tuple[int, int, bool]:
    """(lo, hi, contiguous) of a piece within its array."""
    if isinstance(lay, Subarray):
        return _box_span(lay)
    runs = lay.runs()
    return extents.span(runs.file, runs.length, runs.mem)


# (kept per box, as a layout is immutable and a job saves the same ones every step:
# the arithmetic costs more than the rest of an entry's planning)
@functools.lru_cache(maxsize=1024)
def _box_span(lay: Subarray) -> tuple[int, int, bool]:
    got = extents.box_span(lay.global_shape, lay.start, lay.shape, lay.dtype.itemsize, lay.order)
    if got is not None:
        return got
    runs = lay.runs()
    return extents.span(runs.file, runs.length, runs.mem)


def item(data: Any, lay: ArrayLayout, offset: int, flat: bool) -> tuple[Any, Any]:
    """The write (or read) of a piece at ``offset``: with ``flat`` (every rank's piece of
    the array is one range: an item is the same kind on every rank) as raw bytes, with
    no flattening; else through its layout."""
    lo, hi, contiguous = span_of(lay)
    if flat and contiguous:
        return lay.as_bytes(data), Segments(
            [offset + lo] if hi > lo else [], [hi - lo] if hi > lo else []
        )
    return data, at(lay, offset)


@dataclasses.dataclass(slots=True)
class Plan:
    """What every rank agreed to save, and where each byte goes."""

    entries: list[Entry]  # this rank's pieces (empty ones for replicated entries it skips)
    offsets: I64
    data_end: int
    spans: I64  # (rank, array, (lo, hi, contiguous, bytes)) of every rank's pieces
    flat: list[bool]  # whether every rank's piece of the array is one range
    #: whether each rank writes its own piece of the array itself (see :func:`direct`)
    direct: list[bool]
    metadata: Any
    #: the extents, planned by :meth:`plan_extents` (pure: an async save does it in its thread)
    extents: extents.Plan | None = None
    #: this rank's error in preparing it that :func:`write` raises, agreed (an async
    #: save's copies, made while the ranks agree: see :data:`Stage`)
    error: BaseException | None = None

    def plan_extents(self) -> None:
        """Cut every array into extents and give each to a rank (see :mod:`.extents`)."""
        nbytes = np.array([e.layout.global_nbytes for e in self.entries], np.int64)
        self.extents = extents.plan(nbytes, self.offsets, self.spans)

    @property
    def reads_back(self) -> bool:
        return self.extents is not None and bool((self.extents.reader >= 0).any())


@record
class _Entries(Facts):
    failed: bool = fact(How.ANY)
    sig: int | None = fact(How.EQUAL)  # digest of every entry's signature (None: ranks differ)


def _post_entries(
    comm: MPI.Intracomm, error: BaseException | None, entries: list[Entry]
) -> tuple[MPI.Request, npt.NDArray[np.int64]]:
    """Collective (begun): one allreduce agreeing on the ranks' errors and entries (their
    digests); :func:`_agree_entries` completes it."""
    sig = [e.signature() for e in entries]
    vec = _Entries(failed=error is not None, sig=digest(sig)).to_array()
    return comm.Iallreduce(MPI.IN_PLACE, [vec, MPI.INT64_T], op=MPI.MAX), vec


def _agree_entries(
    comm: MPI.Intracomm, error: BaseException | None, entries: list[Entry],
    req: MPI.Request, vec: npt.NDArray[np.int64],
) -> None:  # fmt: skip
    """Collective: the agreement :func:`_post_entries` began, waited for sleeping; only
    when the entries differ is rank 0's list sent, to name the entry."""
    sleep_until_done(req)
    agreed = _Entries.agreed(vec)
    if agreed.failed:
        raise_agreed(comm, error, what="checkpoint.save")
    if agreed.sig is not None:
        return
    sig = [e.signature() for e in entries]
    ref = comm.bcast(sig, root=0)
    err: Exception | None = None
    if sig != ref:
        mine = {s[0]: s for s in sig}
        theirs = {s[0]: s for s in ref}
        diff = sorted(set(mine) ^ set(theirs)) or sorted(n for n in mine if mine[n] != theirs[n])
        name = diff[0]
        err = MismatchError(
            f"entry {name!r}: {_say(mine.get(name))} here, {_say(theirs.get(name))} on rank 0"
        )
    agree(comm, err, what="checkpoint.save")


def _say(sig: Any) -> str:
    if sig is None:
        return "absent"
    kind = "replicated" if sig[1] else "sharded"
    return f"{kind} shape {tuple(sig[2])} dtype {sig[3]} order {sig[4]}"


#: What a save does with its entries while its agreements travel (an async save copies
#: them): called with the entries and False (the sharded ones, as the ranks agree on
#: them), then True (the replicated ones this rank writes, as the spans are gathered).
Stage = Callable[[list[Entry], bool], None]


def prepare(
    comm: MPI.Intracomm,
    state: Mapping[str, Any],
    metadata: Mapping[str, Any] | None,
    stage: Stage | None = None,
) -> Plan:
    """Collective over `comm`: check the state on every rank alike and plan the save
    (``stage`` runs meanwhile, see :data:`Stage`)."""
    step = Attempt()
    entries: list[Entry] = []
    meta: Any = None
    with step:
        entries = flatten_state(state)
        meta = format.check_metadata(metadata)
    req, vec = _post_entries(comm, step.error, entries)
    if stage is not None and step.error is None:
        stage(entries, False)
    _agree_entries(comm, step.error, entries, req, vec)
    size, rank = comm.Get_size(), comm.Get_rank()
    rep = [k for k, e in enumerate(entries) if e.replicated]
    who = writers([entries[k].layout.nbytes for k in rep], size)
    for k, r in zip(rep, who, strict=True):
        if r != rank:
            entries[k] = entries[k].skipped()
    shapes = [e.layout.global_nbytes for e in entries]
    offsets, end = format.place(shapes)
    every = _gather_spans(comm, entries, stage)
    total = every[:, :, 3].sum(axis=0)  # (every rank has every rank's spans: no agreement)
    sharded = ~np.array([e.replicated for e in entries], bool)
    short = np.flatnonzero((total != np.array(shapes, np.int64)) & sharded)
    if len(short):
        k = int(short[0])
        raise LayoutError(
            f"checkpoint.save: entry {entries[k].name!r}: the ranks' pieces hold "
            f"{int(total[k])} bytes, the array {shapes[k]}"
        )
    flat = np.atleast_1d(every[:, :, 2].all(axis=0))
    fast = direct(every)
    return Plan(entries, offsets, end, every, flat.tolist(), fast.tolist(), meta)


def _gather_spans(comm: MPI.Intracomm, entries: list[Entry], stage: Stage | None) -> I64:
    """Collective: every rank's spans of its pieces ``(rank, array, (lo, hi, contiguous,
    bytes))``, a row more for its error (a layout's runs may be built here first): one
    gather agrees both, waited for sleeping (``stage`` runs while it travels)."""
    step = Attempt()
    mine = np.zeros((len(entries) + 1, 4), np.int64)
    with step:
        mine[:-1] = spans([e.layout for e in entries])
    mine[-1, 0] = step.error is not None
    every = np.empty((comm.Get_size(), *mine.shape), np.int64)
    req = comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    if stage is not None:
        stage(entries, True)
    sleep_until_done(req)
    if every[:, -1, 0].any():
        raise_agreed(comm, step.error, what="checkpoint.save")
    return every[:, :-1]


def direct(every: I64) -> npt.NDArray[np.bool_]:
    """Per array, from every rank's ``(lo, hi, contiguous, bytes)``: whether each rank
    writes (and a load at the same decomposition reads) its own piece itself.

    The rule: every rank's piece is one contiguous range of the array's bytes (a row
    shard, a whole replicated array, an empty piece) and no two ranks' ranges overlap.
    The ranks' pieces then hold the array's bytes exactly (the save has checked that
    their sizes add up), so no exchange is needed, however the ranks' ranges
    interleave in the file; and the ranges are one request each.  A piece of several
    runs (2-D blocks, block-cyclic) goes through the two-phase exchange, which also
    refuses pieces that overlap: the overlap of such pieces is known only from their
    runs, which the plan does not gather.
    """
    contiguous = every[:, :, 2].astype(bool).all(axis=0)
    return contiguous & extents.disjoint(every[:, :, 0], every[:, :, 1])


def _crc_owned(plan: Plan, rank: int) -> npt.NDArray[np.uint32]:
    """Checksums of the extents this rank's pieces cover, from its memory, in extent order
    (one library call per extent, each releasing the GIL while it sums)."""
    import crc32c

    assert plan.extents is not None
    x = plan.extents
    mine = np.flatnonzero(x.owner == rank)
    got = np.empty(len(mine), np.uint32)
    views: dict[int, tuple[memoryview, int]] = {}
    rows = zip(x.aid[mine].tolist(), x.starts[mine].tolist(), x.ends[mine].tolist(), strict=True)
    for i, (k, a, b) in enumerate(rows):
        if k not in views:  # (a piece's bytes, from its first byte within its array)
            e = plan.entries[k]
            views[k] = (e.raw().data, int(plan.spans[rank, k, 0]))
        buf, lo = views[k]
        got[i] = crc32c.crc32c(buf[a - lo : b - lo])
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
    return plan.offsets[x.aid[mine]] + x.starts[mine], x.ends[mine] - x.starts[mine]


def _index(plan: Plan, crc: npt.NDArray[np.uint32]) -> bytes:
    """Extent table, JSON index and trailer, as stored from ``plan.data_end``."""
    import crc32c

    e = plan.entries
    assert plan.extents is not None
    table = np.zeros(len(plan.extents.starts), format.EXTENT)
    table["start"] = plan.extents.starts
    table["crc"] = crc
    arrays = format.describe(
        [x.name for x in e],
        [x.shape for x in e],
        [x.layout.dtype for x in e],
        [x.layout.order for x in e],
        plan.offsets,
        [x.replicated for x in e],
        plan.extents.counts(len(e)).tolist(),
    )
    idx = format.Index(arrays, plan.metadata, table)
    tbytes, doc = idx.to_bytes(plan.data_end)
    off = plan.data_end + len(tbytes)
    return tbytes + doc + format.trailer_bytes(off, len(doc), crc32c.crc32c(doc))


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
    first and the whole checkpoint is one ``write_all_many``.

    The arrays :func:`direct` allows are written by each rank itself (``disjoint``:
    no exchange, where the backend lets ranks write their own ranges; S3 aggregates
    them into its parts all the same); the others go through the two-phase exchange.
    """
    rank = comm.Get_rank()
    step = Attempt()
    opened: Any = None
    with step:  # (on async_save's thread too: a rank failing alone must not strand the rest)
        if plan.error is not None:
            raise plan.error
        if plan.extents is None:
            plan.plan_extents()
        # (hints one rank cannot parse raise here, agreed, not alone before the open;
        # without ``early`` no flush at all before the close: the rounds of two-phase
        # pieces would otherwise start fdatasyncs on the file's flush thread, at the
        # job's priority)
        opened = _atomic(hints) if early else _atomic(hints).replace(early_flush=False)
    if any_flag(comm, step.error is not None, patient=True):  # (before the target is touched)
        raise_agreed(comm, step.error, what="checkpoint.save")
    with _open(target, "w", comm=comm, hints=opened, **options) as f:
        fast, slow = _items(plan, rank)
        if plan.reads_back:  # before any byte is written
            _check_readable(f)
        if not f.backend.partial_write and not plan.reads_back:
            tail = _tail(f.comm, plan, _sums(f.comm, plan, rank))
            f.write_all_many([*fast, *slow, tail], _disjoint=not slow)
            return
        _reserve(f, plan.data_end)
        if early:
            f._flush_soon()  # (each rank's data to the disk as soon as it wrote it)
        f.write_all_many(fast, _disjoint=True)
        if slow:  # (the same arrays on every rank: plan.direct is agreed)
            f.write_all_many(slow)
        crcs = _sums(f.comm, plan, rank)  # (while the disk writes)
        if plan.reads_back:
            offs, lens = _read_back_runs(plan, rank)
            crcs = np.concatenate([crcs, of_pieces(f.read_all(Segments(offs, lens)), lens)])
        f.write_all(*_tail(f.comm, plan, crcs))


def _items(plan: Plan, rank: int) -> tuple[list[Any], list[Any]]:
    """This rank's writes: the header (rank 0) and the arrays :func:`direct` allows, as
    raw bytes at their ranges (from the plan's spans: no layout flattened again); the
    others through their layouts."""
    head = np.frombuffer(bytearray(format.header_bytes() if rank == 0 else b""), np.uint8)
    fast: list[Any] = [(head, Segments([0], [len(head)]))]
    slow: list[Any] = []
    lo, hi = plan.spans[rank, :, 0], plan.spans[rank, :, 1]
    # (each piece's one run, or none where it is empty, as read-only views of two arrays)
    starts, lengths = plan.offsets + lo, hi - lo
    starts.flags.writeable = lengths.flags.writeable = False
    for k, (e, d) in enumerate(zip(plan.entries, plan.direct, strict=True)):
        if d:
            one = slice(k, k + 1) if lengths[k] > 0 else slice(0, 0)
            fast.append((e.raw(), Segments.trusted(starts[one], lengths[one])))
        else:
            slow.append((e.data, at(e.layout, int(plan.offsets[k]))))
    return fast, slow


def _reserve(f: Any, size: int) -> None:
    """Collective: rank 0 has the file system allocate the data's blocks in one request
    (:meth:`~collio.backends.base.Backend.reserve`) before the ranks write them.  Else
    each rank's writeback allocates blocks for its pieces while the others still write
    theirs into the same file, and a write that meets one waiting on the disk waits
    with the inode's lock held: every rank stalls behind it.  Its error (a full disk)
    is agreed before any byte is written."""
    step = Attempt()
    with step, storage_errors(f.backend):
        if f.comm.Get_rank() == 0:
            f.backend.reserve(size)
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
    comm: MPI.Comm, plan: Plan, crcs: npt.NDArray[np.uint32]
) -> tuple[npt.NDArray[np.uint8], Segments]:
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
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    root = comm.Get_rank() == 0
    got = np.empty(len(who) if root else 0, np.uint32)
    recv = [got, (counts, displs), MPI.UINT32_T] if root else None
    sleep_until_done(comm.Igatherv([crcs, MPI.UINT32_T], recv, root=0))
    if not root:
        return np.zeros(0, np.uint8), Segments([], [])
    crc = np.empty(len(who), np.uint32)
    crc[order] = got
    tail = np.frombuffer(bytearray(_index(plan, crc)), np.uint8)
    return tail, Segments([plan.data_end], [len(tail)])


def _atomic(hints: Any) -> Any:
    """The user's hints with ``atomic_commit`` on: a checkpoint commits as a whole."""
    from ..hints import Hints

    return Hints.coerce(hints).replace(atomic_commit=True)
