"""``load`` and ``info``: the index from the trailer, pieces in any decomposition, verified."""

from __future__ import annotations

import collections.abc
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from mpi4py import MPI

from ..backends.base import storage_errors
from ..collective import Attempt, bcast_outcome, digest, raise_agreed
from ..errors import ChecksumError, LayoutError, MismatchError
from ..file import File
from ..file import open as _open
from ..layouts.arrays import ArrayLayout, array_layout
from ..layouts.base import Segments
from ..waits import sleep_until_done
from . import extents, format
from .crc import combine as crc_combine
from .save import at, item, spans
from .state import as_array, whole

__all__ = ["Info", "info", "load"]

I64 = npt.NDArray[np.int64]


class Info(collections.abc.Mapping[str, dict[str, Any]]):
    """A checkpoint's arrays by name (shape, dtype, order, offset, nbytes, replicated)
    and ``metadata``, the user's JSON values."""

    def __init__(self, index: format.Index) -> None:
        self.index = index
        self.metadata = index.metadata
        self._arrays = {
            name: {**entry, "shape": tuple(entry["shape"]), "dtype": index.dtype(name)}
            for name, entry in index.arrays.items()
        }

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"<checkpoint info: {len(self)} arrays, metadata={self.metadata!r}>"


def _parse(read: Any, size: int, where: str) -> format.Index:
    """The index of a target of ``size`` bytes, ``read(offset, length)`` giving its bytes."""
    return _parse_crc(read, size, where)[0]


def _parse_crc(read: Any, size: int, where: str) -> tuple[format.Index, int]:
    """:func:`_parse`, and the index's checksum (as the trailer gives it)."""
    import crc32c

    tail = format.TRAILER.size
    off, length, crc = format.parse_trailer(
        read(size - tail, tail) if size >= tail else b"", size, where
    )
    doc = read(off, length)
    if crc32c.crc32c(doc) != crc:
        raise ChecksumError(f"{where}: the index's checksum differs")
    try:
        toff, tlen = format.Index.table_span(doc)
        return format.Index.from_bytes(doc, read(toff, tlen), where), crc
    except (ValueError, KeyError, TypeError) as exc:
        raise ChecksumError(f"{where}: unreadable index: {exc}") from None


def info(target: Any, **options: Any) -> Info:
    """Local, no MPI: what the checkpoint at ``target`` holds (a path, or ``s3://``:
    ranged GETs, ``options`` as :func:`collio.open` takes for S3)."""
    text = os.fspath(target)
    if text.startswith("s3://"):
        return Info(_parse_s3(text, options))
    with open(text, "rb") as fp:
        size = os.fstat(fp.fileno()).st_size

        def read(offset: int, length: int) -> bytes:
            fp.seek(offset)
            return fp.read(length)

        return Info(_parse(read, size, text))


