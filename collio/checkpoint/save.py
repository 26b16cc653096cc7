"""``save``: every rank's pieces in one two-phase call, checksums, the index, one commit."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, agree
from ..errors import LayoutError, MismatchError
from ..file import open as _open
from ..layouts.arrays import ArrayLayout, Subarray
from ..layouts.base import Segments
from . import extents, format
from .state import Entry, flatten_state, writers

__all__ = ["Plan", "prepare", "write"]

I64 = npt.NDArray[np.int64]


def at(layout: ArrayLayout, offset: int) -> ArrayLayout:
    """The same piece with the array's first element at byte ``offset``."""
    return ArrayLayout(layout.global_shape, layout.dims, layout.dtype, layout.order, offset)


def spans(layouts: list[ArrayLayout]) -> I64:
    """(lo, hi, contiguous, bytes) of each piece, relative to its array (a row per array)."""
    out = np.zeros((len(layouts), 4), np.int64)
    for k, lay in enumerate(layouts):
        out[k] = (*span_of(lay), lay.nbytes)
    return out


def span_of(lay: ArrayLayout) -> tuple[int, int, bool]:
    """(lo, hi, contiguous) of a piece within its array."""
    if isinstance(lay, Subarray):
        got = extents.box_span(
            lay.global_shape, lay.start, lay.shape, lay.dtype.itemsize, lay.order
        )
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
    metadata: Any
    #: the extents, planned by :meth:`plan_extents` (pure: an async save does it in its thread)
    starts: list[I64] = dataclasses.field(default_factory=list)  # each array's extent starts
    owner: list[I64] = dataclasses.field(default_factory=list)  # checksum from memory, or -1
    reader: list[I64] = dataclasses.field(default_factory=list)  # reads it back, or -1

    def plan_extents(self) -> None:
        """Cut every array into extents and give each to a rank (see :mod:`.extents`)."""
        size = self.spans.shape[0]
        self.starts, self.owner, self.reader = [], [], []
        for k, e in enumerate(self.entries):
            n = e.layout.global_nbytes
            lo, hi = self.spans[:, k, 0], self.spans[:, k, 1]
            contig = self.spans[:, k, 2].astype(bool)
            s = extents.cut(n, lo[contig], hi[contig])
            o = extents.owners(s, n, lo, hi, contig)
            self.starts.append(s)
            self.owner.append(o)
            self.reader.append(extents.deal(o < 0, size))

    @property
    def reads_back(self) -> bool:
        return any(bool((r >= 0).any()) for r in self.reader)


def _agree_entries(comm: MPI.Intracomm, entries: list[Entry]) -> None:
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


def prepare(
    comm: MPI.Intracomm, state: Mapping[str, Any], metadata: Mapping[str, Any] | None
) -> Plan:
    """Collective over `comm`: check the state on every rank alike and plan the save."""
    step = Attempt()
    entries: list[Entry] = []
    meta: Any = None
    with step:
        entries = flatten_state(state)
        meta = format.check_metadata(metadata)
    agree(comm, step.error, what="checkpoint.save")
    _agree_entries(comm, entries)
    size, rank = comm.Get_size(), comm.Get_rank()
    rep = [k for k, e in enumerate(entries) if e.replicated]
    who = writers([entries[k].layout.nbytes for k in rep], size)
    for k, r in zip(rep, who, strict=True):
        if r != rank:
            entries[k] = entries[k].skipped()
    shapes = [e.layout.global_nbytes for e in entries]
    offsets, end = format.place(shapes)
    step = Attempt()
    with step:  # (a layout's runs may be built here first: a rank's error is agreed)
        mine = spans([e.layout for e in entries])
    agree(comm, step.error, what="checkpoint.save")
    every = np.empty((size, *mine.shape), np.int64)
    comm.Allgather(mine, every)
    step = Attempt()
    with step:
        total = every[:, :, 3].sum(axis=0)
        sharded = ~np.array([e.replicated for e in entries], bool)
        short = np.flatnonzero((total != np.array(shapes, np.int64)) & sharded)
        if len(short):
            k = int(short[0])
            raise LayoutError(
                f"entry {entries[k].name!r}: the ranks' pieces hold {int(total[k])} bytes, "
                f"the array {shapes[k]}"
            )
    agree(comm, step.error, what="checkpoint.save")
    flat = [bool(x) for x in np.atleast_1d(every[:, :, 2].all(axis=0))]
    return Plan(entries, offsets, end, every, flat, meta)


def _crc_owned(plan: Plan, rank: int) -> tuple[list[I64], list[npt.NDArray[np.uint32]]]:
    """Checksums of the extents this rank's pieces cover, from its memory; (ids, crcs)."""
    import crc32c

    ids, crcs = [], []
    base = 0
    for k, e in enumerate(plan.entries):
        s = plan.starts[k]
        mine = np.flatnonzero(plan.owner[k] == rank)
        if len(mine):
            buf = e.layout.as_bytes(e.data).data
            lo = span_of(e.layout)[0]
            ends = np.append(s[1:], e.layout.global_nbytes)
            got = [crc32c.crc32c(buf[s[j] - lo : ends[j] - lo]) for j in mine.tolist()]
            ids.append(base + mine)
            crcs.append(np.asarray(got, np.uint32))
        base += len(s)
    return ids, crcs


