"""``save``: the plan (every rank's entries, their places in the file, which ranks write
which bytes themselves); the writing is in :mod:`.writer`."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..collective import Attempt, agree, digest, raise_agreed
from ..errors import LayoutError, MismatchError
from ..facts import Facts, How, fact, record
from ..layouts.arrays import ArrayLayout, Subarray
from ..layouts.base import Segments
from ..waits import sleep_until_done
from . import extents, format
from .chunks import Chunks
from .crc import CRC32, Algo, for_version
from .state import Entry, flatten_state, writers

__all__ = ["Plan", "prepare"]

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
        got = _box_span(lay.global_shape, lay.start, lay.shape, lay.dtype.itemsize, lay.order)
        if got is not None:
            return got
    runs = lay.runs()  # (a box that is not one range: its runs, kept by the layout)
    return extents.span(runs.file, runs.length, runs.mem)


# (kept per box, as a job saves the same boxes every step: the arithmetic costs more than
# the rest of an entry's planning; kept by the box's values, not the layout: a job that
# makes its layouts anew at every step would keep each one, and its runs, here)
@functools.lru_cache(maxsize=1024)
def _box_span(
    global_shape: tuple[int, ...], start: tuple[int, ...], shape: tuple[int, ...],
    itemsize: int, order: str,
) -> tuple[int, int, bool] | None:  # fmt: skip
    return extents.box_span(global_shape, start, shape, itemsize, order)


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
    #: each array's place in the virtual space the extents are planned in (see .chunks)
    offsets: I64
    #: the file offset of each rank's piece of each direct array (-1: none), of each
    #: array stored whole (-1: direct or empty), and where the data ends in the file
    #: (:func:`.format.place_ranks`)
    pieces: I64
    whole: I64
    data_end: int
    spans: I64  # (rank, array, (lo, hi, contiguous, bytes)) of every rank's pieces
    flat: list[bool]  # whether every rank's piece of the array is one range
    #: whether each rank writes its own piece of the array itself (see :func:`direct`)
    direct: list[bool]
    metadata: Any
    #: the extents, planned by :meth:`plan_extents` (pure: an async save does it before it returns)
    extents: extents.Plan | None = None
    #: this rank's error in preparing it that :func:`write` raises, agreed (an async
    #: save's copies, made while the ranks agree: see :data:`Stage`)
    error: BaseException | None = None
    #: this rank's items of the write, ``(direct, through layouts)`` (:func:`.writer.ready`)
    items: tuple[list[Any], list[Any]] | None = None
    #: the format version it writes, and so its checksum (taken once, when planned)
    version: int = dataclasses.field(default_factory=lambda: format.VERSION)

    @property
    def algo(self) -> Algo:
        return for_version(self.version)

    def plan_extents(self) -> None:
        """Cut every array into extents and give each to a rank (see :mod:`.extents`)."""
        nbytes = np.array([e.layout.global_nbytes for e in self.entries], np.int64)
        self.extents = extents.plan(nbytes, self.offsets, self.spans)

    def files(self) -> I64:
        """The file offset of each extent's first byte (planned extents)."""
        assert self.extents is not None
        x = self.extents
        return format.extent_files(x.starts, x.aid, x.owner, self.spans[:, :, 0], self.pieces,
                                   self.whole)  # fmt: skip

    def chunks(self) -> Chunks:
        """The map of the virtual space to the file (planned extents)."""
        assert self.extents is not None
        x = self.extents
        return Chunks.of_runs(self.offsets[x.aid] + x.starts, self.files(), x.ends - x.starts)

    @property
    def reads_back(self) -> bool:
        return self.extents is not None and bool((self.extents.reader >= 0).any())


@record
class _Entries(Facts):
    failed: bool = fact(How.ANY)
    sig: int | None = fact(How.EQUAL)  # digest of every entry's signature (None: ranks differ)
    meta: int | None = fact(How.EQUAL)  # digest of the metadata (None: ranks differ)


def _meta_digest(meta: Any) -> int:
    """The metadata's digest, as stored (JSON with sorted keys: equal mappings whose keys
    came in another order agree); never None, so a rank passing no metadata is compared
    with one passing some."""
    return digest(json.dumps(meta, sort_keys=True))


def _post_entries(
    comm: MPI.Intracomm, error: BaseException | None, entries: list[Entry], meta: Any
) -> tuple[MPI.Request, npt.NDArray[np.int64]]:
    """Collective (begun): one allreduce agreeing on the ranks' errors, entries and
    metadata (their digests); :func:`_agree_entries` completes it."""
    sig = [e.signature() for e in entries]
    vec = _Entries(failed=error is not None, sig=digest(sig), meta=_meta_digest(meta)).to_array()
    return comm.Iallreduce(MPI.IN_PLACE, [vec, MPI.INT64_T], op=MPI.MAX), vec


def _agree_entries(
    comm: MPI.Intracomm, error: BaseException | None, entries: list[Entry],
    req: MPI.Request, vec: npt.NDArray[np.int64], meta: Any,
) -> None:  # fmt: skip
    """Collective: the agreement :func:`_post_entries` began, waited for sleeping; only
    when the entries (or the metadata) differ is rank 0's list (or metadata) sent, to
    name the entry (the ranks)."""
    sleep_until_done(req)
    agreed = _Entries.agreed(vec)
    if agreed.failed:
        raise_agreed(comm, error, what="checkpoint.save")
    if agreed.sig is not None:
        if agreed.meta is None:
            _agree_metadata(comm, meta)
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