def _parse_s3(url: str, options: dict[str, Any]) -> format.Index:
    from ..backends.s3.client import client_for
    from ..backends.s3.options import S3Options

    opts = S3Options(**{k: v for k, v in options.items() if k in {"endpoint_url", "region_name"}})
    client = client_for(opts.endpoint_url, opts.region_name, 3, 4)
    bucket, _, key = url[len("s3://") :].partition("/")
    size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])

    def read(offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        rng = f"bytes={offset}-{offset + length - 1}"
        body: bytes = client.get_object(Bucket=bucket, Key=key, Range=rng)["Body"].read()
        return body

    return _parse(read, size, url)


def _backend_read(f: File) -> Any:
    def read(offset: int, length: int) -> bytes:  # (the backend's own read)
        buf = np.empty(max(length, 0), np.uint8)
        f.backend.read_at(offset, buf)
        return buf.tobytes()

    return read


def _read_index(f: File) -> format.Index:
    """Collective over ``f.comm``: rank 0 reads and checks the index; every rank gets it
    (an object store: one rank's few ranged GETs)."""
    comm = f.comm
    step = Attempt()
    index: Any = None
    with step:
        if comm.Get_rank() == 0:
            index = _parse(_backend_read(f), f.backend.size(), str(f.target))
    # (only rank 0 reads: its outcome broadcast is the agreement)
    got: format.Index = bcast_outcome(comm, index, step.error, what="checkpoint.load: index")
    return got


def _own_index(f: File) -> tuple[format.Index, int]:
    """Local: the index as this rank reads it from a local file (a few reads from the page
    cache, parsed on every rank at once instead of broadcast from one), and its checksum;
    the ranks' errors and checksums are agreed by :func:`_gather_spans`."""
    return _parse_crc(_backend_read(f), f.backend.size(), str(f.target))


def _wanted(
    index: format.Index, spec: Mapping[str, Any]
) -> list[tuple[str, ArrayLayout, np.ndarray[Any, Any] | None]]:
    """Each requested name, sorted, with this rank's piece (offset 0) checked against the
    index, and the caller's array to read it into (None: a new one)."""
    if not isinstance(spec, Mapping):
        raise LayoutError(f"spec must map names to layouts or None, not {type(spec).__name__}")
    out = []
    for name in sorted(spec):
        entry = index.arrays.get(name)
        if entry is None:
            raise LayoutError(f"array {name!r} is not in the checkpoint")
        shape, dtype, order = tuple(entry["shape"]), index.dtype(name), entry["order"]
        lay, into = spec[name], None
        if isinstance(lay, tuple) and len(lay) == 2:  # (out, layout or None): in place
            into, lay = _into(name, lay[0]), lay[1]
        if shape == ():  # a 0-d value is stored as one element
            if lay is not None:
                raise LayoutError(f"array {name!r} is 0-d: load it with None, not a layout")
            shape = (1,)
        if lay is None:
            lay = whole(shape, dtype, order)
        lay = array_layout(lay, f"array {name!r}: a spec")
        if (lay.global_shape, lay.dtype, lay.order) != (shape, dtype, order):
            raise LayoutError(
                f"array {name!r}: stored shape {shape} dtype {dtype.str} order {order}; layout "
                f"has shape {lay.global_shape} dtype {lay.dtype.str} order {lay.order}"
            )
        if into is not None:
            if entry["shape"] == [] and into.shape == ():
                into = into.reshape(1)  # (a view: the stored form of a 0-d value)
            try:
                lay.allocate(into)
            except LayoutError as exc:
                raise LayoutError(f"array {name!r}: {exc}") from None
        out.append((name, lay, into))
    return out


def _into(name: str, obj: Any) -> np.ndarray[Any, Any]:
    """A numpy view of the caller's array ``obj`` to read array ``name`` into."""
    try:
        arr = as_array(obj)
    except LayoutError as exc:
        raise LayoutError(f"array {name!r}: {exc}") from None
    if not arr.flags.writeable:
        raise LayoutError(f"array {name!r}: the array to load into is read-only")
    return arr


def _gather_spans(
    comm: MPI.Comm, mine: Any, names: list[str], crc: int, error: BaseException | None
) -> I64:
    """Collective: every rank's spans of its pieces ``(rank, array, (lo, hi, contiguous,
    bytes))`` of the arrays ``names`` (sorted); and first, in one fixed-size gather, the
    agreement on what came before: a rank's ``error`` raised on every rank, the index
    every rank read itself (``crc``, its checksum) the same on all, and the same
    names asked for on every rank (else array k would be another array on another rank,
    and the spans' gather would not even have one size).  Both waited for sleeping: the
    ranks come from their own reads of the index, some later than others."""
    head = np.array([error is not None or mine is None, crc, len(names), digest(names)], np.int64)
    heads = np.empty((comm.Get_size(), 4), np.int64)
    sleep_until_done(comm.Iallgather([head, MPI.INT64_T], [heads, MPI.INT64_T]))
    if heads[:, 0].any():
        raise_agreed(comm, error, what="checkpoint.load")
    if len(set(heads[:, 1].tolist())) > 1:
        raise ChecksumError("checkpoint.load: the ranks read different indexes (replaced?)")
    if (heads[:, 2:] != heads[0, 2:]).any():
        odd = int(np.flatnonzero((heads[:, 2:] != heads[0, 2:]).any(axis=1))[0])
        n, n0 = int(heads[odd, 2]), int(heads[0, 2])
        what = f"{n} arrays, rank 0 for {n0}" if n != n0 else f"other arrays than rank 0 ({n})"
        raise MismatchError(
            f"checkpoint.load: rank {odd}'s spec asks for {what}: every rank's spec must "
            "name the same arrays"
        )
    every = np.empty((comm.Get_size(), len(names), 4), np.int64)
    sleep_until_done(comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T]))
    return every