def _read_back_runs(plan: Plan, rank: int) -> tuple[I64, I64, I64]:
    """(extent ids, file offsets, lengths) of the extents this rank reads back."""
    ids, offs, lens = [], [], []
    base = 0
    for k, e in enumerate(plan.entries):
        s = plan.starts[k]
        mine = np.flatnonzero(plan.reader[k] == rank)
        ends = np.append(s[1:], e.layout.global_nbytes)
        ids.append(base + mine)
        offs.append(plan.offsets[k] + s[mine])
        lens.append(ends[mine] - s[mine])
        base += len(s)
    cat = np.concatenate
    z = np.zeros(0, np.int64)
    return cat([z, *ids]), cat([z, *offs]), cat([z, *lens])


def _crcs_of(buf: npt.NDArray[np.uint8], lens: I64) -> npt.NDArray[np.uint32]:
    import crc32c

    view = buf.data
    cuts = np.concatenate([[0], np.cumsum(lens)]).tolist()
    return np.asarray(
        [crc32c.crc32c(view[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)], np.uint32
    )


def _index(plan: Plan, crc: npt.NDArray[np.uint32]) -> bytes:
    """Extent table, JSON index and trailer, as stored from ``plan.data_end``."""
    import crc32c

    e = plan.entries
    table = np.zeros(sum(len(s) for s in plan.starts), format.EXTENT)
    table["start"] = np.concatenate([np.zeros(0, np.int64), *plan.starts])
    table["crc"] = crc
    arrays = format.describe(
        [x.name for x in e],
        [x.shape for x in e],
        [x.layout.dtype for x in e],
        [x.layout.order for x in e],
        plan.offsets,
        [x.replicated for x in e],
        [len(s) for s in plan.starts],
    )
    idx = format.Index(arrays, plan.metadata, table)
    tbytes, doc = idx.to_bytes(plan.data_end)
    off = plan.data_end + len(tbytes)
    return tbytes + doc + format.trailer_bytes(off, len(doc), crc32c.crc32c(doc))


def write(
    comm: MPI.Intracomm, target: Any, plan: Plan, hints: Any, options: dict[str, Any]
) -> None:
    """Collective over `comm`: checksum the plan's pieces, write them and the index, commit.

    The target is opened with ``atomic_commit``: until the close, the bytes go to a
    temporary (or an open multipart upload), so a failure on any rank, or a killed
    job, leaves the previous checkpoint as it was.  When every piece is one range of
    its array, the checksums come from memory first and the whole checkpoint is one
    ``write_all_many`` (an S3 object's size is fixed by its first write); otherwise
    the data goes first, is read back for its checksums, and the index follows.
    """
    rank = comm.Get_rank()
    step = Attempt()
    with step:  # (on async_save's thread too: a rank failing alone must not strand the rest)
        if len(plan.starts) != len(plan.entries):
            plan.plan_extents()
    agree(comm, step.error, what="checkpoint.save")
    with _open(target, "w", comm=comm, hints=_atomic(hints), **options) as f:
        head = np.frombuffer(bytearray(format.header_bytes() if rank == 0 else b""), np.uint8)
        items: list[Any] = [(head, Segments([0], [len(head)]))]
        items += [
            (e.data, at(e.layout, int(o))) for e, o in zip(plan.entries, plan.offsets, strict=True)
        ]
        if plan.reads_back:  # before any byte is written
            step = Attempt()
            with step:
                if not f.backend.readable:
                    raise LayoutError(
                        f"{f.backend.name}: a piece that is not one contiguous range of its "
                        "array is checksummed by reading it back, which this backend cannot "
                        "while writing; save row-contiguous pieces"
                    )
            agree(f.comm, step.error, what="checkpoint.save")
        step = Attempt()
        with step:
            own_ids, own_crcs = _crc_owned(plan, rank)
        agree(f.comm, step.error, what="checkpoint.save: checksums")
        if not plan.reads_back:
            f.write_all_many([*items, _tail(f.comm, plan, own_ids, own_crcs)])
            return
        f.write_all_many(items)
        ids, offs, lens = _read_back_runs(plan, rank)
        back = _crcs_of(f.read_all(Segments(offs, lens)), lens)
        f.write_all(*_tail(f.comm, plan, [*own_ids, ids], [*own_crcs, back]))


def _tail(
    comm: MPI.Comm, plan: Plan, ids: list[I64], crcs: list[npt.NDArray[np.uint32]]
) -> tuple[npt.NDArray[np.uint8], Segments]:
    """Collective: every rank's checksums to rank 0, which makes the index; rank 0's item."""
    z = np.zeros(0, np.int64)
    mine = (np.concatenate([z, *ids]), np.concatenate([np.zeros(0, np.uint32), *crcs]))
    got = comm.gather(mine, root=0)
    if comm.Get_rank() != 0:
        return np.zeros(0, np.uint8), Segments([], [])
    crc = np.zeros(sum(len(s) for s in plan.starts), np.uint32)
    for i, c in got or []:
        crc[i] = c
    tail = np.frombuffer(bytearray(_index(plan, crc)), np.uint8)
    return tail, Segments([plan.data_end], [len(tail)])


def _atomic(hints: Any) -> Any:
    """The user's hints with ``atomic_commit`` on: a checkpoint commits as a whole."""
    from ..hints import Hints

    return Hints.coerce(hints).replace(atomic_commit=True)