def _agree_metadata(comm: MPI.Intracomm, meta: Any) -> None:
    """Collective, once the metadata's digests differ: every rank raises the same
    MismatchError naming the ranks whose metadata differs from rank 0's (the one the
    index would have stored)."""
    ref = comm.bcast(meta, root=0)
    err: Exception | None = None
    if json.dumps(meta, sort_keys=True) != json.dumps(ref, sort_keys=True):
        err = MismatchError(f"metadata {_brief(meta)} differs from rank 0's {_brief(ref)}")
    agree(comm, err, what="checkpoint.save")


def _brief(meta: Any, limit: int = 120) -> str:
    text = json.dumps(meta, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    *,
    huge: bool = True,
    check: Callable[[], None] | None = None,
) -> Plan:
    """Collective over `comm`: check the state on every rank alike and plan the save
    (``stage`` runs meanwhile, see :data:`Stage`); ``huge``: large pieces placed for
    huge pages (:func:`.format.place_ranks`, a target a load may map: see
    :func:`maps_later`); ``check`` (local): more of the save's arguments checked first,
    its errors agreed with the state's."""
    step = Attempt()
    entries: list[Entry] = []
    meta: Any = None
    with step:
        if check is not None:
            check()
        entries = flatten_state(state)
        meta = format.check_metadata(metadata)
    req, vec = _post_entries(comm, step.error, entries, meta)
    if stage is not None and step.error is None:
        stage(entries, False)
    _agree_entries(comm, step.error, entries, req, vec, meta)
    size, rank = comm.Get_size(), comm.Get_rank()
    rep = [k for k, e in enumerate(entries) if e.replicated]
    copies = [entries[k] for k in rep]  # (every rank's, compared below)
    who = writers([entries[k].layout.nbytes for k in rep], size)
    for k, r in zip(rep, who, strict=True):
        if r != rank:
            entries[k] = entries[k].skipped()
    shapes = [e.layout.global_nbytes for e in entries]
    offsets, _ = format.place(shapes)
    every, sums = _gather_spans(comm, entries, stage, copies)
    _same_everywhere(copies, sums)
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
    pieces, whole_, end = format.place_ranks(
        every[:, :, 0], every[:, :, 1], fast, np.array(shapes, np.int64).reshape(-1), huge
    )
    return Plan(entries, offsets, pieces, whole_, end, every, flat.tolist(), fast.tolist(), meta)


def maps_later(target: Any, options: Mapping[str, Any]) -> bool:
    """Whether a save to ``target`` (with the open's ``options``) writes a file, whose
    loads may map it (then large pieces are placed for huge pages): the posix and MPI-IO
    backends'.  Other targets (an S3 object, whose gaps would be uploaded as zeros) keep
    every piece on the page grid."""
    from ..backends import infer_backend

    return (options.get("backend") or infer_backend(target)) in ("posix", "mpiio")


def _gather_spans(
    comm: MPI.Intracomm, entries: list[Entry], stage: Stage | None, copies: list[Entry]
) -> tuple[I64, I64]:
    """Collective: every rank's spans of its pieces ``(rank, array, (lo, hi, contiguous,
    bytes))``, a row more for its error (a layout's runs may be built here first), and
    every rank's CRC-32 of each of its ``copies`` of the replicated entries (``(rank,
    copy)``): one gather agrees them all, waited for sleeping (``stage`` runs while it
    travels)."""
    step = Attempt()
    n = len(entries)
    mine = np.zeros((n + 1 + -(-len(copies) // 4), 4), np.int64)
    with step:
        mine[:n] = spans([e.layout for e in entries])
        fn = CRC32.fn
        mine[n + 1 :].reshape(-1)[: len(copies)] = [fn(e.raw()) for e in copies]
    mine[n, 0] = step.error is not None
    every = np.empty((comm.Get_size(), *mine.shape), np.int64)
    req = comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
    if stage is not None:
        stage(entries, True)
    sleep_until_done(req)
    if every[:, n, 0].any():
        raise_agreed(comm, step.error, what="checkpoint.save")
    return every[:, :n], every[:, n + 1 :].reshape(len(every), -1)[:, : len(copies)]


def _same_everywhere(copies: list[Entry], sums: I64) -> None:
    """Local, alike on every rank (from the same gather): a replicated entry is stored
    once, from one rank, so every rank must hold the same bytes of it; else the
    :class:`~collio.LayoutError` that names it and which ranks hold which."""
    differ = np.flatnonzero((sums != sums[:1]).any(axis=0))
    if not len(differ):
        return
    k = int(differ[0])
    values, first = np.unique(sums[:, k], return_index=True)
    count = len(values)
    held = " | ".join(  # (the values in the order of the first rank that holds each)
        "rank" + ("s " if len(who) > 1 else " ") + ", ".join(map(str, who))
        for who in (np.flatnonzero(sums[:, k] == v).tolist() for v in values[np.argsort(first)])
    )
    more = f"; {len(differ) - 1} more replicated entries differ too" if len(differ) > 1 else ""
    raise LayoutError(
        f"checkpoint.save: entry {copies[k].name!r} is replicated (a plain array, stored "
        f"once) but its bytes differ between ranks, {count} values ({held}){more}; give "
        "it a layout where each rank holds a piece of its own"
    )


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