class _Checks:
    """What this rank checksums at a load, planned before any byte is read: the extents
    its pieces hold whole (``own``: rows of the plan) and its parts of the extents held
    by several ranks (``mine``: rows of ``plan.part``), as (array, lo, hi) within the
    array; their checksums fill ``sums`` (``own``'s first) as the bytes pass by."""

    def __init__(self, plan: extents.Plan, rank: int) -> None:
        self.plan = plan
        self.own = np.flatnonzero(plan.owner == rank)
        pe, plo, phi, prk = plan.part
        self.mine = np.flatnonzero(prk == rank)
        self.aid = np.concatenate([plan.aid[self.own], plan.aid[pe[self.mine]]])
        self.lo = np.concatenate([plan.starts[self.own], plo[self.mine]])
        self.hi = np.concatenate([plan.ends[self.own], phi[self.mine]])
        self.sums = np.zeros(len(self.aid), np.uint32)
        self.done = np.zeros(len(self.aid), bool)

    def from_memory(self, views: list[Any], arrays: list[int]) -> None:
        """The checksums of the ranges in ``arrays`` not summed yet, from this rank's
        pieces (``views[k]``: array ``k``'s piece as bytes, and its first byte)."""
        import crc32c

        todo = np.flatnonzero(np.isin(self.aid, arrays) & ~self.done)
        rows = zip(self.aid[todo].tolist(), self.lo[todo].tolist(), self.hi[todo].tolist(),
                   strict=True)  # fmt: skip
        for j, (k, a, b) in zip(todo.tolist(), rows, strict=True):
            buf, lo = views[k]
            self.sums[j] = crc32c.crc32c(buf[a - lo : b - lo])
        self.done[todo] = True


def _segments(plo: I64, phi: I64, clo: I64, chi: I64, chunk: int) -> tuple[I64, I64, I64, I64]:
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


def _read_checked(
    f: File, checks: _Checks, views: list[Any], arrays: I64, offs: I64, mine: I64
) -> None:
    """Local: this rank's pieces of ``arrays`` (each one range of its array: ``mine``'s
    (lo, hi) rows, relative to the array at ``offs``), each straight into its array by
    the backend, the checked ranges in them summed as they are read."""
    import crc32c

    sel = arrays[mine[arrays, 1] > mine[arrays, 0]]
    plo, phi = offs[sel] + mine[sel, 0], offs[sel] + mine[sel, 1]
    order = np.argsort(plo, kind="stable")
    sel, plo, phi = sel[order], plo[order], phi[order]
    todo = np.flatnonzero(np.isin(checks.aid, sel) & ~checks.done)
    base = offs[checks.aid[todo]]
    clo, chi = base + checks.lo[todo], base + checks.hi[todo]
    by = np.argsort(clo, kind="stable")
    todo, clo, chi = todo[by], clo[by], chi[by]
    s, e, p, c = _segments(plo, phi, clo, chi, CHUNK)
    slot = np.where(c >= 0, todo[np.maximum(c, 0)] if len(todo) else -1, -1)
    at = s - plo[p]  # (offset within the piece)
    bufs = [views[k][0] for k in sel.tolist()]
    sums = checks.sums.tolist()
    be = f.backend
    with storage_errors(be):
        rows = zip(s.tolist(), (e - s).tolist(), p.tolist(), at.tolist(), slot.tolist(),
                   strict=True)  # fmt: skip
        for off, n, k, a, j in rows:
            buf = bufs[k][a : a + n]
            be.read_at(off, buf)
            if j >= 0:
                sums[j] = crc32c.crc32c(buf, sums[j])
    checks.sums[:] = sums
    checks.done[todo] = True


def _verify(
    comm: MPI.Comm,
    f: File,
    checks: _Checks,
    crcs: npt.NDArray[np.uint32],
    offs: I64,
    narrays: int,
    error: BaseException | None,
) -> npt.NDArray[np.bool_]:
    """Collective: every checksum compared; which arrays differ (the same on every rank).
    Raises ``error`` (this rank's, of its reads) agreed on every rank first.

    The extents a rank's piece held whole were summed by it, those several ranks held
    are combined from their parts' sums; any other extent one rank reads once more.
    All of it agreed in one reduction, waited for sleeping (a rank done early leaves
    the core to those still reading)."""
    import crc32c

    x = checks.plan
    bad = np.zeros(narrays, bool)
    n_own = len(checks.own)
    bad[x.aid[checks.own[checks.sums[:n_own] != crcs[checks.own]]]] = True
    rank = comm.Get_rank()
    if bool((x.reader >= 0).any()):  # (the same on every rank: every rank plans alike)
        rd = np.flatnonzero(x.reader == rank)
        lens = x.ends[rd] - x.starts[rd]
        got = f.read_all(Segments(offs[x.aid[rd]] + x.starts[rd], lens)).data
        cuts = np.concatenate([[0], np.cumsum(lens)]).tolist()
        for i, j in enumerate(rd.tolist()):
            if crc32c.crc32c(got[cuts[i] : cuts[i + 1]]) != crcs[j]:
                bad[x.aid[j]] = True
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
        _check_joined(x, vec[: len(pe)], crcs, bad)
    return bad


def _extents(
    index: format.Index, wanted: list[tuple[str, ArrayLayout]], every: I64
) -> tuple[extents.Plan, npt.NDArray[np.uint32], I64]:
    """The stored extents of the arrays read (every array's at once), with their
    checksums and the arrays' offsets."""
    parts = [index.extents(name) for name, _ in wanted]
    z = np.zeros(0, np.int64)
    starts = np.concatenate([z, *[p[0] for p in parts]])
    crcs = np.concatenate([np.zeros(0, np.uint32), *[p[1] for p in parts]])
    aid = np.repeat(np.arange(len(wanted)), [len(p[0]) for p in parts]).astype(np.int64)
    # (the index's sizes: each array's shape and dtype were checked against it)
    nbytes = np.array([int(index.arrays[name]["nbytes"]) for name, _ in wanted], np.int64)
    offs = np.array([int(index.arrays[name]["offset"]) for name, _ in wanted], np.int64)
    return extents.assign(starts, aid, nbytes, offs, every, join=True), crcs, offs


def _check_joined(
    x: extents.Plan,
    got: npt.NDArray[np.uint32],
    crcs: npt.NDArray[np.uint32],
    bad: npt.NDArray[np.bool_],
) -> None:
    """The extents held by several ranks' pieces, from their parts' checksums (``got``,
    every rank's, combined on every rank alike); marks ``bad``."""
    pe, plo, phi, _ = x.part
    first = np.searchsorted(pe, x.joined)
    count = np.diff(np.append(first, len(pe)))
    crc = got[first]
    for j in range(1, int(count.max(initial=1))):
        more = count > j
        at = first[more] + j
        crc[more] = crc_combine(crc[more], got[at], phi[at] - plo[at])
    bad[x.aid[x.joined[crc != crcs[x.joined]]]] = True


def _allocate(lays: list[ArrayLayout], into: list[Any]) -> list[Any]:
    """This rank's arrays: the caller's where given, else each its own allocation.
    (One allocation for them all, in huge pages, faulted in faster on a quiet machine,
    but after a save's writes had filled the page cache its huge pages came slower and
    less steadily, and any array kept would have kept them all.  Reading into arrays the
    job already has costs no page faults at all.)"""
    return [
        np.empty(lay.local_shape, lay.dtype, order="F" if lay.order == "F" else "C")
        if arr is None else arr
        for lay, arr in zip(lays, into, strict=True)
    ]  # fmt: skip


def _read(
    f: File,
    wanted: list[tuple[str, ArrayLayout]],
    arrays: list[Any],
    offs: I64,
    every: I64,
    checks: _Checks,
    direct: bool,
) -> BaseException | None:
    """Collective: the arrays whose every piece is one range, read by each rank itself
    into its array (no flattening, no exchange: ranks reading the same bytes, a whole
    array on every rank, read them each); then the others through their layouts,
    two-phase; every range ``checks`` holds summed.  Returns this rank's error of its
    own reads, not agreed yet (:func:`_verify` agrees it with the checksums).

    ``direct`` (a local file): each piece by the backend's own reads, checksummed as
    it is read; else (an object store) in one call of them all, checksummed after."""
    rank = f.comm.Get_rank()
    flat = np.atleast_1d(every[:, :, 2].all(axis=0)).astype(bool)
    views = [(lay.as_bytes(arr), int(every[rank, k, 0]))
             for k, ((_, lay), arr) in enumerate(zip(wanted, arrays, strict=True))]  # fmt: skip
    step = Attempt()
    ids = np.flatnonzero(flat)
    if direct and len(ids):
        with step:
            _read_checked(f, checks, views, ids, offs, every[rank])
    elif len(ids):  # (flat is the same on every rank: it comes from every rank's spans)
        items = [item(arrays[k], wanted[k][1], int(offs[k]), True) for k in ids.tolist()]
        f.read_all_many([one for _, one in items], out=[src for src, _ in items], _disjoint=True)
    rest = np.flatnonzero(~flat)
    if len(rest):
        f.read_all_many([at(wanted[k][1], int(offs[k])) for k in rest.tolist()],
                        out=[arrays[k] for k in rest.tolist()])  # fmt: skip
    with step:
        checks.from_memory(views, list(range(len(wanted))))
    return step.error


def _unmapped(hints: Any) -> Any:
    """The user's hints, reads of a local file by ``preadv`` where ``mapped_reads`` is
    left ``automatic``: a load reads few large runs (a piece of an array each) into
    one allocation, which ``preadv`` copies once, where the copy out of a map gathers
    and scatters them (``enable`` still maps)."""
    from ..hints import Hints

    given = Hints.coerce(hints)
    return given.replace(mapped_reads="disable") if given.mapped_reads == "automatic" else given


def load(
    target: Any,
    spec: Mapping[str, Any],
    *,
    comm: MPI.Intracomm | None = None,
    hints: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Collective over `comm`: read the arrays ``spec`` names, each as this rank's piece.

    ``spec`` maps names to an array layout (any decomposition, any number of ranks) or
    None (the whole array on every rank), or to ``(out, layout or None)``: the piece is
    read into ``out`` in place (a numpy array, or any CPU array with ``__dlpack__`` or
    ``__array_interface__``, of the piece's shape and dtype, contiguous in the layout's
    order, writeable), which the result holds for that name.  Every extent read is
    verified against its checksum; a difference raises :class:`~collio.ChecksumError`
    on every rank, naming the arrays (``names``), after the others were read (an ``out``
    of a named array then holds the bytes read, not the saved ones).  An unknown name, a
    layout whose global shape, dtype or order differs from the stored array, or an
    ``out`` that does not fit raises the same :class:`~collio.LayoutError` on every rank
    before any data is read.
    """
    base = MPI.COMM_WORLD if comm is None else comm
    given_hints = _unmapped(hints)
    with _open(target, "r", comm=base, hints=given_hints, **options) as f:
        # a local file: each rank reads the index and its own pieces itself, checksummed
        # on the way (an object store's requests go from one rank, and in one call of
        # many ranged GETs at once); mapped_reads=enable maps, in a call
        direct = not f.backend.remote and given_hints.mapped_reads != "enable"
        index: Any = None if direct else _read_index(f)
        crc = 0
        step = Attempt()
        wanted: list[tuple[str, ArrayLayout]] = []
        into: list[Any] = []
        given: list[Any] = []
        mine: Any = None
        got: list[Any] = []
        with step:  # (a layout's runs may be built here first: a rank's error is agreed)
            if direct:
                index, crc = _own_index(f)
            found = _wanted(index, spec)
            wanted = [(name, lay) for name, lay, _ in found]
            into = [arr for _, _, arr in found]
            given = [spec[name][0] if arr is not None else None for name, _, arr in found]
            mine = spans([lay for _, lay in wanted])
            # (allocated before the gather: a rank out of memory is agreed there, not left
            # raising alone before the reads' collectives)
            got = _allocate([lay for _, lay in wanted], into)
        every = _gather_spans(f.comm, mine, [n for n, _ in wanted], crc, step.error)
        x, crcs, offs = _extents(index, wanted, every)  # (planned before any byte is read)
        checks = _Checks(x, f.comm.Get_rank())
        error = _read(f, wanted, got, offs, every, checks, direct)
        flags = _verify(f.comm, f, checks, crcs, offs, len(wanted), error)
        bad = [wanted[k][0] for k in np.flatnonzero(flags).tolist()]
    if bad:
        err = ChecksumError(
            f"{len(bad)} arrays differ from their checksums: {', '.join(map(repr, bad))}"
        )
        err.names = tuple(bad)
        raise err
    return {
        name: obj
        if obj is not None
        else arr.reshape(())
        if index.arrays[name]["shape"] == []
        else arr
        for (name, _), arr, obj in zip(wanted, got, given, strict=True)
    }
